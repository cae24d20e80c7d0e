"""The application frames over RUDP (docs/protocol.md §5) as typed values.

Each op is a frozen, slotted dataclass validated on construction (types and ranges), so a
frame object that exists is a well-formed frame. Their bytes are
:mod:`mdeci.frames.codec`'s; byte layout and codes: ``docs/frames.md``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, ClassVar

from mdeci.channels.calendar import Rule
from mdeci.errors import FrameError, SubjectError
from mdeci.filters import MAX_FILTER_LENGTH
from mdeci.subjects import validate_pattern, validate_subject

AttrValue = str | int | float | bool

MAX_FRAME_BYTES = 1 << 20  # matches RudpConfig.max_message_size's default
MAX_ID_LENGTH = 128  # msg_id, sub_id: opaque text chosen by the sender
MAX_ATTRS = 64
MAX_ATTR_NAME_LENGTH = 64
MAX_ATTR_STRING_LENGTH = 4096
MAX_MESSAGE_LENGTH = 1024  # error text
MAX_DEPTH = 8  # CBOR nesting: subs -> items -> item map -> (nothing deeper today)
UINT63 = 2**63 - 1  # ids and counters fit a signed 64-bit SQL column
INT64_MIN = -(2**63)
ATTR_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

# Error codes for the `error` frame; HTTP/SIP-like so they read naturally.
BAD_REQUEST = 400  # malformed frame, bad subject or filter
FORBIDDEN = 403  # not allowed for this user
NOT_FOUND = 404  # no such subscription
TOO_LARGE = 413  # frame over MAX_FRAME_BYTES
INTERNAL = 500  # the broker failed; the request may be retried
UNAVAILABLE = 503  # overloaded (e.g. queue full under refuse-newest); retry later


# ---------------------------------------------------------------------------------------
# Field checks: each raises FrameError naming the field.
# ---------------------------------------------------------------------------------------


def _name(value: object) -> str:
    return type(value).__name__


def _int(op: str, name: str, value: object, lo: int, hi: int) -> None:
    # bool is an int subclass in Python but not an integer on the wire.
    if not isinstance(value, int) or isinstance(value, bool):
        raise FrameError(f"{op}: {name} must be an integer, not {_name(value)}")
    if not lo <= value <= hi:
        raise FrameError(f"{op}: {name} out of range {lo}..{hi}")


def _text(op: str, name: str, value: object, lo: int, hi: int) -> None:
    if not isinstance(value, str):
        raise FrameError(f"{op}: {name} must be text, not {_name(value)}")
    if not lo <= len(value) <= hi:
        raise FrameError(f"{op}: {name} must be {lo}..{hi} characters long")


def _bool(op: str, name: str, value: object) -> None:
    if not isinstance(value, bool):
        raise FrameError(f"{op}: {name} must be a boolean, not {_name(value)}")


def _bytes(op: str, name: str, value: object) -> None:
    if not isinstance(value, bytes):
        raise FrameError(f"{op}: {name} must be a byte string, not {_name(value)}")


def _time(frame: object, op: str, name: str) -> None:
    value = getattr(frame, name)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise FrameError(f"{op}: {name} must be a number of seconds, not {_name(value)}")
    if not math.isfinite(value) or value < 0:
        raise FrameError(f"{op}: {name} must be a finite time >= 0")
    # One representation (float) so that decode(encode(f)) == f holds field by field.
    object.__setattr__(frame, name, float(value))


def _subject(op: str, name: str, value: object, *, pattern: bool) -> None:
    try:
        validate_pattern(value) if pattern else validate_subject(value)
    except SubjectError as exc:
        raise FrameError(f"{op}: {name}: {exc}") from None


# What a frame without attributes holds (most do): one shared read-only empty map.
_NO_ATTRS: Mapping[str, Any] = MappingProxyType({})


def _attrs(frame: object, op: str, name: str = "attrs") -> None:
    value = getattr(frame, name)
    if not value and type(value) in (dict, MappingProxyType):
        # The common case, without the ABC check and the copy (a Pub's checks
        # cost as much as the broker's handling of it).
        object.__setattr__(frame, name, _NO_ATTRS)
        return
    if not isinstance(value, Mapping):
        raise FrameError(f"{op}: {name} must be a map, not {_name(value)}")
    if len(value) > MAX_ATTRS:
        raise FrameError(f"{op}: more than {MAX_ATTRS} {name}")
    for key, item in value.items():
        if not isinstance(key, str) or not ATTR_NAME.fullmatch(key):
            raise FrameError(f"{op}: attribute name {key!r} is not [A-Za-z_][A-Za-z0-9_]*")
        if len(key) > MAX_ATTR_NAME_LENGTH:
            raise FrameError(f"{op}: attribute name {key[:20]!r}... too long")
        if isinstance(item, bool):
            continue
        if isinstance(item, int):
            if not INT64_MIN <= item <= UINT63:
                raise FrameError(f"{op}: attribute {key!r} out of the 64-bit range")
        elif isinstance(item, float):
            if not math.isfinite(item):
                raise FrameError(f"{op}: attribute {key!r} is not a finite number")
        elif isinstance(item, str):
            if len(item) > MAX_ATTR_STRING_LENGTH:
                raise FrameError(f"{op}: attribute {key!r} longer than {MAX_ATTR_STRING_LENGTH}")
        else:
            raise FrameError(
                f"{op}: attribute {key!r} must be text, integer, float or boolean, "
                f"not {_name(item)}"
            )
    # A private read-only copy: the frame is immutable even if the caller's dict is not.
    object.__setattr__(frame, name, MappingProxyType(dict(value)))


def _req(op: str, value: object) -> None:
    _int(op, "req", value, 0, UINT63)


_QCLASS = re.compile(r"[A-Za-z0-9_-]{0,32}")


def _qclass(op: str, value: object) -> None:
    if value == "" and type(value) is str:
        return  # the default: no pattern to match
    _text(op, "qclass", value, 0, 32)
    if not _QCLASS.fullmatch(str(value)):
        raise FrameError(f"{op}: qclass must be letters, digits, '_' and '-'")


def _id(op: str, name: str, value: object) -> None:
    _text(op, name, value, 1, MAX_ID_LENGTH)


# ---------------------------------------------------------------------------------------
# Frames
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Sub:
    """Agent to broker: subscribe to ``subject`` (a pattern) with an optional filter.

    ``ttl`` is in seconds; ``None`` asks for the broker's default TTL (the broker clamps
    either to its maximum and answers the real expiry in ``sub-ok``).
    """

    op: ClassVar[str] = "sub"
    req: int
    subject: str
    filter: str = ""
    ttl: int | None = None
    qclass: str = ""  # queue class of its notifications; "": the broker's default
    in_order: bool = False  # its notifications never overtake one held for a network

    def __post_init__(self) -> None:
        _req(self.op, self.req)
        _subject(self.op, "subject", self.subject, pattern=True)
        _text(self.op, "filter", self.filter, 0, MAX_FILTER_LENGTH)
        if self.ttl is not None:
            _int(self.op, "ttl", self.ttl, 1, UINT63)
        _qclass(self.op, self.qclass)


@dataclass(frozen=True, slots=True, kw_only=True)
class SubOk:
    """Broker to agent: the subscription of request ``req`` is ``sub_id`` until ``expires_at``.

    ``expires_at`` is UTC epoch seconds (float); ``ttl`` (``sub`` and ``renew`` answers)
    is the lifetime granted, in seconds from the answer, which an agent whose clock is
    not the broker's can time its renewal on.
    """

    op: ClassVar[str] = "sub-ok"
    req: int
    sub_id: str
    expires_at: float
    ttl: float | None = None

    def __post_init__(self) -> None:
        _req(self.op, self.req)
        _id(self.op, "sub_id", self.sub_id)
        _time(self, self.op, "expires_at")
        if self.ttl is not None:
            _time(self, self.op, "ttl")


@dataclass(frozen=True, slots=True, kw_only=True)
class Unsub:
    """Agent to broker: cancel subscription ``sub_id`` (answered by ``sub-ok`` or ``error``)."""

    op: ClassVar[str] = "unsub"
    req: int
    sub_id: str

    def __post_init__(self) -> None:
        _req(self.op, self.req)
        _id(self.op, "sub_id", self.sub_id)


@dataclass(frozen=True, slots=True, kw_only=True)
class Renew:
    """Agent to broker: extend live subscription ``sub_id`` to ``ttl`` seconds from now
    (``None``: the broker's default TTL), keeping its id, subject, filter and class.

    Answered by ``sub-ok`` with the new ``expires_at``, or ``error`` 404 when the
    subscription no longer lives (expired, swept, cancelled, another user's).
    """

    op: ClassVar[str] = "renew"
    req: int
    sub_id: str
    ttl: int | None = None

    def __post_init__(self) -> None:
        _req(self.op, self.req)
        _id(self.op, "sub_id", self.sub_id)
        if self.ttl is not None:
            _int(self.op, "ttl", self.ttl, 1, UINT63)


@dataclass(frozen=True, slots=True, kw_only=True)
class List:
    """Agent to broker: list my subscriptions (answered by ``subs``)."""

    op: ClassVar[str] = "list"
    req: int

    def __post_init__(self) -> None:
        _req(self.op, self.req)


@dataclass(frozen=True, slots=True, kw_only=True)
class SubInfo:
    """One entry of ``subs.items`` (a CBOR map with these four keys)."""

    sub_id: str
    subject: str
    filter: str
    expires_at: float

    def __post_init__(self) -> None:
        _id("subs", "items.sub_id", self.sub_id)
        _subject("subs", "items.subject", self.subject, pattern=True)
        _text("subs", "items.filter", self.filter, 0, MAX_FILTER_LENGTH)
        _time(self, "subs", "expires_at")


@dataclass(frozen=True, slots=True, kw_only=True)
class Subs:
    """Broker to agent: the user's live subscriptions, answering ``list`` request ``req``."""

    op: ClassVar[str] = "subs"
    req: int
    items: tuple[SubInfo, ...] = ()

    def __post_init__(self) -> None:
        _req(self.op, self.req)
        if not isinstance(self.items, tuple | list):
            raise FrameError(f"subs: items must be a list, not {_name(self.items)}")
        for item in self.items:
            if not isinstance(item, SubInfo):
                raise FrameError(f"subs: items must hold SubInfo, not {_name(item)}")
        object.__setattr__(self, "items", tuple(self.items))


@dataclass(frozen=True, slots=True, kw_only=True)
class Pub:
    """Agent to broker: publish; idempotent by ``msg_id`` (a re-send is not a new message)."""

    op: ClassVar[str] = "pub"
    req: int
    msg_id: str
    subject: str
    attrs: Mapping[str, AttrValue] = field(default_factory=dict)
    payload: bytes = b""
    urgent: bool = False
    qclass: str = ""  # queue class; "": the subscription's, else by ``urgent``

    def __post_init__(self) -> None:
        _req(self.op, self.req)
        _id(self.op, "msg_id", self.msg_id)
        _subject(self.op, "subject", self.subject, pattern=False)
        _attrs(self, self.op)
        _bytes(self.op, "payload", self.payload)
        _bool(self.op, "urgent", self.urgent)
        _qclass(self.op, self.qclass)


@dataclass(frozen=True, slots=True, kw_only=True)
class PubOk:
    """Broker to agent: ``msg_id`` was accepted and queued for ``matched`` subscriptions."""

    op: ClassVar[str] = "pub-ok"
    req: int
    msg_id: str
    matched: int

    def __post_init__(self) -> None:
        _req(self.op, self.req)
        _id(self.op, "msg_id", self.msg_id)
        _int(self.op, "matched", self.matched, 0, UINT63)


@dataclass(frozen=True, slots=True, kw_only=True)
class Notify:
    """Broker to agent: notification number ``nseq`` (per user, strictly increasing).

    ``missed`` is how many of this user's notifications the broker discarded by its queue
    overflow policy since the notification queued just before this one (0 normally): the
    agent reports it to the application, and knows that a gap in ``nseq`` just before
    this one is a drop, not a loss. ``published_at`` is UTC epoch seconds.
    """

    op: ClassVar[str] = "notify"
    nseq: int
    sub_id: str
    subject: str
    msg_id: str
    published_at: float
    attrs: Mapping[str, AttrValue] = field(default_factory=dict)
    payload: bytes = b""
    missed: int = 0

    def __post_init__(self) -> None:
        _int(self.op, "nseq", self.nseq, 1, UINT63)
        _id(self.op, "sub_id", self.sub_id)
        _subject(self.op, "subject", self.subject, pattern=False)
        _id(self.op, "msg_id", self.msg_id)
        _time(self, self.op, "published_at")
        _attrs(self, self.op)
        _bytes(self.op, "payload", self.payload)
        _int(self.op, "missed", self.missed, 0, UINT63)


@dataclass(frozen=True, slots=True, kw_only=True)
class Ack:
    """Agent to broker: the application has every notification up to ``nseq == upto``."""

    op: ClassVar[str] = "ack"
    upto: int

    def __post_init__(self) -> None:
        _int(self.op, "upto", self.upto, 0, UINT63)


@dataclass(frozen=True, slots=True, kw_only=True)
class Error:
    """Either way: request ``req`` failed with ``code`` (see the module constants).

    ``req`` is ``None`` when the failed frame carried no readable request id.
    """

    op: ClassVar[str] = "error"
    code: int
    message: str
    req: int | None = None

    def __post_init__(self) -> None:
        if self.req is not None:
            _req(self.op, self.req)
        _int(self.op, "code", self.code, 100, 699)
        _text(self.op, "message", self.message, 0, MAX_MESSAGE_LENGTH)


@dataclass(frozen=True, slots=True, kw_only=True)
class LimitReached:
    """Broker to agent: a usage limit stops ``channel`` for this user.

    ``limit`` describes it (period, scope, bounds), ``qclass`` is the class of the
    notification it stopped, ``until`` (UTC epoch seconds) when its period ends. The
    notifications it stopped stay queued for another channel. Sent once per limit and
    period, over IP (at once, or when IP comes back).
    """

    op: ClassVar[str] = "limit"
    channel: str
    limit: str
    qclass: str
    until: float

    def __post_init__(self) -> None:
        _text(self.op, "channel", self.channel, 1, MAX_ID_LENGTH)
        _text(self.op, "limit", self.limit, 1, MAX_MESSAGE_LENGTH)
        _text(self.op, "qclass", self.qclass, 1, MAX_ID_LENGTH)
        _time(self, self.op, "until")


#: Most rules a ``calendar`` frame may carry.
MAX_CALENDAR_RULES = 64


@dataclass(frozen=True, slots=True, kw_only=True)
class CalendarRule:
    """One entry of ``calendar.rules``: ``channel`` is available with probability ``p`` on
    the ``weekdays`` (bit 0 Monday .. bit 6 Sunday) from ``start_hour`` (inclusive) to
    ``end_hour`` (exclusive), device local time; or, a dated rule, from ``start_at`` to
    ``end_at`` (Unix seconds, both or neither) only. Later rules override earlier ones,
    dated ones the weekly ones."""

    channel: str
    p: float
    weekdays: int = 0x7F
    start_hour: int = 0
    end_hour: int = 24
    start_at: float | None = None
    end_at: float | None = None

    def __post_init__(self) -> None:
        _text("calendar", "rules.channel", self.channel, 1, 64)
        if isinstance(self.p, bool) or not isinstance(self.p, int | float):
            raise FrameError(f"calendar: rules.p must be a number, not {_name(self.p)}")
        if not 0.0 <= self.p <= 1.0:  # NaN fails too
            raise FrameError("calendar: rules.p must be within 0..1")
        object.__setattr__(self, "p", float(self.p))
        _int("calendar", "rules.weekdays", self.weekdays, 1, 0x7F)
        _int("calendar", "rules.start_hour", self.start_hour, 0, 24)
        _int("calendar", "rules.end_hour", self.end_hour, self.start_hour, 24)
        if self.start_at is None and self.end_at is None:
            return
        if self.start_at is None or self.end_at is None:
            raise FrameError("calendar: a dated rule needs both rules.start_at and rules.end_at")
        _time(self, "calendar", "start_at")
        _time(self, "calendar", "end_at")
        if not self.start_at < self.end_at:
            raise FrameError("calendar: rules.end_at must be after rules.start_at")

    def rule(self) -> Rule:
        """This rule as the channel selector reads it."""
        return Rule(
            channel=self.channel,
            p=self.p,
            weekdays=frozenset(d for d in range(7) if self.weekdays >> d & 1),
            start_hour=self.start_hour,
            end_hour=self.end_hour,
            start_at=self.start_at,
            end_at=self.end_at,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Calendar:
    """Agent to broker: the device's weekly calendar of channel availability,
    replacing any earlier one; ``utc_offset_minutes`` east of UTC. Answered by
    ``calendar-ok``. The broker waits for a better channel only as long as this says
    it is likely to come (docs/channels.md "Delay tolerance")."""

    op: ClassVar[str] = "calendar"
    req: int
    rules: tuple[CalendarRule, ...] = ()
    utc_offset_minutes: int = 0

    def __post_init__(self) -> None:
        _req(self.op, self.req)
        if not isinstance(self.rules, tuple | list):
            raise FrameError(f"calendar: rules must be a list, not {_name(self.rules)}")
        if len(self.rules) > MAX_CALENDAR_RULES:
            raise FrameError(f"calendar: at most {MAX_CALENDAR_RULES} rules")
        for rule in self.rules:
            if not isinstance(rule, CalendarRule):
                raise FrameError(f"calendar: rules must hold CalendarRule, not {_name(rule)}")
        object.__setattr__(self, "rules", tuple(self.rules))
        _int(self.op, "utc_offset_minutes", self.utc_offset_minutes, -14 * 60, 14 * 60)


@dataclass(frozen=True, slots=True, kw_only=True)
class CalendarOk:
    """Broker to agent: the calendar of request ``req`` (``rules`` rules) is kept."""

    op: ClassVar[str] = "calendar-ok"
    req: int
    rules: int

    def __post_init__(self) -> None:
        _req(self.op, self.req)
        _int(self.op, "rules", self.rules, 0, MAX_CALENDAR_RULES)


#: Most network kinds a ``device`` frame may report figures for.
MAX_NETWORKS = 16


def _figure(op: str, name: str, value: object, *, most: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise FrameError(f"{op}: {name} must be a number, not {_name(value)}")
    if not 0 < value <= most:  # NaN fails too
        raise FrameError(f"{op}: {name} must be within (0, {most:g}]")


@dataclass(frozen=True, slots=True, kw_only=True)
class NetworkBest:
    """One entry of ``device.best``: the best latency (ms) and coverage (0 < V <= 1) the
    device observed on the access network of kind ``network``."""

    network: str
    latency_ms: float
    coverage: float = 1.0

    def __post_init__(self) -> None:
        _text("device", "best.network", self.network, 1, 64)
        _figure("device", "best.latency_ms", self.latency_ms, most=3.6e6)
        _figure("device", "best.coverage", self.coverage, most=1.0)
        object.__setattr__(self, "latency_ms", float(self.latency_ms))
        object.__setattr__(self, "coverage", float(self.coverage))


@dataclass(frozen=True, slots=True, kw_only=True)
class Device:
    """Agent to broker: the kind of the access network carrying the device's traffic
    now (``network``; ``""``: unknown), its best observed figures per kind, and its
    battery level (0..1; -1: unknown). Sent when a session starts and after each move;
    not answered. The broker decides again for what it holds for a cheaper network
    (docs/channels.md "Networks as channels")."""

    op: ClassVar[str] = "device"
    network: str = ""
    best: tuple[NetworkBest, ...] = ()
    battery: float = -1.0

    def __post_init__(self) -> None:
        _text(self.op, "network", self.network, 0, 64)
        if not isinstance(self.best, tuple | list):
            raise FrameError(f"device: best must be a list, not {_name(self.best)}")
        if len(self.best) > MAX_NETWORKS:
            raise FrameError(f"device: at most {MAX_NETWORKS} best entries")
        for entry in self.best:
            if not isinstance(entry, NetworkBest):
                raise FrameError(f"device: best must hold NetworkBest, not {_name(entry)}")
        object.__setattr__(self, "best", tuple(self.best))
        value = self.battery
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise FrameError(f"device: battery must be a number, not {_name(value)}")
        if not (value == -1 or 0 <= value <= 1):
            raise FrameError("device: battery must be within 0..1, or -1 (unknown)")
        object.__setattr__(self, "battery", float(value))


Frame = (
    Sub
    | SubOk
    | Unsub
    | Renew
    | List
    | Subs
    | Pub
    | PubOk
    | Notify
    | Ack
    | Error
    | LimitReached
    | Calendar
    | CalendarOk
    | Device
)

FRAME_TYPES: Mapping[str, type[Frame]] = MappingProxyType(
    {
        cls.op: cls
        for cls in (
            Sub,
            SubOk,
            Unsub,
            Renew,
            List,
            Subs,
            Pub,
            PubOk,
            Notify,
            Ack,
            Error,
            LimitReached,
            Calendar,
            CalendarOk,
            Device,
        )
    }
)
