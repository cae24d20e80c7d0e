"""Errors of the broker core; one base class below :class:`mdeci.errors.MdeciError`."""

from __future__ import annotations

from mdeci.errors import MdeciError


class BrokerError(MdeciError):
    """Base of every error the broker core raises on purpose."""


class SessionKeyError(BrokerError):
    """A session key from SDP cannot key a RUDP association (fewer than 16 bytes)."""


class WrongThreadError(BrokerError):
    """The core was called from a thread other than the one it is bound to (a bug in the
    glue: only the database thread may touch it, see :mod:`mdeci.broker.worker`)."""
