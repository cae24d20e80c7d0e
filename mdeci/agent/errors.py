"""Errors of the agent daemon and its local API; all are :class:`~mdeci.errors.MdeciError`."""

from __future__ import annotations

from mdeci.errors import MdeciError


class AgentError(MdeciError):
    """Base of the agent's errors."""


class StateError(AgentError):
    """A state file in ``state_dir`` cannot be read or written (the message names it)."""


class NotConnected(AgentError):
    """The request needs the broker and the session is DISCONNECTED."""


class BrokerRefused(AgentError):
    """The broker answered a request with an ``error`` frame (``code`` copied from it)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"broker refused ({code}): {message}")
        self.code = code
        self.reason = message


class ApiError(AgentError):
    """The local API could not be reached, or answered with an error."""


class TransitionError(AgentError):
    """The agent core took a step its transition table does not allow (a bug)."""
