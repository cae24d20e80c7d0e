"""Errors of the store; broker logic catches these and never sees SQLAlchemy exceptions."""

from __future__ import annotations

# One StoreError for the whole project: the store's errors derive from the class in
# mdeci.errors, so catching either name catches everything the store raises.
from mdeci.errors import StorageFull, StoreError, StoreUnavailable

__all__ = [
    "DuplicateUser",
    "InvalidArgument",
    "StorageFull",
    "StoreError",
    "StoreUnavailable",
    "UnsupportedAlgorithm",
]


class InvalidArgument(StoreError, ValueError):
    """A caller passed a value the store refuses (negative TTL, unknown policy, ...)."""


class DuplicateUser(StoreError):
    """``add_user`` was called for a URI (or a username in the realm) that already exists."""


class UnsupportedAlgorithm(StoreError):
    """``get_credentials`` was asked for a digest algorithm the store keeps no HA1 for."""
