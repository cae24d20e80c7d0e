"""The broker core: frames in, replies out; subscriptions, publishes and per-user delivery.

Theory of operation
-------------------
:class:`BrokerCore` is sans-IO: it owns no store, socket, task, thread or clock (the
clock is injected). Each entry point that needs the database is a generator
(:data:`~mdeci.broker.delivery.Step`) yielding typed store commands (:class:`PublishMany`,
:class:`AddSubscription`, ...; the delivery's in :mod:`mdeci.broker.delivery`) and
resumed with each result, or with the :class:`~mdeci.errors.StoreError` thrown in;
:class:`~mdeci.broker.glue.Broker` carries them out on the database thread, and
:class:`mdeci.broker.service.BrokerService` drives that from asyncio.

- :meth:`BrokerCore.handle_frame` takes one frame's bytes from an authenticated user URI
  and returns the frames to answer with. Bad bytes, bad subjects and bad filters become
  an ``error`` frame (400); a database failure becomes ``error`` 503 (507 when the
  storage is full); nothing else escapes and a refused request changes no state.
- ``pub`` is matched against :class:`~mdeci.broker.matcher.SubscriptionMatcher`, the
  in-memory cache of compiled subscriptions; one :class:`PublishMany` command queues one
  notification per match for every publish of a batch in one transaction (idempotent by
  ``(publisher, msg_id)``), and ``pub-ok`` is built only once its result came back, so
  an acknowledged publish is durable.
- Delivery (each user's window, acks held and applied, rows handed on from memory) is
  :class:`~mdeci.broker.delivery.Delivery`'s, which :class:`BrokerCore` extends.
- Out of band, the core appends to :attr:`~mdeci.broker.delivery.Delivery.events`:
  :class:`~mdeci.broker.delivery.Wake` ("something was queued for uri", "uri acked", so
  the service wakes that user's delivery task instead of polling) and the database's
  health (:class:`StoreFailed`, :class:`StoreSucceeded`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

import cbor2

from mdeci.broker.config import BrokerCoreConfig
from mdeci.broker.delivery import (
    Delivery,
    OutgoingNotify,
    Step,
    StoreCommand,
    Wake,
    call,
)
from mdeci.broker.matcher import CompiledSubscription, SubscriptionMatcher
from mdeci.broker.refusal import refusal
from mdeci.broker.sink import ChurnSink, Row, emit_rows
from mdeci.channels.calendar import Rule, WeeklyCalendar
from mdeci.config import OverflowPolicyName
from mdeci.errors import FilterError, FrameError, StoreError, SubjectError
from mdeci.filters import compile_filter
from mdeci.frames import (
    BAD_REQUEST,
    EMPTY_ATTRS,
    FORBIDDEN,
    MAX_FRAME_BYTES,
    MAX_MESSAGE_LENGTH,
    NOT_FOUND,
    TOO_LARGE,
    UINT63,
    Ack,
    Calendar,
    CalendarOk,
    Device,
    Error,
    Frame,
    List,
    Pub,
    PubOk,
    Renew,
    Sub,
    SubInfo,
    SubOk,
    Subs,
    Unsub,
    decode,
)
from mdeci.store.queue_rows import PublishRequest, PublishResult, StoredRow
from mdeci.store.subscription_rows import Subscription
from mdeci.subjects import compile_pattern

# The fields of the churn rows of a queued and a delivered notification (sink.emit_rows).
_QUEUED_KEYS = ("nseq", "queue_depth")

# What a notify frame adds around a publish's subject, msg_id, attrs and payload (keys,
# nseq, sub_id up to 128 characters, times, CBOR heads), rounded up generously.
NOTIFY_OVERHEAD = 512
# Published msg_ids forgotten per call of Broker.prune (one short transaction).
PRUNE_CHUNK = 1000
_new_tuple = tuple.__new__  # a Wake per woken user without its Python-level constructor


def _error(req: int | None, code: int, message: str) -> Error:
    return Error(req=req, code=code, message=message[:MAX_MESSAGE_LENGTH])


def _refused(req: int | None, exc: StoreError) -> Error:
    """The ``error`` frame for a request the store failed (see :mod:`.db_health`)."""
    answer = refusal(exc)
    return _error(req, answer.code, answer.message)


def _pub_ok(req: int, msg_id: str, matched: int) -> PubOk:
    """``PubOk(req=req, msg_id=msg_id, matched=matched)`` without its checks, which these
    values passed already: ``req`` and ``msg_id`` as the ``Pub``'s own, ``matched`` is a
    count of targets (one reply per publish)."""
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


@dataclass(frozen=True, slots=True)
class ActiveSubscriptions(StoreCommand[list[Subscription]]):
    """Every subscription alive at ``now`` (to fill the matcher)."""

    now: float


@dataclass(frozen=True, slots=True)
class AddSubscription(StoreCommand[Subscription]):
    """Store a subscription of ``uri`` alive until ``now + ttl``."""

    uri: str
    subject: str
    filter: str
    ttl: float
    now: float
    qclass: str | None
    in_order: bool = False


@dataclass(frozen=True, slots=True)
class RemoveSubscription(StoreCommand[bool]):
    """Delete ``uri``'s subscription ``sub_id``; whether one was deleted."""

    uri: str
    sub_id: int


@dataclass(frozen=True, slots=True)
class RenewSubscription(StoreCommand[Subscription | None]):
    """Move ``uri``'s live subscription ``sub_id`` to expire at ``now + ttl``; the
    renewed one, or None when ``uri`` has no live one of that id."""

    uri: str
    sub_id: int
    ttl: float
    now: float


@dataclass(frozen=True, slots=True)
class ListSubscriptions(StoreCommand[list[Subscription]]):
    """``uri``'s subscriptions alive at ``now``."""

    uri: str
    now: float


@dataclass(frozen=True, slots=True)
class SweepExpired(StoreCommand[list[Subscription]]):
    """Delete the subscriptions expired at ``now``; the ones deleted."""

    now: float


@dataclass(frozen=True, slots=True)
class PutCalendar(StoreCommand[None]):
    """Keep ``rules`` as ``uri``'s calendar."""

    uri: str
    rules: tuple[Rule, ...]
    utc_offset_minutes: int
    now: float


@dataclass(frozen=True, slots=True)
class PublishMany(StoreCommand[tuple[list[PublishResult], list[StoredRow]]]):
    """Store ``requests`` in one transaction; each one's result, and the queue rows
    written (in the order inserted)."""

    requests: Sequence[PublishRequest]
    max_depth: int
    policy: OverflowPolicyName


@dataclass(frozen=True, slots=True)
class PrunePublished(StoreCommand[int]):
    """Forget at most ``limit`` published msg_ids older than ``before``; how many went."""

    before: float
    limit: int


@dataclass(frozen=True, slots=True)
class StoreFailed:
    """A store command of ``where`` failed with ``error`` (for the database's health)."""

    where: str
    error: StoreError
    uri: str | None = None


@dataclass(frozen=True, slots=True)
class StoreSucceeded:
    """The store answered a request. A write ends an outage in the database's health; a
    read does not (a full disk still reads)."""

    wrote: bool = True


class BrokerCore(Delivery):
    """The SIP-agnostic broker core; see the module docstring.

    ``clock`` gives UTC epoch seconds (TTLs, ``published_at``, latencies). The glue runs
    :meth:`load` before anything else: it fills the matcher with the live subscriptions.
    """

    def __init__(
        self,
        config: BrokerCoreConfig,
        clock: Callable[[], float],
        log: ChurnSink | None = None,
    ) -> None:
        super().__init__(config, clock, log)
        self.published = 0  # publications accepted since start (the metrics endpoint)
        #: What the database's health hears, in order, since the glue last took it.
        self.health_events: list[StoreFailed | StoreSucceeded] = []
        self.matcher = SubscriptionMatcher()
        #: Queue classes a sub or pub may name (run_broker sets [channels]'s).
        self.classes: frozenset[str] = frozenset()
        self.sms_classes: frozenset[str] = frozenset()  # those of them that may use SMS
        # The last ``device`` frame of each user: its access network, best figures and
        # battery (docs/channels.md "Networks as channels"); kept in memory, sent again by
        # the agent at every session start.
        self.devices: dict[str, Device] = {}

    def load(self) -> Step[None]:
        """Fill the matcher with the subscriptions alive now.

        Raises:
            StoreError: the database failed.
        """
        self.matcher.load((yield from call(ActiveSubscriptions(self.clock()))))

    # ------------------------------------------------------------------ frames

    def handle_frame(self, uri: str, data: bytes) -> Step[list[Frame]]:
        """Handle one frame's bytes from authenticated user ``uri``; the reply frames.

        Never raises for any ``data``: malformed bytes give ``error`` 400 (413 if too
        large) and change nothing.
        """
        try:
            frame = decode(data)
        except FrameError as exc:
            return [_error(exc.req, exc.code, exc.message)]
        return (yield from self.handle(uri, frame))

    def handle(self, uri: str, frame: Frame) -> Step[list[Frame]]:
        """Handle one decoded frame from ``uri``; the reply frames (empty for ``ack``).

        A database failure is answered with ``error`` 503 (507 when the storage is full;
        :func:`~mdeci.broker.db_health.refusal`): the request may be retried. Nothing else
        is raised.
        """
        replies = yield from self._handle(uri, frame)
        yield from self._flush_due_acks()
        return replies

    def _handle(self, uri: str, frame: Frame) -> Step[list[Frame]]:
        try:
            if isinstance(frame, Sub):
                return [self._stored((yield from self._sub(uri, frame)))]
            if isinstance(frame, Unsub):
                return [self._stored((yield from self._unsub(uri, frame)))]
            if isinstance(frame, Renew):
                return [self._stored((yield from self._renew(uri, frame)))]
            if isinstance(frame, List):
                return [self._stored((yield from self._list(uri, frame)), wrote=False)]
            if isinstance(frame, Pub):
                return [(yield from self._pub(uri, frame))]  # _pubs reports to health itself
            if isinstance(frame, Ack):
                self._ack(uri, frame.upto)
                return []
            if isinstance(frame, Calendar):
                return [self._stored((yield from self._calendar(uri, frame)))]
            if isinstance(frame, Device):
                self.devices[uri] = frame
                if self.holds is not None:
                    self.release(uri, self.holds.device(uri, frame))
                return []
        except StoreError as exc:
            self.health_events.append(StoreFailed("frame", exc, uri))
            return [_refused(getattr(frame, "req", None), exc)]
        if isinstance(frame, Error):
            return []  # never answer an error with an error: two peers could loop
        return [_error(getattr(frame, "req", None), BAD_REQUEST, f"unexpected op {frame.op!r}")]

    def _stored(self, reply: Frame, *, wrote: bool = True) -> Frame:
        """``reply``, after telling health that the store answered (an ``error`` reply
        may have come before any database call, so it tells nothing)."""
        if not isinstance(reply, Error):
            self.health_events.append(StoreSucceeded(wrote))
        return reply

    def _sub(self, uri: str, frame: Sub) -> Step[Frame]:
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
        limit = self.config.max_filter_cost
        if refused := self.matcher.cost_refusal(uri, compiled_filter, limit, self.clock()):
            return _error(frame.req, FORBIDDEN, refused)
        ttl = self.config.default_ttl if frame.ttl is None else float(frame.ttl)
        ttl = min(ttl, self.config.max_ttl)
        sub = yield from call(
            AddSubscription(
                uri,
                frame.subject,
                frame.filter,
                ttl,
                self.clock(),
                frame.qclass or None,
                frame.in_order,
            )
        )
        self.matcher.add(CompiledSubscription.of(sub, pattern, compiled_filter))
        self.log.emit("subscription_added", uri, reason=_describe(sub))
        return SubOk(req=frame.req, sub_id=str(sub.sub_id), expires_at=sub.expires_at, ttl=ttl)

    def _renew(self, uri: str, frame: Renew) -> Step[Frame]:
        sub_id = _sub_id(frame.sub_id)
        ttl = self.config.default_ttl if frame.ttl is None else float(frame.ttl)
        ttl = min(ttl, self.config.max_ttl)
        sub = None
        if sub_id is not None:
            sub = yield from call(RenewSubscription(uri, sub_id, ttl, self.clock()))
        if sub is None:
            return _error(frame.req, NOT_FOUND, f"no live subscription {frame.sub_id!r}")
        cached = self.matcher.get(sub.sub_id)
        if cached is not None:
            self.matcher.add(CompiledSubscription.of(sub, cached.matcher, cached.accepts))
        else:  # not cached: made by another broker on this store, or no longer compiles
            with contextlib.suppress(SubjectError, FilterError):
                self.matcher.add(CompiledSubscription.compile(sub))
        return SubOk(req=frame.req, sub_id=frame.sub_id, expires_at=sub.expires_at, ttl=ttl)

    def _calendar(self, uri: str, frame: Calendar) -> Step[Frame]:
        """Keep the device's calendar (the channel selector reads it)."""
        rules = tuple(r.rule() for r in frame.rules)
        yield from call(PutCalendar(uri, rules, frame.utc_offset_minutes, self.clock()))
        if self.holds is not None:
            week = WeeklyCalendar.from_rules(rules, utc_offset_minutes=frame.utc_offset_minutes)
            self.release(uri, self.holds.calendar(uri, week))
        return CalendarOk(req=frame.req, rules=len(rules))

    def _unsub(self, uri: str, frame: Unsub) -> Step[Frame]:
        sub_id = _sub_id(frame.sub_id)
        cached = None if sub_id is None else self.matcher.get(sub_id)
        # Another user's id is answered exactly like an unknown one: ids are not secrets,
        # but whether someone else subscribed is none of this user's business.
        if sub_id is None or (cached is not None and cached.uri != uri):
            return _error(frame.req, NOT_FOUND, f"no subscription {frame.sub_id!r}")
        if not (yield from call(RemoveSubscription(uri, sub_id))):
            return _error(frame.req, NOT_FOUND, f"no subscription {frame.sub_id!r}")
        self.matcher.discard(sub_id)
        now = self.clock()
        self.log.emit("subscription_removed", uri, reason=f"sub_id={sub_id}")
        return SubOk(req=frame.req, sub_id=frame.sub_id, expires_at=now)

    def _list(self, uri: str, frame: List) -> Step[Frame]:
        subs = yield from call(ListSubscriptions(uri, self.clock()))
        items = tuple(
            SubInfo(
                sub_id=str(s.sub_id), subject=s.subject, filter=s.filter, expires_at=s.expires_at
            )
            for s in subs
        )
        return Subs(req=frame.req, items=items)

    def handle_frames(self, batch: Sequence[tuple[str, bytes]]) -> Step[list[list[Frame]]]:
        """Handle frames that arrived together, in order, each from its authenticated
        user; the reply frames of each. Like :meth:`handle_frame` on each in turn, except
        that consecutive ``pub`` frames (acks between them do not count) are stored in
        one transaction: one commit, one fsync for all (a group commit). Each ``pub-ok``
        is still built only after that commit returned.

        Never raises; a database failure answers every publish of the group with 503.
        """
        decoded: list[tuple[str, Frame | FrameError]] = []
        for uri, data in batch:
            try:
                decoded.append((uri, decode(data)))
            except FrameError as exc:
                decoded.append((uri, exc))
        return (yield from self.handle_decoded(decoded))

    def handle_decoded(
        self, batch: Sequence[tuple[str, Frame | FrameError]]
    ) -> Step[list[list[Frame]]]:
        """:meth:`handle_frames` for frames the caller decoded already (the service
        decodes each to admit it; decoding twice cost as much as handling an ack); a
        :class:`FrameError` stands for bytes that did not decode."""
        return (yield from self._handle_batch(batch, frozenset()))[0]

    def handle_and_take(
        self, batch: Sequence[tuple[str, Frame | FrameError]], deliverable: Collection[str]
    ) -> Step[tuple[list[list[Frame]], dict[str, list[OutgoingNotify]]]]:
        """:meth:`handle_decoded`, then :meth:`take_batches` for the users of
        ``deliverable`` (those the caller is sending to) who acked in ``batch``, in the
        same call: an ack's freed window is refilled without a wake-up and a second
        call (two hand-offs to the database thread per round of acks are the largest
        share of a drain's CPU). The other users' acks still wake them; if the read
        fails, these too (their delivery retries as usual).
        """
        replies, served = yield from self._handle_batch(batch, deliverable)
        if not served:
            return replies, {}
        try:
            return replies, (yield from self.take_batches(served))
        except StoreError:
            self.events.extend(Wake("acked", uri) for uri in served)
            return replies, {}

    def _handle_batch(
        self, batch: Sequence[tuple[str, Frame | FrameError]], deliverable: Collection[str]
    ) -> Step[tuple[list[list[Frame]], list[str]]]:
        """The replies, and the users of ``deliverable`` who acked (not woken: see
        :meth:`handle_and_take`)."""
        replies: list[list[Frame]] = [[] for _ in batch]
        run: list[tuple[int, str, Pub]] = []
        for i, (uri, frame) in enumerate(batch):
            if isinstance(frame, Ack):
                # An ack's order against publishes is free, and it needs no store call.
                self._ack(uri, frame.upto)
                continue
            if isinstance(frame, FrameError):
                replies[i] = [_error(frame.req, frame.code, frame.message)]
                continue
            if isinstance(frame, Pub):
                run.append((i, uri, frame))
                continue
            if run:
                yield from self._pubs(run, replies)
                run = []
            replies[i] = yield from self._handle(uri, frame)
        if run:
            yield from self._pubs(run, replies)
        return replies, (yield from self._flush_due_acks(deliverable))

    def _pub(self, uri: str, frame: Pub) -> Step[Frame]:
        replies: list[list[Frame]] = [[]]
        yield from self._pubs([(0, uri, frame)], replies)
        return replies[0][0]

    def _pubs(self, run: list[tuple[int, str, Pub]], replies: list[list[Frame]]) -> Step[None]:
        """Store the publishes of ``run`` in one transaction; put each one's reply in
        ``replies`` at its index."""
        prepared: list[tuple[int, Pub, float, bool, PublishRequest]] = []
        for i, uri, frame in run:
            attrs_cbor = cbor2.dumps(dict(frame.attrs)) if frame.attrs else EMPTY_ATTRS
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
        if self._acks:
            yield from self._try_flush_acks(*sorted(self._acks.keys() & targets))
        try:
            results, written = yield from call(
                PublishMany(
                    [req for *_, req in prepared],
                    self.config.max_queue_depth,
                    self.config.overflow_policy,
                )
            )
        except StoreError as exc:
            self.health_events.append(StoreFailed("publish", exc))
            for i, frame, *_ in prepared:
                replies[i] = [_refused(frame.req, exc)]
            # The rows may be committed all the same (a connection lost after the server
            # committed); the publisher's retry is then a duplicate that queues and wakes
            # nothing. So the targets' links read the store again, and are woken now.
            for uri in targets:
                link = self._links.get(uri)
                if link is not None:
                    link.forget()
            self.events.extend(Wake("queued", target) for target in sorted(targets))
            return
        self.health_events.append(StoreSucceeded())
        woken: set[str] = set()
        expired_at: float | None = None
        # The queued events of the whole call go to the sink as one batch.
        queued_rows: list[Row] = []
        self._remember(written, results)
        for (i, frame, now, expired, _), result in zip(prepared, results, strict=True):
            for queued in result.queued:
                queued_rows.append((queued.uri, queued.nseq, queued.depth))
            if result.dropped:  # rare (overflow): the lines keep their order
                emit_rows(self.log, "notify_queued", _QUEUED_KEYS, queued_rows)
                queued_rows = []
            for dropped in result.dropped:
                self.missed_dropped(dropped.uri)
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
            # The publish is durable already; a failed delete is retried by the periodic
            # sweep.
            with contextlib.suppress(StoreError):
                yield from self.sweep(expired_at)
        self.events.extend([_new_tuple(Wake, ("queued", target)) for target in sorted(woken)])

    def _urgent_subs(self, targets: Sequence[tuple[str, int]]) -> frozenset[int]:
        """Targets whose subscription names a class that may use SMS."""
        if not self.sms_classes:
            return frozenset()
        found = set()
        for _, sub_id in targets:
            compiled = self.matcher.get(sub_id)
            if compiled is not None and compiled.qclass in self.sms_classes:
                found.add(sub_id)
        return frozenset(found)

    # ------------------------------------------------------------------ TTL sweep

    def sweep(self, now: float | None = None) -> Step[list[Subscription]]:
        """Delete subscriptions expired at ``now`` (default: the clock); the ones removed.

        Their queued notifications stay queued and are delivered.

        Raises:
            StoreError: the database failed; the matcher already ignores expired ones.
        """
        at = self.clock() if now is None else now
        # The periodic sweep is also when every user's queue is read again (the service
        # wakes them all after it): rows another process queued are found then, as
        # before the links knew their queues (see _Link.known).
        for link in self._links.values():
            link.forget()
        expired = yield from call(SweepExpired(at))
        for sub in expired:
            self.matcher.discard(sub.sub_id)
            self.log.emit("subscription_expired", sub.uri, reason=_describe(sub))
        return expired

    def prune(self, now: float | None = None) -> Step[int]:
        """Forget at most :data:`PRUNE_CHUNK` of the msg_ids published more than
        ``dedup_horizon`` before ``now`` (default: the clock), the oldest first; how many
        went (fewer than the chunk: none older are left). The service calls it after each
        sweep until a chunk comes back short, one worker call per chunk so that publishes
        and acks run between them.

        Raises:
            StoreError: the database failed; nothing was forgotten.
        """
        at = self.clock() if now is None else now
        return (yield from call(PrunePublished(at - self.config.dedup_horizon, PRUNE_CHUNK)))


def _describe(sub: Subscription) -> str:
    return f"sub_id={sub.sub_id} subject={sub.subject}"
