"""What the agent core says: commands to the glue, and events to its sink.

:class:`~mdeci.agent.core.AgentCore` queues :data:`Command` values (frames to send over
RUDP, the RUDP socket's moves, one SIP command at a time) for the glue to carry out, and
hands every :data:`CoreEvent` to the sink at once. The glue answers a SIP command with a
:class:`SipOutcome`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from mdeci.agent.errors import AgentError
from mdeci.agent.machine import State, Status, Trigger
from mdeci.churnlog import Event
from mdeci.frames import Frame, LimitReached

Address = tuple[str, int]

# ------------------------------------------------------------------ commands out


@dataclass(frozen=True, slots=True)
class SendFrame:
    """Send ``data`` to the broker over RUDP."""

    data: bytes


@dataclass(frozen=True, slots=True)
class AttachMedia:
    """Point the data channel's peer keyed by ``key`` at ``addr`` (a new key: a new peer).
    ``fresh``: a new peer even for the same key (a new association with a restarted
    broker that restored this key). ``transport``: ``"rudp"`` or ``"quic"`` (then
    ``fingerprint`` is the broker certificate's, from the SDP answer)."""

    key: bytes
    addr: Address
    fresh: bool = False
    transport: str = "rudp"
    fingerprint: bytes | None = None


@dataclass(frozen=True, slots=True)
class Rebind:
    """Bind the RUDP socket to ``host`` (same port if free); answer with media_bound."""

    host: str


@dataclass(frozen=True, slots=True)
class Register:
    """REGISTER at the registrar for ``expires`` seconds (0: remove our contact)."""

    expires: int


@dataclass(frozen=True, slots=True)
class Invite:
    """INVITE the broker with ``offer`` (a new dialog)."""

    offer: bytes


@dataclass(frozen=True, slots=True)
class Reinvite:
    """Re-INVITE the current dialog with ``offer``."""

    offer: bytes


@dataclass(frozen=True, slots=True)
class MoveSip:
    """Move the SIP UA to ``host`` (new sockets, REGISTER the new contact)."""

    host: str


@dataclass(frozen=True, slots=True)
class Bye:
    """End the current dialog."""


SipCommand = Register | Invite | Reinvite | MoveSip | Bye
Command = SendFrame | AttachMedia | Rebind | SipCommand


@dataclass(frozen=True, slots=True, kw_only=True)
class SipOutcome:
    """What the glue reports for a SIP command: ``status`` 2xx or the failure.

    ``status`` None: no answer at all (timeout, socket error); ``body``: the answer's SDP;
    ``call_id``: the dialog's; ``local_addr``: the UA's address after the command;
    ``contacts``: the other contacts the registrar listed for our AOR; ``offer``: our
    offer as it went on the wire when the stack rewrote it (pjsua2 adds an audio line),
    empty when it went as given (the key agreement binds the bytes sent).
    """

    status: int | None
    reason: str = ""
    body: bytes = b""
    offer: bytes = b""
    call_id: str | None = None
    local_addr: Address | None = None
    contacts: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300


# ------------------------------------------------------------------ events out


@dataclass(frozen=True, slots=True)
class ChurnRecord:
    """A churn log event (docs/protocol.md §8) with its fields."""

    event: Event
    fields: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Delivered:
    """A notification handed to the applications (already durable)."""

    record: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class RequestDone:
    """The broker answered request ``req`` (``frame``; an ``error`` frame too)."""

    req: int
    frame: Frame


@dataclass(frozen=True, slots=True)
class RequestFailed:
    """Request ``req`` will get no answer (timeout, connection lost, closed)."""

    req: int
    error: AgentError


@dataclass(frozen=True, slots=True)
class Alert:
    """A failure a user must act on (logged at once, shown by ``status``).

    ``kind``: ``auth`` (401/403), ``unreachable``, ``refused``, ``key``, ``duplicate_aor``,
    ``state``, ``store_replaced``.
    """

    kind: str
    message: str


@dataclass(frozen=True, slots=True)
class StoreReplaced:
    """The broker's store is a new one: gate restarted, subscriptions sent again."""

    old: str | None
    new: str
    restored: int


@dataclass(frozen=True, slots=True, kw_only=True)
class SubscriptionChanged:
    """A subscription ended (``state`` ``ended``), or a new one took its place (``live``,
    ``replaces``: the ended one's id); ``reason`` says why (docs/agent.md "Leases")."""

    sub_id: str
    state: str
    reason: str
    subject: str
    filter: str
    expires_at: float
    lease: bool
    replaces: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "sub_id": self.sub_id,
            "state": self.state,
            "reason": self.reason,
            "subject": self.subject,
            "filter": self.filter,
            "expires_at": self.expires_at,
            "lease": self.lease,
        }
        if self.replaces is not None:
            out["replaces"] = self.replaces
        return out


@dataclass(frozen=True, slots=True)
class LeaseRenewed:
    """The broker renewed lease ``sub_id`` until ``expires_at`` (not on ``tail``)."""

    sub_id: str
    expires_at: float


@dataclass(frozen=True, slots=True)
class StateChanged:
    """The state or the status changed; ``trigger``: the transition taken (None: the
    status alone changed)."""

    state: State
    status: Status
    trigger: Trigger | None = None


@dataclass(frozen=True, slots=True)
class LimitNotice:
    """The broker told us of a usage limit (a ``limit`` frame); kept in
    :attr:`AgentCore.limits`."""

    frame: LimitReached


CoreEvent = (
    ChurnRecord
    | Delivered
    | RequestDone
    | RequestFailed
    | Alert
    | StoreReplaced
    | SubscriptionChanged
    | LeaseRenewed
    | StateChanged
    | LimitNotice
)
Sink = Callable[[CoreEvent], None]


def hostport(addr: Address) -> str:
    host, port = addr
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
