"""The broker core: frames in, replies out; subscriptions, publishes and per-user delivery.

Theory of operation
-------------------
:class:`Broker` is synchronous and owns no socket, task or clock (the clock is
injected); :class:`mdeci.broker.service.BrokerService` drives it from asyncio.

- :meth:`Broker.handle_frame` takes one frame's bytes from an authenticated user URI and
  returns the frames to answer with. Bad bytes, bad subjects and bad filters become an
  ``error`` frame (400); a database failure becomes ``error`` 500; nothing else escapes
  and a refused request changes no state.
- ``pub`` is matched against :class:`~mdeci.broker.matcher.SubscriptionMatcher`, the
  in-memory cache of compiled subscriptions; the store queues one notification per
  match in one transaction (idempotent by ``(publisher, msg_id)``), and ``pub-ok`` is
  built only after that call returned, so an acknowledged publish is durable.
- Delivery is pulled: for a CONNECTED user, :meth:`Broker.take_batch` returns the next
  encoded ``notify`` frames, in ``nseq`` order, at most ``window`` of them unacked at a
  time. ``ack`` frees the window at once, but reaches the store later: acks are
  cumulative, so the core keeps only each user's highest and deletes up to it once, when
  the user's delivery next wakes (:meth:`Broker.take_batches`), on (dis)connection, or on
  :meth:`Broker.flush_acks`. An agent acks every notify, and one store transaction per
  ack dominated delivery; an ack not yet applied when the broker dies only makes it send
  those notifications again, which the agent drops by nseq (acks were never fsync'd).
  :meth:`Broker.mark_connected` restarts the stream from the lowest queued (un-acked)
  ``nseq``; :meth:`Broker.mark_disconnected` stops it.
- A connected user's queue need not be read back: the rows this core's publishes just
  wrote for it are handed on from memory while its link knows that nothing else waits
  (``_Link.known``; anything that may change the queue behind it makes the next take
  read the store, as does an SMS side, which removes rows: :meth:`Broker.forget_rows`).
- The :class:`QueueListener` hears "something was queued for uri" and "uri acked", so
  the service wakes that user's delivery task instead of polling.
- Threads: the core is not thread-safe and needs no lock because one thread at a time
  owns it. The service runs it on its database thread (:mod:`mdeci.broker.worker`) and
  calls :meth:`Broker.bind_thread`; from then on every entry point that reads or changes
  state raises :class:`~mdeci.broker.errors.WrongThreadError` on any other thread, so a
  call from the event loop is a loud bug rather than a silent race.
"""

from __future__ import annotations

import contextlib
import logging
import math
import struct
import threading
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

import cbor2

from mdeci.broker.config import BrokerCoreConfig
from mdeci.broker.errors import WrongThreadError
from mdeci.broker.matcher import CompiledSubscription, SubscriptionMatcher
from mdeci.broker.sink import ChurnSink, NullSink, Row, emit_rows
from mdeci.channels.calendar import Rule
from mdeci.errors import FilterError, FrameError, SubjectError
from mdeci.filters import compile_filter, compile_pattern
from mdeci.frames import (
    BAD_REQUEST,
    FORBIDDEN,
    INTERNAL,
    MAX_FRAME_BYTES,
    MAX_ID_LENGTH,
    MAX_MESSAGE_LENGTH,
    NOT_FOUND,
    TOO_LARGE,
    UINT63,
    Ack,
    Calendar,
    CalendarOk,
    Error,
    Frame,
    List,
    Notify,
    Pub,
    PubOk,
    Sub,
    SubInfo,
    SubOk,
    Subs,
    Unsub,
    decode,
    encode,
)
from mdeci.oplog import event as oplog_event
from mdeci.store.calendars import SqlCalendars
from mdeci.store.errors import StoreError
from mdeci.store.queues import (
    DeliveryRow,
    PublishRequest,
    PublishResult,
    StoredRow,
    as_delivery,
)
from mdeci.store.repo import BrokerStore
from mdeci.store.sessions import SessionStatus
from mdeci.store.subscriptions import Subscription

# The CBOR items of a notify frame that never change (see _NotifyEncoder).
_K_OP_NOTIFY_NSEQ = cbor2.dumps("op") + cbor2.dumps(Notify.op) + cbor2.dumps("nseq")
_K_SUB_ID = cbor2.dumps("sub_id")
_K_SUBJECT = cbor2.dumps("subject")
_K_MSG_ID = cbor2.dumps("msg_id")
_K_PUBLISHED_AT = cbor2.dumps("published_at")
_K_ATTRS = cbor2.dumps("attrs")
_K_PAYLOAD = cbor2.dumps("payload")
_K_MISSED = cbor2.dumps("missed")
_EMPTY_MAP = cbor2.dumps({})

# The fields of the churn rows of a queued and a delivered notification (sink.emit_rows).
_QUEUED_KEYS = ("nseq", "queue_depth")
_DELIVERED_KEYS = ("nseq", "latency_ms")

# What a notify frame adds around a publish's subject, msg_id, attrs and payload (keys,
# nseq, sub_id up to 128 characters, times, CBOR heads), rounded up generously.
NOTIFY_OVERHEAD = 512
# Published msg_ids forgotten per call of Broker.prune (one short transaction).
PRUNE_CHUNK = 1000
# Rows a connected user's link remembers ahead of its window at most (_Link.ahead); a
# user further behind is served from the store, as before (issue 14).
AHEAD_LIMIT = 64


class QueueListener(Protocol):
    """Told when a user's delivery may make progress (the service wakes its task)."""

    def queued(self, uri: str) -> None:
        """New notifications were queued for ``uri``."""

    def acked(self, uri: str) -> None:
        """``uri`` acknowledged notifications: its window has room again."""


class OutgoingNotify(NamedTuple):
    """An encoded ``notify`` frame ready to send, with its ``nseq`` (a named tuple: one
    per notification, built cheaper than a frozen dataclass)."""

    nseq: int
    data: bytes


@dataclass(slots=True)
class _Link:
    """Delivery state of one user for the current connection (reset on each connect)."""

    connected: bool
    addr: str | None
    # nseq -> published_at of notifications sent on this connection and not yet acked.
    inflight: dict[int, float]
    # nseq -> size of the frame of each of ``inflight``, and their sum (window_bytes);
    # None while nothing was sent (issue 14: no dict per idle session).
    sizes: dict[int, int] | None = None
    inflight_bytes: int = 0
    sent_upto: int = 0
    # The last read filled the window's room: more may wait in the store (see take_batch).
    backlog: bool = False
    # True while this core knows every row of the user's queue after ``sent_upto``: they
    # are ``ahead`` (None: there are none), queued by this core's publishes since a read
    # of the store found no more. take_batches then serves the user without reading the
    # store (issue 14: a fan-out read back each recipient's rows it had just written, and
    # read every acking user's empty queue again). Anything else that may change the
    # queue (an overflow drop, a disconnection, a sweep, a side that removes rows)
    # clears it, and the next read of the store sets it again.
    known: bool = False
    ahead: list[DeliveryRow] | None = None
    ahead_bytes: int = 0  # their payloads' and attrs' bytes (bounded: see _remember)

    def forget(self) -> None:
        """The queue after ``sent_upto`` is no longer known: the next take reads it."""
        self.known = False
        self.ahead = None
        self.ahead_bytes = 0

    # The same for notifications sent on earlier connections: their ack may come after a
    # reconnection, before they are sent again (then never), and is logged all the same.
    earlier: dict[int, float] = field(default_factory=dict)


def _error(req: int | None, code: int, message: str) -> Error:
    return Error(req=req, code=code, message=message[:MAX_MESSAGE_LENGTH])


def _pub_ok(req: int, msg_id: str, matched: int) -> PubOk:
    """``PubOk(req=req, msg_id=msg_id, matched=matched)`` without its checks, which these
    values passed already: ``req`` and ``msg_id`` as the ``Pub``'s own, ``matched`` is a
    count of targets (one reply per publish; issue 14)."""
    reply = object.__new__(PubOk)
    object.__setattr__(reply, "req", req)
    object.__setattr__(reply, "msg_id", msg_id)
    object.__setattr__(reply, "matched", matched)
    return reply


def _sub_id(text: str) -> int | None:
    """The store id named by a ``sub_id`` text, or None if it cannot name one."""
    if not (text.isascii() and text.isdigit()) or len(text) > 19:
        return None
    value = int(text)
    return value if 0 < value <= UINT63 else None


_ONE_BYTE = [bytes((i,)) for i in range(256)]
_HEAD8 = struct.Struct(">BB").pack
_HEAD16 = struct.Struct(">BH").pack
_HEAD32 = struct.Struct(">BI").pack
_HEAD64 = struct.Struct(">BQ").pack
_DOUBLE = struct.Struct(">Bd").pack
_MAJOR_BYTES = 0x40  # CBOR major types 2 and 3 in a head's top three bits
_MAJOR_TEXT = 0x60


def _cbor_head(major: int, n: int) -> bytes:
    """The CBOR head of major type ``major`` (its top three bits: 0 for an unsigned
    integer, ``_MAJOR_BYTES``, ``_MAJOR_TEXT``) with argument ``n``, 0 <= n < 2**64, in
    the shortest form, as cbor2 writes it."""
    if n < 24:
        return _ONE_BYTE[major | n]
    if n < 0x100:
        return _HEAD8(major | 24, n)
    if n < 0x10000:
        return _HEAD16(major | 25, n)
    if n < 0x100000000:
        return _HEAD32(major | 26, n)
    return _HEAD64(major | 27, n)


class _NotifyEncoder:
    """Builds ``notify`` frames from queued rows, byte for byte what
    ``encode(Notify(...))`` gives, without a ``Notify`` per row (issue 14: building and
    validating one, and decoding the stored attrs to encode them again, was the largest
    Python cost of a delivery).

    ``encode`` writes a frame as a CBOR map, ``op`` first, then the fields in their
    order, leaving out those at their default; CBOR concatenates a map's items as they
    are, so the frame is its head byte followed by each item's own encoding, and each
    item is a head (:func:`_cbor_head`) and the value's bytes: the encoder writes them
    itself rather than through one ``cbor2.dumps`` per value (four per row cost half
    the encoding). The attrs go as stored (the publish encoded them with the same
    ``cbor2.dumps``). With ``share``, what all recipients of one publication share
    (subject to payload) is built once per publication and kept for the rest of the
    batch (a fan-out's hundred rows): only ``nseq``, ``sub_id`` and ``missed`` are per
    row; without it (one user's rows: no two share a publication but for overlapping
    subscriptions) each frame is written in one piece, with no key and no entry per row.
    ``tests/broker/test_notify_encoding.py`` checks the equality against ``encode``.
    """

    __slots__ = ("_shared", "_sub_ids", "_subjects")

    def __init__(self, *, share: bool = True) -> None:
        # (publisher_uri, msg_id, published_at) -> (items after sub_id, how many items in
        # all), or None for a publication that must take the checked path (see encode).
        # published_at is part of the key: a msg_id published again after the sweep
        # forgot it (queue.dedup_horizon) is another publication, and both may be queued.
        self._shared: dict[tuple[str, str, float], tuple[bytes, int] | None] | None = (
            {} if share else None
        )
        # The encodings a drain's rows share although their publications differ: their
        # subscription's id and (mostly) their subject, each encoded once per batch.
        self._sub_ids: dict[int, bytes] = {}
        self._subjects: dict[str, bytes] = {}

    def encode(self, row: DeliveryRow, missed: int) -> bytes | None:
        """The frame, or None when the row needs ``encode``'s checks (a row this broker's
        publish did not write: attrs that are not a map, a value of another type, an
        nseq < 1, a msg_id of no or over 128 characters, a frame over the limit).

        Only those: the subject's syntax and the attrs' names and values are not checked
        again (the publish that queued the row checked them), so a row written by hand
        with a bad subject goes out as stored, where ``encode`` would refuse it."""
        nseq = row[0]
        if nseq < 1:  # never written by publish; encode refuses it
            return None
        shared = self._shared
        if shared is None:
            parts = self._parts(row)
            if parts is None:
                return None
            if missed:
                parts += (_K_MISSED, _cbor_head(0, missed))
            # Every item but op is a key and a value; op, nseq and sub_id are 5 parts.
            parts[0] = _ONE_BYTE[0xA0 + (len(parts) + 1) // 2]  # a map of < 24 items
            parts[2] = _ONE_BYTE[nseq] if nseq < 24 else _cbor_head(0, nseq)
        else:
            key = (row[2], row[3], row[7])  # (publisher_uri, msg_id, published_at)
            if key in shared:
                built = shared[key]
            else:
                parts = self._parts(row)
                built = shared[key] = (
                    None if parts is None else (b"".join(parts[5:]), (len(parts) + 1) // 2)
                )
            if built is None:
                return None
            tail, items = built
            parts = [_ONE_BYTE[0xA0 + items], _K_OP_NOTIFY_NSEQ, _cbor_head(0, nseq), _K_SUB_ID,
                     b"", tail]  # fmt: skip
            if missed:
                parts[0] = _ONE_BYTE[0xA1 + items]
                parts += (_K_MISSED, _cbor_head(0, missed))
        sub_id = row[1]
        sub = self._sub_ids.get(sub_id)
        if sub is None:
            sub = self._sub_ids[sub_id] = cbor2.dumps(str(sub_id))
        parts[4] = sub
        data = b"".join(parts)
        return data if len(data) <= MAX_FRAME_BYTES else None

    def _parts(self, row: DeliveryRow) -> list[bytes] | None:
        """The frame's parts, each item's key and value from ``subject`` to ``payload``
        after five places for the map's head, op and nseq's key, nseq, sub_id's key and
        sub_id (encode fills the three that vary per row); None, see encode."""
        _, _, _, msg_id, subject, attrs, payload, published_at = row
        if not (
            type(msg_id) is str
            and 0 < len(msg_id) <= MAX_ID_LENGTH
            and type(subject) is str
            and type(attrs) is bytes
            and type(payload) is bytes
            and type(published_at) is float
            and 0.0 <= published_at < math.inf  # what Notify takes (not NaN)
        ):
            return None
        has_attrs = False
        if attrs != _EMPTY_MAP:  # most publications carry no attrs: no decoding for them
            try:
                decoded = cbor2.loads(attrs)
            except (ValueError, cbor2.CBORDecodeError):
                return None
            if not isinstance(decoded, dict):
                return None
            has_attrs = bool(decoded)  # an empty map however written: no attrs item
        encoded = self._subjects.get(subject)
        try:
            if encoded is None:
                encoded = self._subjects[subject] = cbor2.dumps(subject)
            text = msg_id.encode()
        except UnicodeEncodeError:  # a lone surrogate: encode() refuses it too
            return None
        size = len(text)
        parts = [
            b"",
            _K_OP_NOTIFY_NSEQ,
            b"",
            _K_SUB_ID,
            b"",
            _K_SUBJECT,
            encoded,
            _K_MSG_ID,
            (_ONE_BYTE[_MAJOR_TEXT | size] if size < 24 else _cbor_head(_MAJOR_TEXT, size)) + text,
            _K_PUBLISHED_AT,
            _DOUBLE(0xFB, published_at),  # cbor2 writes every finite float as a double
        ]
        if has_attrs:
            parts += (_K_ATTRS, attrs)
        if payload:
            parts += (_K_PAYLOAD, _cbor_head(_MAJOR_BYTES, len(payload)) + payload)
        return parts


class Broker:
    """The SIP-agnostic broker core; see the module docstring.

    ``clock`` gives UTC epoch seconds (TTLs, ``published_at``, latencies). Construction
    loads the live subscriptions into the matcher and raises :class:`StoreError` if the
    database fails.
    """

    def __init__(
        self,
        store: BrokerStore,
        config: BrokerCoreConfig,
        clock: Callable[[], float],
        log: ChurnSink | None = None,
    ) -> None:
        self.store = store
        self.config = config
        self.clock = clock
        self.log: ChurnSink = log if log is not None else NullSink()
        self.listener: QueueListener | None = None
        self.published = 0  # publications accepted since start (the metrics endpoint)
        self.matcher = SubscriptionMatcher()
        self.matcher.load(store.subscriptions.active_subscriptions(clock()))
        self._links: dict[str, _Link] = {}
        # Users whose queue may have overflow drops not yet reported in a notify's missed.
        self._missed_pending: set[str] = set()
        # missed counts already taken from the store, by user and nseq, kept until acked
        # so that a notify re-sent after a reconnection still carries its count.
        self._missed_at: dict[str, dict[int, int]] = {}
        # The highest ack of each user not yet applied to the store (see the docstring).
        self._acks: dict[str, int] = {}
        # Users whose held ack is applied at the end of the current batch (see _ack).
        self._acks_due: set[str] = set()
        # Users who acked in the current batch, in order: the listener hears of each once.
        self._acked: dict[str, None] = {}
        #: Queue classes a sub or pub may name (issue 13; run_broker sets [channels]'s).
        self.classes: frozenset[str] = frozenset()
        self.sms_classes: frozenset[str] = frozenset()  # those of them that may use SMS
        self._thread: int | None = None  # see bind_thread
        # Whether a connected user may be served the rows this core queued for it from
        # memory (_Link.ahead); False once something else may remove queued rows.
        self._remember_rows = True

    def bind_thread(self, thread_id: int | None) -> None:
        """Only thread ``thread_id`` may call the core from now on (None: any thread)."""
        self._thread = thread_id

    def _owned(self) -> None:
        if self._thread is not None and threading.get_ident() != self._thread:
            raise WrongThreadError(
                f"the broker core is bound to thread {self._thread}; "
                f"called from {threading.current_thread().name}"
            )

    # ------------------------------------------------------------------ frames

    def handle_frame(self, uri: str, data: bytes) -> list[Frame]:
        """Handle one frame's bytes from authenticated user ``uri``; the reply frames.

        Never raises for any ``data``: malformed bytes give ``error`` 400 (413 if too
        large) and change nothing.
        """
        try:
            frame = decode(data)
        except FrameError as exc:
            return [_error(exc.req, exc.code, exc.message)]
        return self.handle(uri, frame)

    def handle(self, uri: str, frame: Frame) -> list[Frame]:
        """Handle one decoded frame from ``uri``; the reply frames (empty for ``ack``).

        A database failure is answered with ``error`` 500 (the request may be retried);
        nothing else is raised.
        """
        self._owned()
        replies = self._handle(uri, frame)
        self._flush_due_acks()
        return replies

    def _handle(self, uri: str, frame: Frame) -> list[Frame]:
        try:
            if isinstance(frame, Sub):
                return [self._sub(uri, frame)]
            if isinstance(frame, Unsub):
                return [self._unsub(uri, frame)]
            if isinstance(frame, List):
                return [self._list(uri, frame)]
            if isinstance(frame, Pub):
                return [self._pub(uri, frame)]
            if isinstance(frame, Ack):
                self._ack(uri, frame.upto)
                return []
            if isinstance(frame, Calendar):
                return [self._calendar(uri, frame)]
        except StoreError as exc:
            oplog_event(
                "database_error", level=logging.ERROR, where="frame", uri=uri, error=str(exc)
            )
            return [_error(getattr(frame, "req", None), INTERNAL, f"broker store: {exc}")]
        if isinstance(frame, Error):
            return []  # never answer an error with an error: two peers could loop
        return [_error(getattr(frame, "req", None), BAD_REQUEST, f"unexpected op {frame.op!r}")]

    def _sub(self, uri: str, frame: Sub) -> Frame:
        try:
            pattern = compile_pattern(frame.subject)
        except SubjectError as exc:
            return _error(frame.req, BAD_REQUEST, f"subject: {exc}")
        try:
            compiled_filter = compile_filter(frame.filter)
        except FilterError as exc:
            return _error(frame.req, BAD_REQUEST, f"filter: position {exc.position}: {exc.reason}")
        if frame.qclass and frame.qclass not in self.classes:
            return _error(frame.req, BAD_REQUEST, f"unknown queue class {frame.qclass!r}")
        if self.matcher.count_of(uri, self.clock()) >= self.config.max_subscriptions:
            return _error(
                frame.req,
                FORBIDDEN,
                f"subscription limit reached ({self.config.max_subscriptions} per user)",
            )
        ttl = self.config.default_ttl if frame.ttl is None else float(frame.ttl)
        ttl = min(ttl, self.config.max_ttl)
        sub = self.store.subscriptions.add_subscription(
            uri, frame.subject, frame.filter, ttl, self.clock(), frame.qclass or None
        )
        self.matcher.add(CompiledSubscription(sub, pattern, compiled_filter))
        self.log.emit("subscription_added", uri, reason=_describe(sub))
        return SubOk(req=frame.req, sub_id=str(sub.sub_id), expires_at=sub.expires_at)

    def _calendar(self, uri: str, frame: Calendar) -> Frame:
        """Keep the device's calendar (issue 13; the channel selector reads it)."""
        rules = tuple(
            Rule(
                channel=r.channel,
                p=r.p,
                weekdays=frozenset(d for d in range(7) if r.weekdays >> d & 1),
                start_hour=r.start_hour,
                end_hour=r.end_hour,
            )
            for r in frame.rules
        )
        SqlCalendars(self.store.engine).put(uri, rules, frame.utc_offset_minutes, self.clock())
        return CalendarOk(req=frame.req, rules=len(rules))

    def _unsub(self, uri: str, frame: Unsub) -> Frame:
        sub_id = _sub_id(frame.sub_id)
        cached = None if sub_id is None else self.matcher.get(sub_id)
        # Another user's id is answered exactly like an unknown one: ids are not secrets,
        # but whether someone else subscribed is none of this user's business.
        if sub_id is None or (cached is not None and cached.sub.uri != uri):
            return _error(frame.req, NOT_FOUND, f"no subscription {frame.sub_id!r}")
        if not self.store.subscriptions.remove_subscription(uri, sub_id):
            return _error(frame.req, NOT_FOUND, f"no subscription {frame.sub_id!r}")
        self.matcher.discard(sub_id)
        now = self.clock()
        self.log.emit("subscription_removed", uri, reason=f"sub_id={sub_id}")
        return SubOk(req=frame.req, sub_id=frame.sub_id, expires_at=now)

    def _list(self, uri: str, frame: List) -> Frame:
        subs = self.store.subscriptions.list_subscriptions(uri, self.clock())
        items = tuple(
            SubInfo(
                sub_id=str(s.sub_id), subject=s.subject, filter=s.filter, expires_at=s.expires_at
            )
            for s in subs
        )
        return Subs(req=frame.req, items=items)

    def handle_frames(self, batch: Sequence[tuple[str, bytes]]) -> list[list[Frame]]:
        """Handle frames that arrived together, in order, each from its authenticated
        user; the reply frames of each. Like :meth:`handle_frame` on each in turn, except
        that consecutive ``pub`` frames (acks between them do not count) are stored in
        one transaction: one commit, one fsync for all (a group commit). Each ``pub-ok``
        is still built only after that commit returned.

        Never raises; a database failure answers every publish of the group with 500.
        """
        decoded: list[tuple[str, Frame | FrameError]] = []
        for uri, data in batch:
            try:
                decoded.append((uri, decode(data)))
            except FrameError as exc:
                decoded.append((uri, exc))
        return self.handle_decoded(decoded)

    def handle_decoded(self, batch: Sequence[tuple[str, Frame | FrameError]]) -> list[list[Frame]]:
        """:meth:`handle_frames` for frames the caller decoded already (the service
        decodes each to admit it; decoding twice cost as much as handling an ack); a
        :class:`FrameError` stands for bytes that did not decode."""
        self._owned()
        return self._handle_batch(batch, frozenset())[0]

    def handle_and_take(
        self, batch: Sequence[tuple[str, Frame | FrameError]], deliverable: Collection[str]
    ) -> tuple[list[list[Frame]], dict[str, list[OutgoingNotify]]]:
        """:meth:`handle_decoded`, then :meth:`take_batches` for the users of
        ``deliverable`` (those the caller is sending to) who acked in ``batch``, in the
        same call: an ack's freed window is refilled without the listener's wake-up and
        a second call (issue 14: two hand-offs to this thread per round of acks were the
        largest share of a drain's CPU). The listener still hears of the other users'
        acks; if the read fails, of these too (their delivery retries as usual).
        """
        self._owned()
        replies, served = self._handle_batch(batch, deliverable)
        if not served:
            return replies, {}
        try:
            return replies, self.take_batches(served)
        except StoreError:
            if self.listener is not None:
                for uri in served:
                    self.listener.acked(uri)
            return replies, {}

    def _handle_batch(
        self, batch: Sequence[tuple[str, Frame | FrameError]], deliverable: Collection[str]
    ) -> tuple[list[list[Frame]], list[str]]:
        """The replies, and the users of ``deliverable`` who acked (the listener was not
        told of those: see :meth:`handle_and_take`)."""
        replies: list[list[Frame]] = [[] for _ in batch]
        run: list[tuple[int, str, Pub]] = []
        for i, (uri, frame) in enumerate(batch):
            if isinstance(frame, FrameError):
                replies[i] = [_error(frame.req, frame.code, frame.message)]
                continue
            if isinstance(frame, Pub):
                run.append((i, uri, frame))
                continue
            if not isinstance(frame, Ack):  # an ack's order against publishes is free
                self._pubs(run, replies)
                run = []
            replies[i] = self._handle(uri, frame)
        self._pubs(run, replies)
        return replies, self._flush_due_acks(deliverable)

    def _pub(self, uri: str, frame: Pub) -> Frame:
        replies: list[list[Frame]] = [[]]
        self._pubs([(0, uri, frame)], replies)
        return replies[0][0]

    def _pubs(self, run: list[tuple[int, str, Pub]], replies: list[list[Frame]]) -> None:
        """Store the publishes of ``run`` in one transaction; put each one's reply in
        ``replies`` at its index."""
        prepared: list[tuple[int, Pub, float, bool, PublishRequest]] = []
        for i, uri, frame in run:
            attrs_cbor = cbor2.dumps(dict(frame.attrs)) if frame.attrs else _EMPTY_MAP
            size = len(frame.payload) + len(attrs_cbor) + len(frame.subject) + len(frame.msg_id)
            if size + NOTIFY_OVERHEAD > MAX_FRAME_BYTES:
                # Refused here rather than queued as a notify that could never be sent.
                replies[i] = [_error(frame.req, TOO_LARGE, "publish too large to be notified")]
                continue
            if frame.qclass and frame.qclass not in self.classes:
                replies[i] = [
                    _error(frame.req, BAD_REQUEST, f"unknown queue class {frame.qclass!r}")
                ]
                continue
            # A float as the store reads it back: the rows handed on from memory
            # (_Link.ahead) must encode as the stored ones do.
            now = float(self.clock())
            match = self.matcher.match(frame.subject, frame.attrs, now)
            request = PublishRequest(
                uri,
                frame.msg_id,
                frame.subject,
                attrs_cbor,
                frame.payload,
                # A class that may use SMS marks it urgent: the SMS side reads those rows.
                frame.urgent or frame.qclass in self.sms_classes,
                now,
                match.targets,
                frame.qclass or None,
                self._urgent_subs(match.targets),
            )
            prepared.append((i, frame, now, bool(match.expired), request))
        if not prepared:
            return
        # A held ack would make a full queue look fuller: apply it before overflow counts.
        targets = {uri for *_, req in prepared for uri, _ in req.targets}
        self._try_flush_acks(*sorted(self._acks.keys() & targets))
        written: list[StoredRow] = []
        try:
            results = self.store.queues.publish_many(
                [req for *_, req in prepared],
                max_depth=self.config.max_queue_depth,
                policy=self.config.overflow_policy,
                written=written,
            )
        except StoreError as exc:
            oplog_event("database_error", level=logging.ERROR, where="publish", error=str(exc))
            for i, frame, *_ in prepared:
                replies[i] = [_error(frame.req, INTERNAL, f"broker store: {exc}")]
            # The rows may be committed all the same (a connection lost after the server
            # committed); the publisher's retry is then a duplicate that queues and wakes
            # nothing. So the targets' links read the store again, and are woken now.
            for uri in targets:
                link = self._links.get(uri)
                if link is not None:
                    link.forget()
            if self.listener is not None:
                for target in sorted(targets):
                    self.listener.queued(target)
            return
        woken: set[str] = set()
        expired_at: float | None = None
        # The queued events of the whole call go to the sink as one batch (issue 14).
        queued_rows: list[Row] = []
        self._remember(written, results)
        for (i, frame, now, expired, _), result in zip(prepared, results, strict=True):
            for queued in result.queued:
                queued_rows.append((queued.uri, queued.nseq, queued.depth))
            if result.dropped:  # rare (overflow): the lines keep their order
                emit_rows(self.log, "notify_queued", _QUEUED_KEYS, queued_rows)
                queued_rows = []
            for dropped in result.dropped:
                self._missed_pending.add(dropped.uri)
                self.log.emit(
                    "notify_dropped",
                    dropped.uri,
                    nseq=dropped.nseq,
                    reason=f"queue overflow ({dropped.reason}), msg_id={dropped.msg_id}",
                )
            if expired:
                expired_at = now
            woken.update(q.uri for q in result.queued)
            replies[i] = [_pub_ok(frame.req, frame.msg_id, result.matched)]
            self.published += 1
        emit_rows(self.log, "notify_queued", _QUEUED_KEYS, queued_rows)
        if expired_at is not None:
            self._sweep_after_match(expired_at)
        if self.listener is not None:
            for target in sorted(woken):
                self.listener.queued(target)

    def _remember(self, written: Sequence[StoredRow], results: Sequence[PublishResult]) -> None:
        """Append the rows a publish call wrote to their connected users' ``ahead``
        (see _Link.known), in nseq order; a user whose rows do not follow on from what
        its link knows, or with an overflow drop in this call, is forgotten instead (its
        next take reads the store). Bounded per user by AHEAD_LIMIT rows, and by
        ``window_bytes`` for these rows' payloads and attrs with the frames in flight."""
        links = self._links
        dropped = {d.uri for result in results for d in result.dropped}
        for uri in dropped:
            link = links.get(uri)
            if link is not None:
                link.forget()
        if not self._remember_rows:
            return  # no link is known (take_batches): every take reads the store
        limit = self.config.window_bytes
        for row in written:  # StoredRow: uri, nseq, sub_id, ..., attrs_cbor, payload, ...
            link = links.get(row[0])
            if link is None or not link.known:
                continue
            ahead = link.ahead
            size = link.ahead_bytes + len(row[6]) + len(row[7])
            nseq = row[1]
            # What the link holds, sent and ahead, stays within window_bytes: the bound
            # operators read for a user that does not ack (not twice it).
            room = link.inflight_bytes + size <= limit
            if ahead is None:
                if nseq == link.sent_upto + 1 and room:
                    link.ahead = [as_delivery(row)]
                    link.ahead_bytes = size
                    continue
            elif nseq == ahead[-1][0] + 1 and len(ahead) < AHEAD_LIMIT and room:
                ahead.append(as_delivery(row))
                link.ahead_bytes = size
                continue
            link.forget()

    def forget_rows(self) -> None:
        """From now on every delivery reads the store: something besides this core may
        remove queued rows (the SMS side, once a notification went by SMS), so the rows
        a publish queued cannot be handed on from memory (see _Link.known)."""
        self._owned()
        self._remember_rows = False
        for link in self._links.values():
            link.forget()

    def _urgent_subs(self, targets: Sequence[tuple[str, int]]) -> frozenset[int]:
        """Targets whose subscription names a class that may use SMS (issue 13)."""
        if not self.sms_classes:
            return frozenset()
        found = set()
        for _, sub_id in targets:
            compiled = self.matcher.get(sub_id)
            if compiled is not None and compiled.sub.qclass in self.sms_classes:
                found.add(sub_id)
        return frozenset(found)

    def _sweep_after_match(self, now: float) -> None:
        # The publish is durable already; a failed delete is retried by the periodic sweep.
        with contextlib.suppress(StoreError):
            self.sweep(now)

    def _ack(self, uri: str, upto: int) -> None:
        if upto > self._acks.get(uri, 0):
            self._acks[uri] = upto
        link = self._links.get(uri)
        if link is not None:
            if upto > link.sent_upto:
                link.forget()  # acked what was not sent: its rows ahead may be gone
            now = self.clock()
            if link.earlier:
                acked = sorted(n for n in {*link.inflight, *link.earlier} if n <= upto)
            else:
                # The common case, without a set and a sort per ack: ``inflight`` gets
                # its nseqs in increasing order (take_batches), so those acked lead it.
                acked = []
                for n in link.inflight:
                    if n > upto:
                        break
                    acked.append(n)
            delivered: list[Row] = []  # one batch for the sink (issue 14)
            sizes = link.sizes or {}
            inflight = link.inflight
            freed = 0
            if link.earlier:
                for nseq in acked:
                    published_at = link.earlier.pop(nseq, 0.0)
                    published_at = inflight.pop(nseq, published_at)
                    freed += sizes.pop(nseq, 0)
                    delivered.append((uri, nseq, max(0.0, (now - published_at) * 1000.0)))
            else:  # the same without a lookup in the empty ``earlier`` per notification
                for nseq in acked:
                    latency = (now - inflight.pop(nseq)) * 1000.0
                    freed += sizes.pop(nseq, 0)
                    delivered.append((uri, nseq, latency if latency > 0.0 else 0.0))
            link.inflight_bytes -= freed
            emit_rows(self.log, "notify_delivered", _DELIVERED_KEYS, delivered)
            link.sent_upto = max(link.sent_upto, upto)
            if not link.inflight and link.sizes is not None:
                # Idle again: an emptied dict keeps its table (up to a window's entries);
                # clear() frees it (memory per session, issue 14 criterion 7).
                link.inflight.clear()
                link.sizes = None
        missed = self._missed_at.get(uri)
        if missed:
            for nseq in [n for n in missed if n <= upto]:
                del missed[nseq]
        if link is None or not link.inflight:
            # Nothing left in flight: the stream went idle, so no later wake-up would
            # apply the held ack; apply it now (coalescing only pays while a backlog runs),
            # that is at the end of this batch of frames, with the other users' in the
            # same transaction (a fan-out's acks arrive together).
            self._acks_due.add(uri)
        # Told once per user at the end of the batch of frames (_flush_due_acks), not once
        # per ack: the loop wakes the user's delivery once either way.
        self._acked[uri] = None

    def flush_acks(self, uri: str | None = None) -> None:
        """Apply the held acks of ``uri`` (every user if None) to the store.

        Raises:
            StoreError: the database failed; the acks stay held for the next call.
        """
        self._owned()
        self._apply_acks([uri] if uri is not None else sorted(self._acks))

    def _apply_acks(self, uris: Sequence[str]) -> None:
        """The held acks of ``uris`` in one transaction (raises :class:`StoreError`)."""
        held = [(user, self._acks[user]) for user in uris if user in self._acks]
        if not held:
            return
        self.store.queues.ack_many(held)
        for user, upto in held:
            # An ack that arrived meanwhile cannot be lower (no await in between), but
            # keep the rule "only ever forget what was applied" explicit.
            if self._acks.get(user) == upto:
                del self._acks[user]

    def _try_flush_acks(self, *uris: str) -> None:
        # Held acks only repeat work if left unapplied: never fail a caller over them.
        with contextlib.suppress(StoreError):
            self._apply_acks(uris)

    def _flush_due_acks(self, served: Collection[str] = frozenset()) -> list[str]:
        """Tell the listener who acked in this batch, except the users of ``served``
        (returned: the caller refills their window itself), and apply the held acks
        that are due."""
        held_back: list[str] = []
        if self._acked:
            acked, self._acked = self._acked, {}
            for uri in acked:
                if uri in served:
                    held_back.append(uri)
                elif self.listener is not None:
                    self.listener.acked(uri)
        if self._acks_due:
            due, self._acks_due = self._acks_due, set()
            self._try_flush_acks(*sorted(due))
        return held_back

    # ------------------------------------------------------------------ TTL sweep

    def sweep(self, now: float | None = None) -> list[Subscription]:
        """Delete subscriptions expired at ``now`` (default: the clock); the ones removed.

        Their queued notifications stay queued and are delivered.

        Raises:
            StoreError: the database failed; the matcher already ignores expired ones.
        """
        self._owned()
        at = self.clock() if now is None else now
        # The periodic sweep is also when every user's queue is read again (the service
        # wakes them all after it): rows another process queued are found then, as
        # before the links knew their queues (see _Link.known).
        for link in self._links.values():
            link.forget()
        expired = self.store.subscriptions.sweep_expired(at)
        for sub in expired:
            self.matcher.discard(sub.sub_id)
            self.log.emit("subscription_expired", sub.uri, reason=_describe(sub))
        return expired

    def prune(self, now: float | None = None) -> int:
        """Forget at most :data:`PRUNE_CHUNK` of the msg_ids published more than
        ``dedup_horizon`` before ``now`` (default: the clock), the oldest first; how many
        went (fewer than the chunk: none older are left). The service calls it after each
        sweep until a chunk comes back short, one worker call per chunk so that publishes
        and acks run between them.

        Raises:
            StoreError: the database failed; nothing was forgotten.
        """
        self._owned()
        at = self.clock() if now is None else now
        return self.store.queues.prune_published(at - self.config.dedup_horizon, PRUNE_CHUNK)

    # ------------------------------------------------------------------ sessions

    def is_connected(self, uri: str) -> bool:
        """True while ``uri``'s media is CONNECTED (notifications are being sent)."""
        self._owned()
        link = self._links.get(uri)
        return link is not None and link.connected

    def in_flight(self, uri: str) -> tuple[int, ...]:
        """The nseqs sent to ``uri`` on this connection and not yet acked, in order."""
        self._owned()
        link = self._links.get(uri)
        return () if link is None else tuple(sorted(link.inflight))

    def mark_connected(self, uri: str, addr: str | None = None) -> None:
        """``uri``'s media is CONNECTED (INVITE or re-INVITE done): deliver from the
        lowest queued nseq again, with an empty window.

        Raises:
            StoreError: the status could not be stored (delivery is enabled anyway).
        """
        self._owned()
        self._try_flush_acks(uri)  # the stream restarts from the lowest queued nseq
        previous = self._links.get(uri)
        prev_addr = previous.addr if previous is not None else None
        earlier = {} if previous is None else {**previous.earlier, **previous.inflight}
        self._links[uri] = _Link(connected=True, addr=addr, inflight={}, earlier=earlier)
        # Drops may have happened while nobody was looking (or before a restart).
        self._missed_pending.add(uri)
        self.log.emit("media_connected", uri, addr=addr, prev_addr=prev_addr, channel="ip")
        self.store.sessions.set_status(uri, SessionStatus.CONNECTED, self.clock())

    def mark_moved(self, uri: str, addr: str) -> bool:
        """``uri``'s re-INVITE moved its media to ``addr`` on the same association while
        it was CONNECTED: delivery carries on where it is (the transport resends what is
        in flight to the new address), so nothing is sent twice; only the address and the
        churn log change (the same ``media_connected`` event as :meth:`mark_connected`,
        with ``prev_addr``). False, changing nothing, when ``uri`` is not CONNECTED: the
        caller then uses :meth:`mark_connected`.
        """
        self._owned()
        link = self._links.get(uri)
        if link is None or not link.connected:
            return False
        prev_addr, link.addr = link.addr, addr
        self.log.emit("media_connected", uri, addr=addr, prev_addr=prev_addr, channel="ip")
        return True

    def delivered_elsewhere(self, uri: str, nseq: int) -> None:
        """``uri``'s notification ``nseq`` was delivered, and logged, by another channel
        (SMS): if it was also sent over IP, a later ack covering it is not a second
        delivery (it was logged twice, and the analytics counted it twice)."""
        self._owned()
        link = self._links.get(uri)
        if link is not None:
            link.inflight.pop(nseq, None)
            if link.sizes is not None:
                link.inflight_bytes -= link.sizes.pop(nseq, 0)
            link.earlier.pop(nseq, None)

    def mark_disconnected(
        self, uri: str, reason: str, status: SessionStatus = SessionStatus.DISCONNECTED
    ) -> None:
        """``uri``'s media stopped answering (or the dialog ended): stop sending; what was
        sent and not acked is sent again after the next :meth:`mark_connected`.

        Raises:
            StoreError: the status could not be stored (delivery is stopped anyway).
        """
        self._owned()
        self._try_flush_acks(uri)  # the SMS fallback reads the queue next
        link = self._links.get(uri)
        was_connected = link is not None and link.connected
        if link is not None:
            link.connected = False
            link.earlier.update(link.inflight)
            link.inflight.clear()
            link.sizes = None
            link.inflight_bytes = 0
            link.sent_upto = 0
            link.forget()
        try:
            self.store.sessions.set_status(uri, status, self.clock())
        finally:
            # After the store write: whoever reads the event finds the status stored.
            if was_connected:
                addr = link.addr if link is not None else None
                self.log.emit("media_disconnected", uri, addr=addr, channel="ip", reason=reason)

    # ------------------------------------------------------------------ delivery

    def take_batch(self, uri: str) -> list[OutgoingNotify]:
        """The next notify frames for ``uri``, in nseq order, as many as the window allows
        (none unless CONNECTED); they count as in flight until acked.

        Raises:
            StoreError: the database failed; nothing was taken.
        """
        return self.take_batches([uri]).get(uri, [])

    def take_batches(self, uris: Sequence[str]) -> dict[str, list[OutgoingNotify]]:
        """:meth:`take_batch` for several users at once: their held acks applied in one
        transaction, their queues read on one connection (a fan-out wakes every
        subscriber together). Users with nothing to send are left out.

        Raises:
            StoreError: the database failed; nothing was taken. (If only the ``missed``
            count of one user cannot be read, that user alone is left out, unchanged,
            and the error raised after the others were taken only if it is the only one.)
        """
        self._owned()
        plan: list[tuple[str, _Link, int]] = []
        for uri in uris:
            link = self._links.get(uri)
            if link is None or not link.connected:
                continue
            room = self.config.window - len(link.inflight)
            # While a backlog drains, refill only once half the window is free: one read
            # (and one applied ack) per half window instead of one per ack, with at least
            # half a window still in flight, so the link never runs dry. A user with no
            # backlog gets a new notification at once.
            if room <= 0 or (link.backlog and room < max(1, self.config.window // 2)):
                continue
            if link.inflight_bytes >= self.config.window_bytes:
                continue
            plan.append((uri, link, room))
        if not plan:
            return {}
        self._try_flush_acks(*sorted(uri for uri, _, _ in plan))
        # Only the users whose queue this core does not know are read (see _Link.known).
        unknown = [(uri, link.sent_upto, room) for uri, link, room in plan if not link.known]
        reads = iter(self.store.queues.pending_many(unknown) if unknown else ())
        taken: dict[str, list[OutgoingNotify]] = {}
        error: StoreError | None = None
        # For this batch: a fan-out's rows share their publications' items; one user's
        # rows (a drain) share nothing worth a key per row.
        encoder = _NotifyEncoder(share=len(plan) > 1)
        encode_row = encoder.encode
        rows_of: list[Sequence[DeliveryRow]] = []
        for _, link, room in plan:
            if not link.known:
                rows_of.append(next(reads))
            elif link.ahead is not None:
                rows_of.append(link.ahead[:room])
            else:
                rows_of.append(())  # known: nothing waits
        self._missed_none([uri for (uri, _, _), rows in zip(plan, rows_of, strict=True) if rows])
        for (uri, link, room), rows in zip(plan, rows_of, strict=True):
            ahead = link.ahead
            if rows:
                try:
                    # The only other store call; made before this user's state changes
                    # so that a StoreError leaves its link as it was.
                    self._missed(uri, rows[0][0])
                except StoreError as exc:
                    error = exc
                    continue
            link.backlog = len(rows) == room
            out: list[OutgoingNotify] = []
            room_bytes = self.config.window_bytes - link.inflight_bytes
            # _missed's answer without a call per row: the call above took the store's
            # count (the user is no longer pending), so only the remembered ones remain.
            known = self._missed_at.get(uri)
            sizes = link.sizes if link.sizes is not None else {}
            inflight = link.inflight
            for row in rows:
                nseq = row[0]
                data = encode_row(row, known.get(nseq, 0) if known else 0)
                if data is None:
                    data = self._encode_notify(uri, row)
                if data is None:
                    link.sent_upto = nseq  # skipped for good (logged)
                    continue
                size = len(data)
                if size > room_bytes and inflight:
                    # Over window_bytes: this one and the rest are read again next time
                    # (one always goes when nothing is in flight, whatever its size).
                    link.backlog = True
                    break
                room_bytes -= size
                link.sent_upto = nseq
                inflight[nseq] = row[7]  # published_at
                sizes[nseq] = size
                out.append(OutgoingNotify(nseq, data))
            link.inflight_bytes = self.config.window_bytes - room_bytes
            if sizes:
                link.sizes = sizes
            if ahead is not None:
                # Rows are taken (or skipped) in order and ahead's nseqs follow on, so
                # what went is a prefix up to sent_upto; the rest waits for the window.
                del ahead[: max(0, link.sent_upto - ahead[0][0] + 1)]
                link.backlog = bool(ahead)
                if not ahead:
                    link.ahead = None
                    link.ahead_bytes = 0
                else:
                    link.ahead_bytes = sum(len(r[6]) + len(r[5]) for r in ahead)
            elif not link.known and not link.backlog and self._remember_rows:
                # The read found fewer rows than there was room for, and all of them
                # went: nothing waits after sent_upto until this core queues more.
                link.known = True
            if out:
                taken[uri] = out
        if error is not None and len(plan) == 1:
            raise error
        return taken

    def _missed_none(self, uris: list[str]) -> None:
        """Of ``uris``, those whose missed count is still to be taken from the store
        (see _missed) and is 0 there are no longer pending: one read for all, not a
        ``take_missed`` each (issue 14: a hundred users connecting, then a fan-out). The
        others keep their own ``take_missed``; so does everyone if this read fails."""
        pending = [uri for uri in uris if uri in self._missed_pending]
        if len(pending) < 2:
            return
        try:
            counted = self.store.queues.missed_many(pending)
        except StoreError:
            return
        for uri in pending:
            if uri not in counted:
                self._missed_pending.discard(uri)

    def _missed(self, uri: str, nseq: int) -> int:
        known = self._missed_at.setdefault(uri, {})
        if nseq in known:
            return known[nseq]
        if uri not in self._missed_pending:
            return 0
        count = self.store.queues.take_missed(uri)
        self._missed_pending.discard(uri)
        if count:
            known[nseq] = count
        return count

    def _encode_notify(self, uri: str, row: DeliveryRow) -> bytes | None:
        nseq, sub_id, _, msg_id, subject, attrs_cbor, payload, published_at = row
        try:
            frame = Notify(
                nseq=nseq,
                sub_id=str(sub_id),
                subject=subject,
                msg_id=msg_id,
                published_at=published_at,
                attrs=cbor2.loads(attrs_cbor),
                payload=payload,
                missed=self._missed(uri, nseq),
            )
            return encode(frame)
        except (FrameError, ValueError, TypeError, cbor2.CBORDecodeError) as exc:
            # Only a row written by something else than _pub can get here; skipping it
            # keeps the user's stream moving (the agent's ack removes it later).
            self.log.emit("notify_dropped", uri, nseq=nseq, reason=f"unsendable: {exc}")
            return None


def _describe(sub: Subscription) -> str:
    return f"sub_id={sub.sub_id} subject={sub.subject}"
