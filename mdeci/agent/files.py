"""The interface of the agent's durable state, as :class:`~mdeci.agent.core.AgentCore`
sees it: four Protocols and the records they hold.

The core does no file I/O: it is handed an :class:`AgentFiles` whose members satisfy
these Protocols. :mod:`mdeci.agent.state` implements them on files in ``state_dir``
(``fsync``-ed, replaced atomically); tests may hand in an implementation in memory. Every
write raises :class:`~mdeci.agent.errors.StateError` when it cannot be made durable; the
core then alerts, and takes nothing as recorded.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from mdeci.frames import AttrValue
from mdeci.sms.dedupe import NseqGate


@dataclass(frozen=True, slots=True, kw_only=True)
class OutgoingPub:
    """A publish the broker has not acknowledged yet."""

    msg_id: str
    subject: str
    attrs: Mapping[str, AttrValue] = field(default_factory=dict)
    payload: bytes = b""
    urgent: bool = False
    qclass: str = ""  # its queue class ("": the broker's choice)
    queued_at: float = 0.0  # wall time of the publish: a wait for a network ends from it

    def to_json(self) -> dict[str, Any]:
        return {
            "msg_id": self.msg_id,
            "subject": self.subject,
            "attrs": dict(self.attrs),
            "payload": base64.b64encode(self.payload).decode("ascii"),
            "urgent": self.urgent,
            "qclass": self.qclass,
            "queued_at": self.queued_at,
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> OutgoingPub:
        return cls(
            msg_id=str(obj["msg_id"]),
            subject=str(obj["subject"]),
            attrs=dict(obj.get("attrs", {})),
            payload=base64.b64decode(obj.get("payload", "")),
            urgent=bool(obj.get("urgent", False)),
            qclass=str(obj.get("qclass", "")),
            queued_at=float(obj.get("queued_at", 0.0)),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class KnownSub:
    """A subscription as the agent remembers it (to renew it, and to restore it on a new
    broker store)."""

    sub_id: str
    subject: str
    filter: str
    expires_at: float
    qclass: str = ""  # the queue class asked for; the broker's list omits it
    in_order: bool = False  # its notifications keep their order (the broker's list omits it)
    ttl: int | None = None  # the TTL asked for (None: the broker's default)
    lease: bool = True  # renewed while the application keeps it (False: a fixed lifetime)


class GateFile(Protocol):
    """The exactly-once gate and the broker store it belongs to."""

    gate: NseqGate  # replaced by the core to roll a failed burst back

    @property
    def store_id(self) -> str | None: ...

    @property
    def highest(self) -> int:
        """The highest ``nseq`` handed to the applications."""
        ...

    @property
    def per_burst(self) -> bool:
        """Whether the gate must be saved with every burst of notifications."""
        ...

    def save(self) -> None:
        """Persist the gate (nothing if unchanged)."""

    def restart(self, store_id: str, window: int = 0) -> None:
        """An empty gate for a new broker store, saved."""


class InboxFile(Protocol):
    """The notifications handed to the applications."""

    def extend(self, records: list[dict[str, Any]]) -> None:
        """Record a burst durably (all or none)."""

    def archive(self, suffix: str) -> object:
        """Set the kept notifications aside (a new broker store) and start empty."""


class OutboxFile(Protocol):
    """Publishes waiting for the broker's ``pub-ok``."""

    def add(self, pub: OutgoingPub, *, sync: bool = True) -> None:
        """Record ``pub``: durably, or (``sync`` False) made durable by :meth:`sync`."""

    def sync(self) -> None:
        """Make what :meth:`add` wrote without ``sync`` durable."""

    def done(self, msg_id: str) -> None:
        """The broker acknowledged ``msg_id`` (idempotent)."""

    def pending(self) -> list[OutgoingPub]:
        """Unacknowledged publishes, oldest first."""
        ...


class SubsFile(Protocol):
    """The agent's own record of its subscriptions."""

    @property
    def items(self) -> tuple[KnownSub, ...]: ...

    def replace(self, items: tuple[KnownSub, ...]) -> None:
        """Remember ``items``."""


class AgentFiles(Protocol):
    """The durable state the core works on (opened by the glue, or kept in memory)."""

    @property
    def inbox(self) -> InboxFile: ...

    @property
    def nseq(self) -> GateFile: ...

    @property
    def outbox(self) -> OutboxFile: ...

    @property
    def subs(self) -> SubsFile: ...
