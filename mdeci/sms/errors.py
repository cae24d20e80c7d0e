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
