"""Errors of the RUDP package: one base class, :class:`RudpError`."""

from __future__ import annotations


class RudpError(Exception):
    """Base class of every error raised by ``rudp``."""


class PeerUnreachable(RudpError):
    """A message was not acknowledged after the configured retries (or was queued behind one).

    The layer above takes this as "peer DISCONNECTED" and may requeue ``message``.
    """

    def __init__(self, reason: str, message: bytes | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.message = message


class MessageTooLarge(RudpError):
    """The message exceeds ``RudpConfig.max_message_size``."""


class PacketError(RudpError):
    """A datagram could not be decoded; the core catches it, drops the datagram and counts it."""
