"""The sans-IO half of an endpoint serving many peers on one socket: which peer a datagram
is for, and what each peer makes of its connection's events.

:class:`EndpointCore` holds the peers by connection id (derived from each one's session
key; an address never names a peer) and routes each datagram received to one of them, or
counts why it went nowhere; it keeps the peers' deadlines (a heap for the near ones, a
wheel of seconds for the far ones) under the one timer the adapter sets for the
earliest. :class:`PeerCore` is one peer: its connection, the waiters its sends left
(``rudp.waiters``) and the owner's callbacks; it turns events into waiter results,
deliveries and callbacks. Neither reads a clock, a socket or a random source: the
adapter (``rudp.aio``) gives the time through :meth:`PeerCore._now` and the sender id at
creation, and does what the hooks ask (send datagrams, set the timer, flush at the end
of the loop's turn, keep a message for a reader, complete waiters).
"""

from __future__ import annotations

import heapq
import logging
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from rudp import packet as wire
from rudp.config import RudpConfig
from rudp.connection import RudpConnection, derive_connection_id
from rudp.errors import PacketError, PeerUnreachable
from rudp.events import (
    MessageAcked,
    MessageFailed,
    MessageReceived,
    PathChallenged,
    PathValidated,
    PeerDisconnected,
    PeerRestarted,
    RudpStats,
)
from rudp.path import Address
from rudp.sparse import Sparse
from rudp.waiters import Waiters

log = logging.getLogger("rudp")
_NO_ACK = "no ACK after retries"  # why a message failed
# Seconds ahead from which a deadline waits in the endpoint's wheel rather than its heap
# (see EndpointCore): past an RTO and an ACK delay, short of a keepalive.
WHEEL_AFTER = 2.0

H = TypeVar("H")  # the adapter's waiter handle (an asyncio future)


class PeerCore(Generic[H]):
    """One peer of an endpoint, identified by its session key (never by its address).

    Messages go to :meth:`_deliver` (the adapter's inbox), or, once :attr:`on_message`
    is set, to that callback, in order: a server holding thousands of peers needs no
    reader per peer. The adapter implements the hooks at the end.
    """

    __slots__ = (
        "_closed", "_flush_soon", "_timer_at", "_waiters", "_written", "connection", "sparse",
    )  # fmt: skip

    # The owner's callbacks (unset: None), kept in ``sparse``: a server holding a peer
    # per session overrides the report hooks instead and sets none.
    #: Called when the association fails (DISCONNECTED), with the error.
    on_disconnected: Sparse[Callable[[PeerUnreachable], None] | None] = Sparse(None)
    #: Called after on_disconnected when messages failed with the association (not
    #: for a keepalive alone), with the error their waiters got: a writer without
    #: waiters (write, write_many) hears of its loss here.
    on_failed: Sparse[Callable[[PeerUnreachable], None] | None] = Sparse(None)
    #: Called for every authenticated datagram: lets the owner see a peer it gave up
    #: on talking again, before any message arrives.
    on_heard: Sparse[Callable[[], None] | None] = Sparse(None)
    #: Called with each message received, in order, instead of :meth:`_deliver`
    #: (what was delivered before it was set stays where it went).
    on_message: Sparse[Callable[[bytes], None] | None] = Sparse(None)
    #: Called with the new address and the one before it when the remote end's new
    #: path is validated (a NAT rebinding, a move): datagrams go there from now on.
    on_path_changed: Sparse[Callable[[Address, Address | None], None] | None] = Sparse(None)
    #: Called while DISCONNECTED when a new incarnation of the remote end speaks under
    #: our key (rudp.events.PeerRestarted): the owner may start a new association.
    on_restarted: Sparse[Callable[[], None] | None] = Sparse(None)

    def __init__(
        self,
        key: bytes,
        addr: Address,
        config: RudpConfig,
        protection: wire.Protection,
        sender_id: int,
    ) -> None:
        self.connection = RudpConnection(
            key, config, sender_id=sender_id, protection=protection, peer_address=addr
        )
        self.sparse: dict[str, Any] | None = None  # the callbacks set
        # What each send and drain waits for (built by the first, dropped once nothing
        # waits: an idle peer has none); the last id written without a waiter.
        self._waiters: Waiters[H] | None = None
        self._written = -1
        self._timer_at: float | None = None  # when the adapter's timer is set to fire
        self._flush_soon = False  # a flush is due at the end of this turn (_flush_later)
        self._closed = False

    def __lt__(self, other: PeerCore[H]) -> bool:
        # Orders peers due at the same time in the endpoint's timer heap (any order does).
        return id(self) < id(other)

    def _waiting(self) -> Waiters[H]:
        """The waiters, built on the first send or drain that waits."""
        if self._waiters is None:
            self._waiters = Waiters()
        return self._waiters

    @property
    def addr(self) -> Address:
        """Where datagrams go: the address given, or the last validated path."""
        addr = self.connection.peer_address
        assert addr is not None  # given to the connection at creation
        return addr

    @property
    def key(self) -> bytes:
        """The session key (the connection's: a server holds a peer per session)."""
        return self.connection.key

    @property
    def path_changes(self) -> int:
        return self.connection.path_changes

    @property
    def connected(self) -> bool:
        return self.connection.connected

    @property
    def stats(self) -> RudpStats:
        return self.connection.stats

    def set_address(self, addr: Address) -> None:
        """Send to ``addr`` from now on (e.g. a re-INVITE carried a new media address)."""
        self.connection.set_peer_address(addr, self._now())
        self._pump()

    def path_changed(self) -> None:
        """Our own address changed: resend what is in flight from the new one at once."""
        self.connection.path_changed(self._now())
        self._pump()

    def reset(self) -> None:
        """After DISCONNECTED: forget the failed state so sending works again."""
        self.connection.reset(self._now())
        self._pump()

    def announce(self) -> None:
        """Send a PING now (``RudpConnection.announce``)."""
        self.connection.announce()
        self._pump()

    def write(self, message: bytes) -> None:
        """Queue one message without a waiter (a stream's ``write``); a drain waits for
        everything written. Raises PeerUnreachable, MessageTooLarge."""
        self._written = self._queue(message)

    def write_many(self, messages: Sequence[bytes]) -> None:
        """:meth:`write` for each of ``messages``, in order, all or none (see
        :meth:`_queue_many`): a sender that learns of a failure from
        :attr:`on_disconnected` needs no waiter per send."""
        self._written = self._queue_many(messages)[-1]

    def _queue(self, message: bytes) -> int:
        """Queue ``message`` to go out at the end of this turn; its id. Raises
        PeerUnreachable (closed, DISCONNECTED) and MessageTooLarge."""
        if self._closed:
            raise PeerUnreachable("endpoint closed", message)
        message_id = self.connection.send_message(message, self._now())
        self._flush_later()  # sends of one turn leave together
        return message_id

    def _queue_many(self, messages: Sequence[bytes]) -> list[int]:
        """:meth:`_queue` for each of ``messages``, all or none (``send_messages``); the
        ids. Raises ValueError for none, PeerUnreachable, MessageTooLarge."""
        if not messages:
            raise ValueError("send_many_nowait needs at least one message")
        if self._closed:
            raise PeerUnreachable("endpoint closed", messages[0])
        ids = self.connection.send_messages(messages, self._now())
        self._flush_later()
        return ids

    def _drain_waits(self) -> bool:
        """Whether a message written is still unacknowledged (a drain has to wait)."""
        return self._written >= 0 and self.connection.is_pending(self._written)

    def _feed(self, data: bytes, source: Address) -> None:
        """Take one datagram; its events are handled now, its answers at the next flush."""
        heard = self.connection.receive_datagram(data, self._now(), source)
        if heard:
            self._report_heard()
        if not self._closed:
            self._events()

    def _pump(self) -> None:
        """Handle the events and write out what is due, now (after a command)."""
        if not self._closed:
            self._events()
            self._flush()

    def _flush(self) -> None:
        """Write out what the connection has to send; move the timer if it is due sooner."""
        self._flush_soon = False
        if self._closed:
            return
        connection, now = self.connection, self._now()
        challenge = connection.path_challenge_to_send(now)
        if challenge is not None:
            self._transmit([challenge[0]], challenge[1])  # to the candidate path only
        datagrams = connection.datagrams_to_send(now)
        if datagrams:
            self._transmit(datagrams, self.addr)
        self._events()
        when = connection.get_timer()
        # Only an earlier deadline moves the timer: one that fires early finds nothing due
        # and re-arms (deadlines move later on nearly every ACK; a new timer each is dearer).
        if when is not None and (self._timer_at is None or when < self._timer_at):
            self._timer_at = when
            self._arm(when)

    def _timer_fired(self) -> None:
        """The timer :meth:`_arm` set went off."""
        self._timer_at = None
        self.connection.handle_timer(self._now())
        self._pump()

    def _events(self) -> None:
        """Turn the connection's events into waiter results, deliveries and callbacks."""
        while (event := self.connection.next_event()) is not None:
            if isinstance(event, MessageReceived):
                self._report_message(event.data)
            elif isinstance(event, MessageAcked) and self._waiters is not None:
                done = self._waiters.acked(event.last)
                if not self._waiters:
                    self._waiters = None  # nothing waits: an idle peer keeps none
                if done:
                    self._complete(done, None)
            elif isinstance(event, MessageFailed):
                error = PeerUnreachable(_NO_ACK, event.data)
                if self._waiters is not None:
                    self._complete(self._waiters.failed(event.message_id), error)
            elif isinstance(event, PathChallenged):
                log.info("rudp peer %016x: validating new path %s (was %s)",
                         self.connection.cid, event.address, event.current)  # fmt: skip
            elif isinstance(event, PathValidated):
                log.info("rudp peer %016x: path %s validated; moved from %s",
                         self.connection.cid, event.address, event.previous)  # fmt: skip
                self._report_path(event.address, event.previous)
            elif isinstance(event, PeerDisconnected):
                if self.on_disconnected is not None:
                    self.on_disconnected(PeerUnreachable(f"{event.failed} messages failed"))
                if event.failed:
                    self._report_failed(PeerUnreachable(_NO_ACK))
            elif isinstance(event, PeerRestarted) and self.on_restarted is not None:
                self.on_restarted()

    # ------------------------------------------------------------ what the owner hears
    # The callbacks by default. A server holding a peer per session overrides these in a
    # subclass instead: four bound methods per peer cost it ~256 bytes per session.

    def _report_message(self, data: bytes) -> None:
        if self.on_message is not None:
            self.on_message(data)
        else:
            self._deliver(data)

    def _report_heard(self) -> None:
        if self.on_heard is not None:
            self.on_heard()

    def _report_path(self, addr: Address, previous: Address | None) -> None:
        if self.on_path_changed is not None:
            self.on_path_changed(addr, previous)

    def _report_failed(self, error: PeerUnreachable) -> None:
        if self.on_failed is not None:
            self.on_failed(error)

    def _close(self) -> None:
        """Stop: every waiter fails with PeerUnreachable, sends are refused."""
        self._closed = True
        if self._waiters is not None:
            self._complete(self._waiters.close(), PeerUnreachable("endpoint closed"))

    # ---------------------------------------------------------------- the adapter's hooks

    def _now(self) -> float:
        """The adapter's clock (monotonic seconds)."""
        raise NotImplementedError

    def _flush_later(self) -> None:
        """Call :meth:`_flush` at the end of this turn of the adapter's loop (once, while
        ``_flush_soon`` is set)."""
        raise NotImplementedError

    def _transmit(self, datagrams: list[bytes], addr: Address) -> None:
        """Send ``datagrams`` to ``addr``, in order."""
        raise NotImplementedError

    def _arm(self, when: float) -> None:
        """Call :meth:`_timer_fired` at ``when`` instead of at the time set before (the
        endpoint's :meth:`EndpointCore._arm_peer`)."""
        raise NotImplementedError

    def _deliver(self, data: bytes) -> None:
        """Keep a message received for the owner's next read."""
        raise NotImplementedError

    def _complete(self, handles: Sequence[H], error: PeerUnreachable | None) -> None:
        """Complete ``handles``: with ``error``, or as acknowledged when it is None."""
        raise NotImplementedError


P = TypeVar("P", bound="PeerCore[Any]")


@dataclass(slots=True)
class EndpointStats:
    """Datagrams the endpoint dropped before any connection saw them."""

    datagrams_received: int = 0
    unknown_cid: int = 0
    malformed: int = 0
    dropped_incoming: int = 0  # while ``EndpointCore.drop_incoming`` was set


class EndpointCore(Generic[P]):
    """The peers of one socket by connection id, and the routing of what it receives."""

    def __init__(self) -> None:
        self.stats = EndpointStats()
        self._peers: dict[int, P] = {}
        #: Test and diagnostic knob: while true, every datagram received is dropped
        #: (counted in ``stats.dropped_incoming``) as if the path towards this endpoint
        #: had failed; sends are unaffected. Cuts a device's IP path without netem.
        self.drop_incoming = False
        self._flushes: list[P] = []  # peers that sent this turn (see _flush_later)
        # Every peer's next deadline, under one adapter timer set for the earliest: a
        # timer handle per peer costs ~240 bytes, and a broker holds a peer per session.
        # An entry whose peer moved its deadline since is dropped when it comes up.
        self._timers: list[tuple[float, P]] = []  # the near deadlines, a heap
        # The far ones (an idle peer's keepalive: most of a broker's peers) by the whole
        # second they fall in, a list slot each instead of a heap tuple (~64 bytes). A
        # second's peers move into the heap when it begins: each fires at its deadline.
        self._wheel: dict[int, list[P]] = {}
        self._wheel_first: float = math.inf  # the wheel's earliest second
        self._timer_when = math.inf  # when the adapter's timer is set to fire

    def _peer(self, key: bytes, make: Callable[[], P]) -> P:
        """The peer for ``key``, made by ``make`` on first use."""
        cid = derive_connection_id(key)
        existing = self._peers.get(cid)
        if existing is not None:
            return existing
        peer = make()
        # Keyed by the connection's own cid: an equal int of our own would be 36 bytes more.
        self._peers[peer.connection.cid] = peer
        return peer

    def remove_peer(self, key: bytes) -> None:
        """Forget a peer; its pending sends fail with PeerUnreachable."""
        peer = self._peers.pop(derive_connection_id(key), None)
        if peer is not None:
            peer._close()

    def _close_peers(self) -> None:
        """Forget every peer (:meth:`remove_peer` each)."""
        for peer in self._peers.values():
            peer._close()
        self._peers.clear()

    def _moved(self) -> None:
        """Our own address changed: every peer resends what it has in flight at once."""
        for peer in self._peers.values():
            peer.path_changed()

    def _flush_later(self, peer: P) -> None:
        """Flush ``peer`` at the end of this turn of the adapter's loop, with every other
        peer that sent in it: one callback for them all (one per peer and turn was a
        visible share of a fan-out's CPU)."""
        if not self._flushes:
            self._at_turn_end(self._flush_due)
        self._flushes.append(peer)

    def _flush_due(self) -> None:
        due, self._flushes = self._flushes, []
        for i, peer in enumerate(due):
            try:
                peer._flush()
            except Exception:  # the adapter's loop reports it; the peers after it still go
                self._flushes[:0] = due[i + 1 :]
                self._at_turn_end(self._flush_due)
                raise

    def _arm_peer(self, peer: P, when: float) -> None:
        """Call ``peer._timer_fired`` at ``when`` (its ``_timer_at``)."""
        if when - peer._now() < WHEEL_AFTER:
            heapq.heappush(self._timers, (when, peer))
        else:
            second = math.floor(when)
            bucket = self._wheel.get(second)
            if bucket is not None:
                bucket.append(peer)
                return  # the timer is set for this second already, or sooner
            self._wheel[second] = [peer]
            self._wheel_first = min(self._wheel_first, second)
            when = second  # the adapter wakes when the second begins
        if when < self._timer_when:
            self._timer_when = when
            self._set_timer(when)

    def _wheel_due(self, limit: float) -> None:
        """Move the peers of the wheel's seconds begun by ``limit`` into the heap (those
        whose deadline is still in their second: a later one has its own entry)."""
        while self._wheel_first <= limit:
            second = int(self._wheel_first)
            for peer in self._wheel.pop(second):
                at = peer._timer_at
                if at is not None and at < second + 1 and not peer._closed:
                    heapq.heappush(self._timers, (at, peer))
            self._wheel_first = min(self._wheel, default=math.inf)

    def _timers_due(self, now: float) -> None:
        """The adapter's timer went off at ``now``: fire every peer whose deadline came
        (what was due at the time set counts as due: a loop may run a timer a little
        early), then set the timer for the next deadline."""
        limit = max(self._timer_when, now)
        self._timer_when = math.inf
        self._wheel_due(limit)
        timers, due = self._timers, []
        while timers and timers[0][0] <= limit:
            due.append(heapq.heappop(timers))
        for i, (when, peer) in enumerate(due):
            if peer._timer_at != when or peer._closed:
                continue  # moved since, or closed
            try:
                peer._timer_fired()
            except Exception:  # the adapter's loop reports it; the peers after it still go
                for entry in due[i + 1 :]:
                    heapq.heappush(timers, entry)
                self._timer_when = now
                self._set_timer(now)
                raise
        when = min(timers[0][0] if timers else math.inf, self._wheel_first)
        if when < self._timer_when:
            self._timer_when = when
            self._set_timer(when)

    def _set_timer(self, when: float) -> None:
        """The adapter's hook: call :meth:`_timers_due` at ``when`` instead of at the time
        set before."""
        raise NotImplementedError

    def _at_turn_end(self, flush: Callable[[], None]) -> None:
        """The adapter's hook: call ``flush`` at the end of this turn of its loop."""
        raise NotImplementedError

    def feed(self, datagrams: Iterable[tuple[bytes, Address]]) -> Iterable[P]:
        """Feed each datagram, with its source, to its peer; the peers that got one, each
        once, to be flushed after the whole batch (one ACK per batch, not per datagram)."""
        touched: dict[int, P] = {}
        for datagram, source in datagrams:
            peer = self.route(datagram)
            if peer is not None:
                peer._feed(datagram, source)
                touched[id(peer)] = peer
        return touched.values()

    def route(self, data: bytes) -> P | None:
        """The peer ``data`` is for, or None (counted in :attr:`stats`)."""
        self.stats.datagrams_received += 1
        if self.drop_incoming:
            self.stats.dropped_incoming += 1
            return None
        try:
            cid = wire.peek_cid(data)
        except PacketError:
            self.stats.malformed += 1
            return None
        peer = self._peers.get(cid)
        if peer is None:
            self.stats.unknown_cid += 1
        return peer
