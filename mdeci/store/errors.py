"""Errors of the store; broker logic catches these and never sees SQLAlchemy exceptions."""

from __future__ import annotations

from mdeci.errors import MdeciError


class StoreError(MdeciError):
    """Base of every error the store raises; a database failure arrives as this class."""


class InvalidArgument(StoreError, ValueError):
    """A caller passed a value the store refuses (negative TTL, unknown policy, ...)."""


class DuplicateUser(StoreError):
    """``add_user`` was called for a URI (or a username in the realm) that already exists."""


class UnsupportedAlgorithm(StoreError):
    """``get_credentials`` was asked for a digest algorithm the store keeps no HA1 for."""
