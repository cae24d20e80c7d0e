"""The endpoint's sans-IO core (rudp.endpoint): routing by connection id, one answer per
batch, waiters completed by ACKs and failures, the timer, closing, and the paths datagrams
take. Two endpoints wired by hand on a hand-stepped clock: no sockets, no event loop."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rudp import PeerUnreachable, RudpConfig
from rudp import packet as wire
from rudp.endpoint import EndpointCore, EndpointStats, PeerCore
from rudp.path import Address

KEY = bytes(range(32))
OTHER = b"o" * 32
FAST = RudpConfig(rto_initial=0.1, rto_min=0.05, max_retries=1, keepalive_interval=0)
A: Address = ("192.0.2.1", 4000)  # where a sends from
A2: Address = ("198.51.100.7", 4001)  # where a moves to
SPOOF: Address = ("203.0.113.9", 666)
B: Address = ("192.0.2.2", 5000)


class Peer(PeerCore[str]):
    """A peer on a hand-stepped clock; what the hooks are asked to do is recorded."""

    __slots__ = ("armed", "completed", "delivered", "flushes_due", "sent", "time")

    def __init__(self, key: bytes, addr: Address, sender_id: int) -> None:
        super().__init__(key, addr, FAST, wire.Protection.AEAD, sender_id)
        self.time = 0.0
        self.sent: list[tuple[bytes, Address]] = []
        self.armed: list[float] = []
        self.delivered: list[bytes] = []
        self.completed: list[tuple[str, str | None]] = []
        self.flushes_due = 0

    def _now(self) -> float:
        return self.time

    def _flush_later(self) -> None:
        if not self._flush_soon:
            self._flush_soon = True
            self.flushes_due += 1

    def _transmit(self, datagrams: list[bytes], addr: Address) -> None:
        self.sent += [(datagram, addr) for datagram in datagrams]

    def _arm(self, when: float) -> None:
        self.armed.append(when)

    def _deliver(self, data: bytes) -> None:
        self.delivered.append(data)

    def _complete(self, handles: Sequence[str], error: PeerUnreachable | None) -> None:
        self.completed += [(h, None if error is None else str(error)) for h in handles]


def _pair() -> tuple[EndpointCore[Peer], Peer, EndpointCore[Peer], Peer]:
    a: EndpointCore[Peer] = EndpointCore()
    b: EndpointCore[Peer] = EndpointCore()
    return a, a._peer(KEY, lambda: Peer(KEY, B, 1)), b, b._peer(KEY, lambda: Peer(KEY, A, 2))


def _carry(sender: Peer, to: EndpointCore[Peer], source: Address) -> list[Peer]:
    """What ``sender`` sent, delivered to ``to`` as one batch from ``source``; the peers
    that got some are flushed, as the adapter does after a batch."""
    batch = [(datagram, source) for datagram, _ in sender.sent]
    sender.sent.clear()
    touched = list(to.feed(batch))
    for peer in touched:
        peer._flush()
    return touched


def _fire(peer: Peer) -> None:
    peer.time = peer.armed[-1]
    peer._timer_fired()


def test_a_datagram_goes_to_the_peer_of_its_connection_id_or_is_counted() -> None:
    a, pa, b, pb = _pair()
    assert a._peer(KEY, lambda: Peer(KEY, SPOOF, 9)) is pa  # the key names it, not the address
    stranger = a._peer(OTHER, lambda: Peer(OTHER, B, 3))  # a key b does not know
    pa.write(b"for b")
    stranger.write(b"for nobody")
    pa._flush()
    stranger._flush()
    batch = [(b"\x02", A), *((d, A) for d, _ in stranger.sent), *((d, A) for d, _ in pa.sent)]
    pa.sent.clear()
    assert list(b.feed(batch)) == [pb]
    assert pb.delivered == [b"for b"]
    assert b.stats == EndpointStats(datagrams_received=3, unknown_cid=1, malformed=1)
    assert pb.stats.unknown_cid == pb.stats.malformed == 0  # no connection saw them
    b.drop_incoming = True
    pa.write(b"while deaf")
    pa._flush()
    assert _carry(pa, b, A) == []
    assert b.stats.dropped_incoming == 1 and pb.delivered == [b"for b"]


def test_a_batch_of_datagrams_is_answered_once() -> None:
    _, pa, b, pb = _pair()
    for i in range(8):
        pa.write(bytes([i]) * 1000)  # one datagram each under the 1,200-byte mtu
    assert pa.flushes_due == 1  # the writes of one turn leave together
    pa._flush()
    assert len(pa.sent) == 8
    assert _carry(pa, b, A) == [pb]  # the peer once, however many datagrams it got
    assert [d[0] for d in pb.delivered] == list(range(8))
    assert len(pb.sent) == 1 == pb.stats.acks_sent  # not one per two packets (ack_every)


def test_acks_complete_the_waiters_of_what_they_cover() -> None:
    a, pa, b, pb = _pair()
    pa._waiting().add(pa._queue(b"one"), "one")
    pa.write(b"two")
    assert pa._drain_waits()
    pa._waiting().add_drain(pa._written, "drain")
    pa._flush()
    _carry(pa, b, A)
    if not pb.sent:  # one packet: the ACK waits for its delay
        _fire(pb)
    _carry(pb, a, B)
    assert pa.completed == [("one", None), ("drain", None)]
    assert not pa._drain_waits()


def test_retries_run_out_fail_the_waiters_and_tell_the_owner() -> None:
    _, pa, _, _ = _pair()
    told: list[PeerUnreachable] = []
    lost: list[PeerUnreachable] = []
    pa.on_disconnected = told.append
    pa.on_failed = lost.append
    pa._waiting().add(pa._queue(b"lost"), "lost")
    pa.write_many([b"written", b"without a waiter"])
    pa._flush()
    for _ in range(10):  # nobody answers: the timer fires until the retries run out
        if pa.completed:
            break
        _fire(pa)
    assert pa.completed == [("lost", "no ACK after retries")]
    assert [str(e) for e in told] == ["3 messages failed"]
    assert [str(e) for e in lost] == ["no ACK after retries"]  # the writer hears of it
    with pytest.raises(PeerUnreachable):
        pa._queue(b"more")  # DISCONNECTED until reset
    pa.reset()
    assert pa._queue(b"more") == 3  # ids go on after the three that failed


def test_a_removed_peer_fails_its_waiters_refuses_sends_and_sends_nothing() -> None:
    a, pa, _, _ = _pair()
    pa._waiting().add(pa._queue(b"pending"), "pending")
    a.remove_peer(KEY)
    assert pa.completed == [("pending", "endpoint closed")]
    with pytest.raises(PeerUnreachable, match="endpoint closed"):
        pa.write(b"after")
    with pytest.raises(PeerUnreachable, match="endpoint closed"):
        pa._queue_many([b"after"])
    pa._flush()
    assert pa.sent == []
    assert a._peer(KEY, lambda: Peer(KEY, B, 4)) is not pa  # a new one on next use


def test_the_timer_moves_only_when_due_sooner() -> None:
    a, pa, _, pb = _pair()
    pa.write(b"x")
    pa._flush()
    first = pa.connection.get_timer()
    assert first is not None and pa.armed == [first]
    pa.time = 0.001
    pa.write(b"y")
    pa._flush()  # the deadlines are later now, or the same: the timer set stays
    assert pa.armed == [first]
    pb.time = 0.002
    pb.write(b"from b")
    pb._flush()
    pa.time = 0.003
    _carry(pb, a, B)  # a's delayed ACK is due before the retransmission timer
    assert len(pa.armed) == 2 and pa.armed[1] < first
    _fire(pa)  # the ACK goes; the next deadline is set afresh, later
    assert len(pa.armed) == 3 and pa.armed[2] > pa.armed[1]


def test_a_new_source_is_challenged_there_while_data_goes_to_the_peer_address() -> None:
    a, pa, b, pb = _pair()
    moves: list[tuple[Address, Address | None]] = []
    pb.on_path_changed = lambda new, old: moves.append((new, old))
    pa.write(b"copy")
    pa._flush()
    original = list(pa.sent)
    _carry(pa, b, SPOOF)  # a copy with a forged source got there first
    assert {addr for _, addr in pb.sent} == {SPOOF}  # the challenge only: the ACK waits
    pa.sent = original
    _carry(pa, b, A)  # the original is a replay now: it moves nothing
    assert pb.stats.replayed == 1 and pb.addr == A
    pb.sent.clear()
    pb.write(b"reply")
    pb._flush()
    assert [addr for _, addr in pb.sent] == [A]  # data still to the peer's address
    pb.sent.clear()
    # The real move: a's next datagram comes from A2; the challenge goes there, a answers.
    pa.time = pb.time = 0.01
    pa.write(b"moved")
    pa._flush()
    _carry(pa, b, A2)
    assert (A2 in {addr for _, addr in pb.sent}) and pb.addr == A
    _carry(pb, a, B)
    _carry(pa, b, A2)
    assert pb.addr == A2 and moves == [(A2, A)]
    assert b"moved" in pb.delivered


def test_messages_go_to_the_callback_once_set_and_each_datagram_is_heard() -> None:
    _, pa, b, pb = _pair()
    heard: list[int] = []
    pb.on_heard = lambda: heard.append(1)
    pa.write(b"kept")
    pa._flush()
    _carry(pa, b, A)
    got: list[bytes] = []
    pb.on_message = got.append
    pa.write(b"called back")
    pa._flush()
    _carry(pa, b, A)
    assert pb.delivered == [b"kept"] and got == [b"called back"] and len(heard) == 2


def test_our_own_move_resends_what_is_in_flight_at_once() -> None:
    a, pa, _, _ = _pair()
    pa.write(b"in flight")
    pa._flush()
    pa.sent.clear()  # lost with the old address
    pa.time = 0.01
    a._moved()
    assert len(pa.sent) == 1 and pa.stats.retransmissions == 1
    assert pa.sent[0][1] == B


class _Timers(EndpointCore["_Timed"]):
    """An endpoint that records where the adapter's one timer is set."""

    def __init__(self) -> None:
        super().__init__()
        self.set_at: list[float] = []

    def _set_timer(self, when: float) -> None:
        self.set_at.append(when)


class _Timed(Peer):
    __slots__ = ("fail", "fired")

    def __init__(self, key: bytes, sender_id: int) -> None:
        super().__init__(key, B, sender_id)
        self.fired: list[float] = []
        self.fail = False

    def _timer_fired(self) -> None:
        self._timer_at = None
        self.fired.append(self.time)
        if self.fail:
            raise RuntimeError("a peer's timer failed")


def _made(i: int) -> Callable[[], _Timed]:
    return lambda: _Timed(bytes([i]) * 32, i)


def _due_at(endpoint: _Timers, peer: _Timed, when: float) -> None:
    peer._timer_at = when  # as PeerCore._flush does before it arms
    endpoint._arm_peer(peer, when)


def test_the_peers_deadlines_share_one_timer() -> None:
    """One adapter timer for every peer, set for the earliest deadline; a deadline moved
    earlier leaves a stale entry that fires nothing; a peer whose timer raises does not
    keep the others due with it from firing."""
    end = _Timers()
    p, q, r = (end._peer(bytes([i]) * 32, _made(i)) for i in (1, 2, 3))
    _due_at(end, p, 5.0)
    _due_at(end, q, 3.0)
    _due_at(end, r, 3.0)
    assert end.set_at == [5.0, 3.0]  # only an earlier deadline moves the timer
    _due_at(end, p, 1.0)
    assert end.set_at[-1] == 1.0
    end._timers_due(0.999)  # a loop may run its timer a little early: still due
    assert (p.fired, q.fired, r.fired) == ([0.0], [], []) and end.set_at[-1] == 3.0
    q.fail = True
    with pytest.raises(RuntimeError):
        end._timers_due(3.0)
    end._timers_due(3.0)  # the timer set again at once for what was left due
    assert len(q.fired) == len(r.fired) == 1
    assert end.set_at[-1] == 5.0  # p's stale entry
    end._timers_due(5.0)
    assert len(p.fired) == 1 and end._timers == []


def test_a_far_deadline_waits_in_the_wheel_and_fires_on_time() -> None:
    """An idle peer's keepalive is a list slot in the wheel, not a heap tuple; when its
    second begins it moves to the heap, and it fires at its deadline, not at the second."""
    end = _Timers()
    peers = [end._peer(bytes([i]) * 32, _made(i)) for i in range(1, 101)]
    for i, peer in enumerate(peers):
        _due_at(end, peer, 15.0 + i / 100)
    assert end._timers == [] and sum(map(len, end._wheel.values())) == 100
    assert end.set_at == [15.0]
    for peer in peers:
        peer.time = 15.0
    end._timers_due(15.0)  # the second begins: its peers wait in the heap for their time
    assert peers[0].fired == [15.0] and not peers[1].fired
    assert len(end._timers) == 99 and end.set_at[-1] == 15.01


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 3), st.floats(0.0, 40.0), st.floats(0.0, 5.0)),
        min_size=1,
        max_size=60,
    )
)
def test_every_deadline_fires_once_when_due_and_never_before(
    steps: list[tuple[int, float, float]],
) -> None:
    """Against the model: after each wake of the adapter's timer, exactly the peers whose
    deadline came have fired, and the timer is never set later than a live deadline."""
    end = _Timers()
    peers = [end._peer(bytes([i + 1]) * 32, _made(i + 1)) for i in range(4)]
    now = 0.0

    def wake(at: float) -> None:
        for peer in peers:
            peer.time = at
        due = {id(p) for p in peers if p._timer_at is not None and p._timer_at <= at}
        before = {id(p): len(p.fired) for p in peers}
        end._timers_due(at)
        fired = {id(p) for p in peers if len(p.fired) > before[id(p)]}
        assert fired == due
        assert all(len(p.fired) - before[id(p)] <= 1 for p in peers)

    for index, ahead, advance in steps:
        peer = peers[index]
        for p in peers:
            p.time = now
        when = now + ahead
        if peer._timer_at is None or when < peer._timer_at:  # as PeerCore._flush arms
            _due_at(end, peer, when)
        live = [p._timer_at for p in peers if p._timer_at is not None]
        assert not live or end._timer_when <= min(live)
        now += advance
        while end._timer_when <= now:
            wake(end._timer_when)
        assert all(p._timer_at is None or p._timer_at > now for p in peers)
