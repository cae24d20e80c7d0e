"""Errors of the mdeci service; one base class so callers can catch the family.

Every error carries a one-line message meant for an operator or a peer; the command line
prints it as ``mdeci <command>: error: <message>`` and the broker copies it into an
``error`` frame.
"""

from __future__ import annotations


class MdeciError(Exception):
    """Base of every error the mdeci package raises on purpose."""


class ConfigError(MdeciError):
    """A configuration file or value is invalid; the message says which key and why."""


class FrameError(MdeciError):
    """An application frame is malformed, out of range or too large.

    ``code`` is the status to put in the ``error`` frame answering it (400 malformed,
    413 too large); ``req`` is the request id of the offending frame when it could be read,
    so the answer can be matched to the request.
    """

    def __init__(self, message: str, *, code: int = 400, req: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.req = req


class SubjectError(MdeciError):
    """A subject or subscription pattern is not dot-separated words (with ``*``/``#``)."""


class FilterError(MdeciError):
    """A filter does not parse; ``position`` is the 0-based character index of the fault."""

    def __init__(self, position: int, reason: str) -> None:
        super().__init__(f"position {position}: {reason}")
        self.position = position
        self.reason = reason


class ChurnLogError(MdeciError):
    """A churn log record is invalid (unknown event, wrong field type) or cannot be written."""


class StoreError(MdeciError):
    """The database could not be reached, migrated or used.

    The message carries the driver's details, for the operator log only; :attr:`public`
    is what a peer may be told (an ``error`` frame, a SIP reason phrase): the cause, and
    nothing of the driver's exception, the SQL or its parameters.
    """

    public: str = "broker storage unavailable; retry later"


class StoreUnavailable(StoreError):
    """The database server refused or dropped the connection (a restart, a failover, a
    network fault): the same call succeeds once the server is back."""


class StorageFull(StoreError):
    """The database has no space for a write (SQLite ``SQLITE_FULL``, PostgreSQL class 53
    ``insufficient resources``): writes succeed again once space is freed; reads and
    deletes may go on meanwhile."""

    public = "broker storage full; retry later"
