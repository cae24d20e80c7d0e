"""The client side of the agent's JSON-lines protocol (docs/agent.md "Local API").

One request object per line out, one answer object per line in. This module turns
answers into values or typed errors and records into :class:`Notification`; it does no I/O.
"""

from __future__ import annotations

import base64
import binascii
import enum
import json
from dataclasses import dataclass, field
from typing import Any

from mdeci.client.errors import AgentUnavailable, BadRequest, NotConnected, ProtocolError, Refused


def encode(request: dict[str, Any]) -> bytes:
    """One request line."""
    return (json.dumps(request, separators=(",", ":")) + "\n").encode()


def decode(line: bytes) -> dict[str, Any]:
    """One answer line as an object. Raises :class:`AgentUnavailable` for end of stream,
    :class:`ProtocolError` for anything but a JSON object."""
    if not line:
        raise AgentUnavailable("the agent closed the connection")
    try:
        obj = json.loads(line)
    except ValueError:
        raise ProtocolError(f"the agent answered a line that is not JSON: {line[:60]!r}") from None
    if not isinstance(obj, dict):
        raise ProtocolError("the agent answered something that is not a JSON object")
    return obj


def check(answer: dict[str, Any]) -> dict[str, Any]:
    """``answer`` if ``ok``; otherwise the typed error its ``kind`` names."""
    if answer.get("ok") is True:
        return answer
    message = str(answer.get("error", "the agent refused the request"))
    kind = answer.get("kind")
    code = answer.get("code")
    if kind == "refused" or (kind is None and isinstance(code, int)):
        raise Refused(message, code if isinstance(code, int) else None)
    if kind == "not_connected":
        raise NotConnected(message)
    raise BadRequest(message)


class PublishState(enum.Enum):
    """Where a publish stands when :meth:`Client.publish` returns."""

    ACCEPTED = "published"  # the broker answered pub-ok: it is durable there
    SENT = "sent"  # on its way, no answer within pub_timeout: kept, sent again if needed
    BUFFERED = "buffered"  # the agent is disconnected: kept, sent when it reconnects
    HELD = "held"  # kept for a cheaper network, at most its class's delay (docs/channels.md)


@dataclass(frozen=True, slots=True)
class PublishResult:
    """The answer to a publish (a refusal raises :class:`Refused` instead)."""

    msg_id: str
    state: PublishState
    matched: int | None = None  # subscriptions it matched (ACCEPTED only)

    @property
    def accepted(self) -> bool:
        return self.state is PublishState.ACCEPTED


def publish_result(answer: dict[str, Any]) -> PublishResult:
    try:
        state = PublishState(answer.get("state"))
    except ValueError:
        raise ProtocolError(f"unknown publish state {answer.get('state')!r}") from None
    matched = answer.get("matched")
    return PublishResult(
        str(answer["msg_id"]), state, matched if isinstance(matched, int) else None
    )


@dataclass(frozen=True, slots=True)
class Subscription:
    """A subscription as the agent lists it. ``lease``: the agent renews it until it is
    cancelled (else it ends at its TTL); ``expires_at``: the broker's current expiry;
    ``state``: ``live``, ``pending`` (being subscribed again) or ``ended``, ``reason``
    saying why for the last two."""

    sub_id: str
    subject: str
    filter: str
    expires_at: float | None
    lease: bool = True
    state: str = "live"
    reason: str = ""


def subscription(item: dict[str, Any]) -> Subscription:
    expires = item.get("expires_at")
    return Subscription(
        str(item["sub_id"]),
        str(item.get("subject", "")),
        str(item.get("filter") or ""),
        float(expires) if isinstance(expires, int | float) else None,
        bool(item.get("lease", True)),
        str(item.get("state") or "live"),
        str(item.get("reason") or ""),
    )


@dataclass(frozen=True, slots=True)
class SubscriptionEvent:
    """A subscription ended (``ended``), or a new one replaced it (``live``, with the old
    id in ``replaces``: its notifications now carry ``sub_id``); ``reason`` says why."""

    sub_id: str
    state: str
    reason: str
    subject: str
    filter: str
    lease: bool
    replaces: str | None = None

    @property
    def ended(self) -> bool:
        return self.state == "ended"


def subscription_event(event: dict[str, Any]) -> SubscriptionEvent:
    """An ``{"event": {"subscription": {...}}}`` line's object. Raises
    :class:`ProtocolError`."""
    try:
        replaces = event.get("replaces")
        return SubscriptionEvent(
            sub_id=str(event["sub_id"]),
            state=str(event["state"]),
            reason=str(event.get("reason", "")),
            subject=str(event.get("subject", "")),
            filter=str(event.get("filter") or ""),
            lease=bool(event.get("lease", True)),
            replaces=None if replaces is None else str(replaces),
        )
    except (KeyError, TypeError, AttributeError) as exc:
        raise ProtocolError(f"malformed subscription event: {exc}") from None


@dataclass(frozen=True, slots=True)
class Notification:
    """One notification as the agent handed it over (``nseq`` grows by one per user)."""

    nseq: int
    sub_id: str
    subject: str
    msg_id: str
    published_at: float
    attrs: dict[str, Any] = field(default_factory=dict)
    payload: bytes = b""
    missed: int = 0  # notifications the broker dropped (queue overflow) just before this one

    @property
    def text(self) -> str:
        """The payload as UTF-8 (undecodable bytes replaced)."""
        return self.payload.decode("utf-8", errors="replace")


def notification(record: dict[str, Any]) -> Notification:
    """A ``{"notify": {...}}`` record. Raises :class:`ProtocolError`."""
    try:
        payload = base64.b64decode(str(record.get("payload") or ""), validate=True)
        attrs = record.get("attrs") or {}
        return Notification(
            nseq=int(record["nseq"]),
            sub_id=str(record.get("sub_id", "")),
            subject=str(record.get("subject", "")),
            msg_id=str(record.get("msg_id", "")),
            published_at=float(record.get("published_at") or 0.0),
            attrs=dict(attrs) if isinstance(attrs, dict) else {},
            payload=payload,
            missed=int(record.get("missed") or 0),
        )
    except (KeyError, TypeError, ValueError, binascii.Error) as exc:
        raise ProtocolError(f"malformed notification: {exc}") from None
