"""What the agent tells its users: the ``status`` snapshot and how a publish ended."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mdeci.agent.machine import Status


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentStatus:
    """What ``mdeci status`` shows."""

    aor: str
    node: str
    status: Status
    state: str
    sip_addr: str
    media_addr: str
    broker_media_addr: str | None
    media_transport: str | None  # the data channel the broker's answer accepted
    call_id: str | None
    registered: bool
    highest_nseq: int
    store_id: str | None
    buffered: int
    inbox: int
    listeners: int
    subscriptions: int
    attempts: int
    failed_attempts: int
    alerts: Mapping[str, int]
    last_error: str | None
    sip_stack: str
    sip_transport: str  # how it reaches the registrar and the broker
    sip_received: Mapping[str, int]  # SIP messages received per transport
    sip_contact: str  # the Contact URI registered (``sips:`` over TLS)

    def to_json(self) -> dict[str, Any]:
        return {
            "aor": self.aor,
            "node": self.node,
            "status": str(self.status),
            "state": self.state,
            "sip_addr": self.sip_addr,
            "media_addr": self.media_addr,
            "broker_media_addr": self.broker_media_addr,
            "media_transport": self.media_transport,
            "call_id": self.call_id,
            "registered": self.registered,
            "highest_nseq": self.highest_nseq,
            "store_id": self.store_id,
            "buffered": self.buffered,
            "inbox": self.inbox,
            "listeners": self.listeners,
            "subscriptions": self.subscriptions,
            "attempts": self.attempts,
            "failed_attempts": self.failed_attempts,
            "alerts": dict(self.alerts),
            "last_error": self.last_error,
            "sip_stack": self.sip_stack,
            "sip_transport": self.sip_transport,
            "sip_received": dict(self.sip_received),
            "sip_contact": self.sip_contact,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class PubResult:
    """How a publish ended within the bound: ``published`` (the broker's ``pub-ok``),
    ``sent`` (on its way, no answer yet), ``buffered`` (kept until a connection) or
    ``held`` (kept until a cheaper network or its class's delay, mdeci/agent/device.py)."""

    msg_id: str
    state: str
    matched: int | None = None
