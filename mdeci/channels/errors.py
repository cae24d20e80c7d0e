"""Errors of the channel selector: one base class, :class:`ChannelError`."""

from __future__ import annotations

from mdeci.errors import MdeciError


class ChannelError(MdeciError):
    """Base class of every error raised by ``mdeci.channels``."""


class PolicyError(ChannelError, ValueError):
    """A channel, weight, limit or calendar value is invalid; the message says which."""


class UnknownQueueClass(PolicyError):
    """The queue class of a message has no policy."""
