"""Errors of the SMS layer: one base class, :class:`SmsError`."""

from __future__ import annotations

from mdeci.errors import MdeciError


class SmsError(MdeciError):
    """Base class of every error raised by ``mdeci.sms``."""


class PduError(SmsError):
    """An SMS is not an mdeci segment or ack (no or bad UDH, wrong sizes).

    The link catches it at its one inbound boundary, counts the SMS and drops it.
    """


class FrameTooLarge(SmsError):
    """A frame needs more than 255 segments."""


class NoFreeReference(SmsError):
    """Every concatenation reference to this peer belongs to a buffer still in flight."""


class GatewayError(SmsError):
    """A gateway refused or failed to submit an SMS; the message says why."""


class AuthError(SmsError):
    """An SMS buffer or ack SMS failed authentication (forged, tampered, or too short)."""


class ReplayedFrame(SmsError):
    """An authentic SMS buffer or ack carries a counter the receiver already accepted."""


class UnknownPeer(SmsError):
    """No SMS keys for a number: it is on no user's record."""


class CounterFileError(SmsError):
    """The SMS counter file cannot be read (malformed) or written."""
