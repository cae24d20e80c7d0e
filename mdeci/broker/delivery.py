"""The broker core's delivery: each connected user's window of notifications in flight.

Theory of operation
-------------------
Delivery is pulled: for a CONNECTED user, :meth:`Delivery.take_batches` gives the next
encoded ``notify`` frames, in ``nseq`` order, at most ``window`` of them unacked at a
time. ``ack`` frees the window at once, but reaches the store later: acks are
cumulative, so the core keeps only each user's highest and deletes up to it once, when
the user's delivery next wakes (:meth:`Delivery.take_batches`), on (dis)connection, or
on :meth:`Delivery.flush_acks`. An agent acks every notify, and one store transaction
per ack dominates delivery; an ack not yet applied when the broker dies only makes it
send those notifications again, which the agent drops by nseq (acks are never fsync'd).
:meth:`Delivery.mark_connected` opens the window from the lowest queued (un-acked)
``nseq``; :meth:`Delivery.mark_disconnected` closes it. Whether a user is CONNECTED is
the Session Manager's (mdeci/broker/sessions.py): the service opens and closes the
window as it says.

A connected user's queue need not be read back: the rows this core's publishes just
wrote for it are handed on from memory while its link knows that nothing else waits
(``_Link.known``; anything that may change the queue behind it makes the next take read
the store, as does an SMS side, which removes rows: :meth:`Delivery.forget_rows`).

Sans-IO: the core holds no store, thread or socket. An entry point that needs the
store is a generator (:data:`Step`): it yields each store operation as a typed
:class:`StoreCommand`, is resumed with its result (or the :class:`~mdeci.errors.StoreError`
it raised, thrown in) and returns its answer. :class:`~mdeci.broker.glue.Broker` carries
the commands of one call out on the database thread in one hand-off; tests drive the
generators with scripted results. Who may make progress (``Wake``) is collected in
:attr:`Delivery.events` for the glue to hand to its :class:`QueueListener`.

:class:`~mdeci.broker.core.BrokerCore` is a :class:`Delivery`: it adds the frames
(subscriptions, publishes) that fill the queues this class drains.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection, Generator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Literal, NamedTuple, Protocol, TypeVar

from mdeci.broker.addresses import Address, addr_text
from mdeci.broker.config import BrokerCoreConfig
from mdeci.broker.network_holds import Gate, NetworkHolds
from mdeci.broker.sink import ChurnSink, NullSink, Row, emit_rows
from mdeci.errors import FrameError, StoreError
from mdeci.frames import NotifyEncoder, notify_bytes
from mdeci.store.queue_rows import DeliveryRow, PublishResult, RowClass, StoredRow, as_delivery
from rudp.fields import NO_ENTRIES

R = TypeVar("R")

# The fields of the churn rows of a delivered notification (sink.emit_rows).
_DELIVERED_KEYS = ("nseq", "latency_ms")
# Rows a connected user's link remembers ahead of its window at most (_Link.ahead); a
# user further behind is served from the store.
AHEAD_LIMIT = 64
# Builds a named tuple of the records below without its Python-level constructor (one
# per notification or woken user).
_new_tuple = tuple.__new__


class StoreCommand(Generic[R]):
    """A store operation a core asks the glue to carry out; ``R`` is its result."""

    __slots__ = ()


#: An entry point of the core: yields store commands, is sent each one's result (or
#: thrown its StoreError), returns the answer.
Step = Generator[StoreCommand[Any], Any, R]


def call(command: StoreCommand[R]) -> Step[R]:
    """``command``'s result, from whoever drives the step (``yield from call(...)``)."""
    result: R = yield command
    return result


@dataclass(frozen=True, slots=True)
class AckMany(StoreCommand[list[int]]):
    """Apply each ``(uri, upto)`` of ``held`` in one transaction."""

    held: Sequence[tuple[str, int]]


@dataclass(frozen=True, slots=True)
class PendingMany(StoreCommand[list[list[DeliveryRow]]]):
    """Read each ``(uri, after_nseq, limit)`` of ``reads``'s queued rows."""

    reads: Sequence[tuple[str, int, int]]


@dataclass(frozen=True, slots=True)
class MissedMany(StoreCommand[dict[str, int]]):
    """Those of ``uris`` with overflow drops not yet taken, and how many (a read)."""

    uris: Sequence[str]


@dataclass(frozen=True, slots=True)
class TakeMissed(StoreCommand[int]):
    """Take (and reset) ``uri``'s count of overflow drops."""

    uri: str


@dataclass(frozen=True, slots=True)
class RowClasses(StoreCommand[list[RowClass]]):
    """The class inputs of ``uri``'s queued rows ``nseqs`` (mdeci/store/row_classes.py)."""

    uri: str
    nseqs: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class CheckHeld(StoreCommand[frozenset[str]]):
    """Those of ``uris`` this broker no longer holds (another broker took them over):
    asked, when :attr:`Delivery.fenced`, before rows handed on from memory are sent (the
    glue reads the store's rows fenced already)."""

    uris: tuple[str, ...]


class Wake(NamedTuple):
    """``uri``'s delivery may make progress: something was ``queued`` for it, or it
    ``acked`` (a named tuple: one per woken user of a fan-out)."""

    kind: Literal["queued", "acked"]
    uri: str


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

    open: bool  # the window is open: the Session Manager says CONNECTED
    addr: Address | None  # the session's own tuple: logged as text, kept as it is
    # nseq -> published_at of notifications sent on this connection and not yet acked;
    # NO_ENTRIES (shared, read-only) while there are none: no dict per idle session.
    inflight: dict[int, float]
    # nseq -> size of the frame of each of ``inflight``, and their sum (window_bytes);
    # None while nothing was sent (no dict per idle session).
    sizes: dict[int, int] | None = None
    inflight_bytes: int = 0
    sent_upto: int = 0
    # The last read filled the window's room: more may wait in the store (see take_batch).
    backlog: bool = False
    # True while this core knows every row of the user's queue after ``sent_upto``: they
    # are ``ahead`` (None: none), queued by this core's publishes since a read of the
    # store found no more; take_batches then reads no store (a fan-out read back the
    # rows it had just written, every acking user's empty queue again). Anything else
    # that may change the queue (an overflow drop, a disconnection, a sweep, a side that
    # removes rows) clears it; the next read of the store sets it again.
    known: bool = False
    ahead: list[DeliveryRow] | None = None
    ahead_bytes: int = 0  # their payloads' and attrs' bytes (bounded: see _remember)
    # Something was sent below an nseq already in flight (a notification held for a
    # cheaper network, then released): ``inflight`` is not in nseq order.
    unordered: bool = False
    # Overflow drops may be queued that no notify reported yet (see _missed): so from the
    # connection on, as they may have happened while nobody was looking.
    missed: bool = True

    def forget(self) -> None:
        """The queue after ``sent_upto`` is no longer known: the next take reads it."""
        self.known, self.ahead, self.ahead_bytes = False, None, 0


class Delivery:
    """Each user's delivery window over the store's queues; see the module docstring.

    ``clock`` gives UTC epoch seconds (latencies). Not thread-safe, and needs no lock:
    one thread at a time drives it (the glue's).
    """

    def __init__(
        self,
        config: BrokerCoreConfig,
        clock: Callable[[], float],
        log: ChurnSink | None = None,
    ) -> None:
        self.config = config
        self.clock = clock
        self.log: ChurnSink = log if log is not None else NullSink()
        #: Users whose delivery may progress, in order, since the glue last took them.
        self.events: list[Wake] = []
        self._links: dict[str, _Link] = {}
        # nseq -> published_at of notifications sent on a user's earlier connections (their
        # ack may come after a reconnection, and is logged): only users with some.
        self._earlier: dict[str, dict[int, float]] = {}
        # missed counts taken from the store, by user and nseq, kept until acked: a notify
        # re-sent after a reconnection still carries its count.
        self._missed_at: dict[str, dict[int, int]] = {}
        # The highest ack of each user not yet applied to the store (see the docstring).
        self._acks: dict[str, int] = {}
        # Users whose held ack is applied at the end of the current batch (see _ack).
        self._acks_due: set[str] = set()
        # Users who acked in the current batch, in order: each is woken once (a Wake).
        self._acked: dict[str, None] = {}
        # Whether a connected user may be served the rows this core queued for it from
        # memory (_Link.ahead); False once something else may remove queued rows.
        self._remember_rows = True
        #: Whether what is about to be sent is checked with CheckHeld first (several
        #: brokers on one database: the glue's fence, mdeci/broker/fencing.py).
        self.fenced = False
        #: Notifications held for a cheaper network (docs/channels.md "Networks as
        #: channels"); None: every notification goes at once.
        self.holds: NetworkHolds | None = None
        # Per user with holds: the nseqs released from a hold and sent, not acked yet, and
        # the highest ack received (the store's ack stays below both: see _floor).
        self._released: dict[str, set[int]] = {}
        self._raw_acks: dict[str, int] = {}

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

    def queued_elsewhere(self, uri: str) -> None:
        """Another broker queued rows for ``uri``: its next take reads the store, and it
        is woken (a wake-up missed is repaired by the sweep, which forgets every link's
        rows: BrokerCore.sweep)."""
        link = self._links.get(uri)
        if link is not None:
            link.forget()
        self.events.append(Wake("queued", uri))

    def forget_rows(self) -> None:
        """From now on every delivery reads the store: something besides this core may
        remove queued rows (the SMS side, once a notification went by SMS), so the rows
        a publish queued cannot be handed on from memory (see _Link.known)."""
        self._remember_rows = False
        for link in self._links.values():
            link.forget()

    def _ack(self, uri: str, upto: int) -> None:
        if upto > self._acks.get(uri, 0):
            self._acks[uri] = upto
        released = self._released.get(uri)
        if released is not None:
            released.difference_update([n for n in released if n <= upto])
        link = self._links.get(uri)
        if link is not None:
            if upto > link.sent_upto:
                link.forget()  # acked what was not sent: its rows ahead may be gone
            now = self.clock()
            earlier = self._earlier.get(uri)
            if earlier or link.unordered:
                acked = sorted(n for n in {*link.inflight, *(earlier or ())} if n <= upto)
            else:
                # The common case, without a set and a sort per ack: ``inflight`` gets
                # its nseqs in increasing order (take_batches), so those acked lead it.
                acked = []
                for n in link.inflight:
                    if n > upto:
                        break
                    acked.append(n)
            delivered: list[Row] = []  # one batch for the sink
            sizes = link.sizes or {}
            inflight = link.inflight
            freed = 0
            if earlier:
                for nseq in acked:
                    published_at = earlier.pop(nseq, 0.0)
                    published_at = inflight.pop(nseq, published_at)
                    freed += sizes.pop(nseq, 0)
                    delivered.append((uri, nseq, max(0.0, (now - published_at) * 1000.0)))
                if not earlier:
                    del self._earlier[uri]
            else:  # the same without a lookup in the empty ``earlier`` per notification
                for nseq in acked:
                    latency = (now - inflight.pop(nseq)) * 1000.0
                    freed += sizes.pop(nseq, 0)
                    delivered.append((uri, nseq, latency if latency > 0.0 else 0.0))
            link.inflight_bytes -= freed
            emit_rows(self.log, "notify_delivered", _DELIVERED_KEYS, delivered)
            link.sent_upto = max(link.sent_upto, upto)
            if not link.inflight and link.sizes is not None:
                link.inflight, link.sizes = NO_ENTRIES, None  # idle again: no dicts
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

    def flush_acks(self, uri: str | None = None) -> Step[None]:
        """Apply the held acks of ``uri`` (every user if None) to the store.

        Raises:
            StoreError: the database failed; the acks stay held for the next call.
        """
        yield from self._apply_acks([uri] if uri is not None else sorted(self._acks))

    def _apply_acks(self, uris: Sequence[str]) -> Step[None]:
        """The held acks of ``uris`` in one transaction (raises :class:`StoreError`)."""
        held = [(user, self._acks[user]) for user in uris if user in self._acks]
        if not held:
            return
        if self.holds is not None and (self._raw_acks or self._released or self.holds.any_held()):
            held = self._floored(held)
        if held:
            yield from call(AckMany(held))
        for user, upto in held:
            # An ack that arrived meanwhile cannot be lower (nothing runs in between),
            # but keep the rule "only ever forget what was applied" explicit.
            if self._acks.get(user) == upto:
                del self._acks[user]

    def _floored(self, acks: list[tuple[str, int]]) -> list[tuple[str, int]]:
        """``acks`` kept below each user's lowest held or released-and-unacked nseq:
        the agent's ack is cumulative over what it received, and those it has not. The
        part above is kept (``_raw_acks``) and applied once nothing is below it."""
        out = []
        for user, upto in acks:
            upto = max(upto, self._raw_acks.pop(user, 0))
            floor = self._floor(user)
            if floor is not None and upto >= floor:
                self._raw_acks[user] = upto
                del self._acks[user]
                upto = floor - 1
            if upto > 0:
                out.append((user, upto))
        return out

    def _floor(self, uri: str) -> int | None:
        holds = self.holds
        low = holds.lowest(uri) if holds is not None else None
        released = self._released.get(uri)
        if released:
            least = min(released)
            low = least if low is None else min(low, least)
        return low

    def release(self, uri: str, nseqs: Sequence[int]) -> None:
        """Send ``uri``'s held notifications ``nseqs`` now (a cheaper network came, or
        their deadline): the next take reads the store again from the lowest of them."""
        if not nseqs:
            return
        self._released.setdefault(uri, set()).update(nseqs)
        raw = self._raw_acks.pop(uri, None)
        if raw is not None:  # applied again, below what is now the floor
            self._acks[uri] = max(self._acks.get(uri, 0), raw)
        link = self._links.get(uri)
        if link is not None and link.open:
            link.sent_upto = min(link.sent_upto, min(nseqs) - 1)
            link.unordered = True
            link.forget()
        self.events.append(Wake("acked", uri))

    def release_due(self) -> None:
        """Release what a deadline lets go (the glue calls it on a timer)."""
        if self.holds is None:
            return
        for uri, nseqs in self.holds.due().items():
            self.release(uri, nseqs)

    def _try_flush_acks(self, *uris: str) -> Step[None]:
        # Held acks only repeat work if left unapplied: never fail a caller over them.
        if not self._acks:
            return
        with contextlib.suppress(StoreError):
            yield from self._apply_acks(uris)

    def _flush_due_acks(self, served: Collection[str] = frozenset()) -> Step[list[str]]:
        """Wake who acked in this batch, except the users of ``served`` (returned: the
        caller refills their window itself), and apply the held acks that are due."""
        held_back: list[str] = []
        if self._acked:
            acked, self._acked = self._acked, {}
            events = self.events
            for uri in acked:
                if uri in served:
                    held_back.append(uri)
                else:
                    events.append(_new_tuple(Wake, ("acked", uri)))
        if self._acks_due:
            due, self._acks_due = self._acks_due, set()
            yield from self._try_flush_acks(*sorted(due))
        return held_back

    # ------------------------------------------------------------------ sessions

    def in_flight(self, uri: str) -> tuple[int, ...]:
        """The nseqs sent to ``uri`` on this connection and not yet acked, in order."""
        return tuple(sorted(link.inflight)) if (link := self._links.get(uri)) else ()

    def mark_connected(self, uri: str, addr: Address | None = None) -> Step[None]:
        """``uri``'s media is CONNECTED (INVITE or re-INVITE done): open its delivery
        window, empty, from the lowest queued nseq again (the status is the Session Manager's)."""
        yield from self._try_flush_acks(uri)  # the stream restarts from the lowest queued nseq
        previous = self._links.get(uri)
        if previous is not None and previous.inflight:
            self._earlier[uri] = {**self._earlier.get(uri, {}), **previous.inflight}
        self._links[uri] = _Link(open=True, addr=addr, inflight=NO_ENTRIES)
        self._log_connected(uri, addr, None if previous is None else previous.addr)

    def mark_moved(self, uri: str, addr: Address) -> bool:
        """``uri``'s re-INVITE moved its media to ``addr`` on the same association while
        CONNECTED: delivery carries on (the transport resends what is in flight there),
        nothing is sent twice; only the address and the churn log (``media_connected``
        with ``prev_addr``) change. False, changing nothing, when not CONNECTED."""
        link = self._links.get(uri)
        if link is None or not link.open:
            return False
        prev_addr, link.addr = link.addr, addr
        self._log_connected(uri, addr, prev_addr)
        return True

    def _log_connected(self, uri: str, addr: Address | None, prev: Address | None) -> None:
        text, prev_text = (None if a is None else addr_text(a) for a in (addr, prev))
        self.log.emit("media_connected", uri, addr=text, prev_addr=prev_text, channel="ip")

    def delivered_elsewhere(self, uri: str, nseq: int) -> None:
        """``uri``'s notification ``nseq`` was delivered, and logged, by another channel
        (SMS): if it was also sent over IP, a later ack covering it is not a second
        delivery (it was logged twice, and the analytics counted it twice)."""
        link = self._links.get(uri)
        if link is not None:
            link.inflight.pop(nseq, None)
            if link.sizes is not None:
                link.inflight_bytes -= link.sizes.pop(nseq, 0)
            earlier = self._earlier.get(uri, {})
            if earlier.pop(nseq, None) is not None and not earlier:
                del self._earlier[uri]
        if self.holds is not None:
            self.holds.drop(uri, nseq)
            self._released.get(uri, set()).discard(nseq)

    def mark_disconnected(self, uri: str, reason: str) -> Step[None]:
        """``uri``'s media stopped answering (or the dialog ended): close its window;
        what was sent and not acked goes again after the next :meth:`mark_connected`. The
        Session Manager writes the status before this call (the event finds it stored)."""
        yield from self._try_flush_acks(uri)  # the SMS fallback reads the queue next
        link = self._links.get(uri)
        was_connected = link is not None and link.open
        if link is not None:
            link.open = False
            if link.inflight:
                self._earlier[uri] = {**self._earlier.get(uri, {}), **link.inflight}
            link.inflight = NO_ENTRIES
            link.sizes = None
            link.inflight_bytes = 0
            link.sent_upto = 0
            link.forget()
        if was_connected:
            addr = None if link is None or link.addr is None else addr_text(link.addr)
            self.log.emit("media_disconnected", uri, addr=addr, channel="ip", reason=reason)

    # ------------------------------------------------------------------ delivery

    def take_batches(self, uris: Sequence[str]) -> Step[dict[str, list[OutgoingNotify]]]:
        """The next notify frames of each of ``uris``, in nseq order, as many as each
        window allows (none unless CONNECTED), in flight until acked. Their held acks are
        applied in one transaction, their queues read on one connection (a fan-out wakes
        every subscriber together). Users with nothing to send are left out.

        Raises:
            StoreError: the database failed; nothing was taken. (If only the ``missed``
            count of one user cannot be read, that user alone is left out, unchanged,
            and the error raised after the others were taken only if it is the only one.)
        """
        plan: list[tuple[str, _Link, int]] = []
        for uri in uris:
            link = self._links.get(uri)
            if link is None or not link.open:
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
        yield from self._try_flush_acks(*sorted(uri for uri, _, _ in plan))
        # Only the users whose queue this core does not know are read (see _Link.known).
        unknown = [(uri, link.sent_upto, room) for uri, link, room in plan if not link.known]
        reads = iter((yield from call(PendingMany(unknown))) if unknown else ())
        taken: dict[str, list[OutgoingNotify]] = {}
        error: StoreError | None = None
        # For this batch: a fan-out's rows share their publications' items; one user's
        # rows (a drain) share nothing worth a key per row.
        encoder = NotifyEncoder(share=len(plan) > 1)
        encode_row = encoder.encode
        rows_of: list[Sequence[DeliveryRow]] = []
        for _, link, room in plan:
            if not link.known:
                rows_of.append(next(reads))
            elif link.ahead is not None:
                rows_of.append(link.ahead[:room])
            else:
                rows_of.append(())  # known: nothing waits
        if self.fenced:
            # Rows read from the store were read fenced (PendingMany); those from memory
            # are checked now.
            sending = tuple(
                uri
                for (uri, link, _), rows in zip(plan, rows_of, strict=True)
                if rows and link.known
            )
            lost = (yield from call(CheckHeld(sending))) if sending else frozenset()
            if lost:
                # Not ours to send: the Session Manager drops them (the fence told it).
                rows_of = [() if p[0] in lost else r for p, r in zip(plan, rows_of, strict=True)]
        yield from self._missed_none(
            [(uri, link) for (uri, link, _), rows in zip(plan, rows_of, strict=True) if rows]
        )
        holds = self.holds
        for (uri, link, room), rows in zip(plan, rows_of, strict=True):
            ahead = link.ahead
            gate: Gate | None = None
            if holds is not None and ((rows and holds.may_hold(uri)) or uri in self._released):
                try:
                    gate = yield from self._gate(uri, link, rows)
                except StoreError as exc:
                    error = exc
                    continue
            if rows and link.missed:
                try:
                    # The only other store call; made before this user's state changes
                    # so that a StoreError leaves its link as it was.
                    yield from self._missed(uri, link, rows[0][0])
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
                if gate is not None and gate.skip(row):
                    link.sent_upto = max(link.sent_upto, nseq)
                    continue
                data = encode_row(row, known.get(nseq, 0) if known else 0)
                if data is None:
                    data = self._encode_notify(uri, row, known)
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
                if inflight is NO_ENTRIES:
                    inflight = link.inflight = {}
                inflight[nseq] = row[7]  # published_at
                sizes[nseq] = size
                out.append(_new_tuple(OutgoingNotify, (nseq, data)))
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
            if gate is not None and gate.overdue:
                self.release(uri, gate.overdue)
        if error is not None and len(plan) == 1:
            raise error
        return taken

    def _gate(self, uri: str, link: _Link, rows: Sequence[DeliveryRow]) -> Step[Gate]:
        """What of ``rows`` the network decision keeps back (see :class:`Gate`)."""
        holds = self.holds
        assert holds is not None
        acked = self._raw_acks.get(uri, 0)
        gate = Gate.prepare(holds, uri, link.inflight, rows, self._released, acked)
        if gate.fresh and holds.may_hold(uri):
            gate.classify((yield from call(RowClasses(uri, gate.fresh))))
        return gate

    def _missed_none(self, links: list[tuple[str, _Link]]) -> Step[None]:
        """Of ``links``, those whose missed count is to be taken (see _missed) and is 0 in
        the store are no longer pending: one read for all, not a ``take_missed`` each (a
        hundred users connect, then a fan-out); if it fails, each takes its own."""
        pending = [(uri, link) for uri, link in links if link.missed]
        if len(pending) < 2:
            return
        try:
            counted = yield from call(MissedMany([uri for uri, _ in pending]))
        except StoreError:
            return
        for uri, link in pending:
            if uri not in counted:
                link.missed = False

    def missed_dropped(self, uri: str) -> None:
        """An overflow dropped a row of ``uri``: its next notify reports it (_Link.missed)."""
        link = self._links.get(uri)
        if link is not None:
            link.missed = True

    def _missed(self, uri: str, link: _Link, nseq: int) -> Step[int]:
        known = self._missed_at.setdefault(uri, {})
        if nseq in known:
            return known[nseq]
        if not link.missed:
            return 0
        count = yield from call(TakeMissed(uri))
        link.missed = False
        if count:
            known[nseq] = count
        return count

    def _encode_notify(
        self, uri: str, row: DeliveryRow, known: dict[int, int] | None
    ) -> bytes | None:
        # ``known``: the user's remembered missed counts. take_batches took the store's
        # count before its first row, so no other count waits in the store.
        try:
            return notify_bytes(row, known.get(row[0], 0) if known else 0)
        except FrameError as exc:
            # Only a row written by something else than _pub can get here; skipping it
            # keeps the user's stream moving (the agent's ack removes it later).
            self.log.emit("notify_dropped", uri, nseq=row[0], reason=f"unsendable: {exc}")
            return None
