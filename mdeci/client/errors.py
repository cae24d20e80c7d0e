"""Errors of :mod:`mdeci.client`; all are :class:`~mdeci.errors.MdeciError`.

An application catches :class:`ClientError` for the family, or one class for the case it
handles: retry later (:class:`NotConnected`), give up on this request (:class:`Refused`,
:class:`BadRequest`), restart the agent (:class:`AgentUnavailable`).
"""

from __future__ import annotations

from mdeci.errors import MdeciError


class ClientError(MdeciError):
    """Base of the client library's errors."""


class AgentUnavailable(ClientError):
    """The agent's socket cannot be reached, or the agent closed the connection."""


class NotConnected(ClientError):
    """The agent has no session with the broker now; the request was not made (retry)."""


class Refused(ClientError):
    """The broker refused the request; ``code`` is its status (400 bad filter, 403, ...)."""

    def __init__(self, message: str, code: int | None) -> None:
        super().__init__(message)
        self.code = code


class BadRequest(ClientError):
    """The agent could not take the request (a bad subject, attribute or argument)."""


class ProtocolError(ClientError):
    """The agent answered something that is not the JSON-lines protocol."""


class CursorError(ClientError):
    """A cursor file cannot be read or written (the message names it)."""
