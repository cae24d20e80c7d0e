"""What the user agent tells its application: the requests for its handler and the
dialog events (for applications and tools that print what happens)."""

from __future__ import annotations

from dataclasses import dataclass

from sip.dialog import Dialog
from sip.message import Request
from sip.transaction import Address


@dataclass(frozen=True, slots=True)
class IncomingRequest:
    """A request for the application, with the dialog it belongs to (if any)."""

    request: Request
    source: Address
    transport: str
    dialog: Dialog | None


@dataclass(frozen=True, slots=True)
class DialogStarted:
    dialog: Dialog


@dataclass(frozen=True, slots=True)
class DialogConfirmed:
    """The ACK for our 2xx arrived."""

    dialog: Dialog


@dataclass(frozen=True, slots=True)
class DialogRefreshed:
    """A re-INVITE was accepted (either direction): new target and/or SDP."""

    dialog: Dialog
    body: bytes


@dataclass(frozen=True, slots=True)
class DialogEnded:
    dialog: Dialog
    reason: str


DialogEvent = DialogStarted | DialogConfirmed | DialogRefreshed | DialogEnded

__all__ = [
    "DialogConfirmed",
    "DialogEnded",
    "DialogEvent",
    "DialogRefreshed",
    "DialogStarted",
    "IncomingRequest",
]
