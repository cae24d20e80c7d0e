"""Loss recovery on a fake clock: tail-loss probe, incremental SACK and loss
detection, ACKs while a hole is open."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from rudp import RudpConfig, RudpConnection

from .sim import KEY, Net, pair

ONE_WAY = 0.05  # RTT 0.1 s
# An RTO far above the RTT, so a recovery that waited for it would show.
SLOW_RTO = RudpConfig(rto_initial=2.0, rto_min=2.0, keepalive_interval=0, window=256)


def _msg(i: int) -> bytes:
    """Message ``i``: over half a datagram, so no two share one (the core packs small
    messages due together; these tests count datagrams as messages)."""
    return (b"m%d " % i).ljust(700, b".")


def _send_all(conn: RudpConnection, n: int) -> None:
    for i in range(n):
        conn.send_message(_msg(i), 0.0)


class _Lossy(RudpConnection):
    """A connection whose outgoing datagrams pass through :attr:`keep` once it is set
    (the test's scripted loss; a subclass, since the core's slots forbid patching)."""

    keep: Callable[[bytes], bool] | None = None

    def datagrams_to_send(self, now: float) -> list[bytes]:
        out = super().datagrams_to_send(now)
        keep = self.keep
        return out if keep is None else [d for d in out if keep(d)]


def test_lost_tail_is_recovered_by_a_probe_within_a_few_rtt_not_an_rto() -> None:
    """The last two DATA packets of a burst are lost: nothing is sent after them, so no
    ACK can reveal them. The probe (newest unacknowledged packet, after PTO = 2 SRTT +
    ack_delay, counted from the last ACK, one RTT after the burst) is acknowledged, which
    shows the older one missing: both are delivered RTT + PTO + 2 RTT (+ ACK delays)
    after the burst, ~0.56 s here, where the RTO alone would take 2 s."""
    n = 10
    data_index = iter(range(10_000))

    def fate(_: int) -> list[float]:
        return [ONE_WAY]

    lossy = _Lossy(KEY, SLOW_RTO, sender_id=1)
    net = Net(lossy, RudpConnection(KEY, SLOW_RTO, sender_id=2), fate)
    dropped: list[int] = []

    def keep(_: bytes) -> bool:
        k = next(data_index)
        if k in (n - 2, n - 1):  # the first transmissions of the last two packets
            dropped.append(k)
            return False
        return True

    # Warm-up round trip so the sender has an SRTT (the probe needs one).
    net.a.send_message(b"warm", 0.0)
    net.run_until(lambda: net.acked["a"] == [0])
    next(data_index)  # the warm-up packet went through ``original`` before the patch
    lossy.keep = keep
    start = net.now
    _send_all(net.a, n - 1)
    net.run_until(lambda: len(net.received["b"]) == n)
    assert dropped == [n - 2, n - 1]
    elapsed = net.now - start
    assert net.a.stats.timeouts == 0
    assert net.a.stats.tail_probes == 1
    rtt, delay = 2 * ONE_WAY, SLOW_RTO.ack_delay
    pto = 2 * rtt + delay
    assert elapsed <= rtt + delay + pto + 2 * rtt + delay + 0.001, elapsed
    assert net.received["b"][1:] == [_msg(i) for i in range(n - 1)]


NO_PROBE = RudpConfig(
    rto_initial=2.0, rto_min=2.0, keepalive_interval=0, window=256, tail_probe=False
)


def _warm_without_probe() -> tuple[_Lossy, Net]:
    """A lossy sender without the tail-loss probe (a 2 s RTO), after one round trip
    (so it has an SRTT)."""
    lossy = _Lossy(KEY, NO_PROBE, sender_id=1)
    net = Net(lossy, RudpConnection(KEY, NO_PROBE, sender_id=2), lambda _: [ONE_WAY])
    net.a.send_message(b"warm", 0.0)
    net.run_until(lambda: net.acked["a"] == [0])
    return lossy, net


def test_without_the_probe_the_same_tail_waits_for_the_rto() -> None:
    """The reference for the test above: with ``tail_probe=False`` the tail costs an RTO."""
    lossy, net = _warm_without_probe()
    sent = iter(range(10_000))
    lossy.keep = lambda _: next(sent) != 8  # the last of 9 packets
    start = net.now
    _send_all(net.a, 9)
    net.run_until(lambda: len(net.received["b"]) == 10)
    assert net.a.stats.timeouts == 1 and net.a.stats.tail_probes == 0
    assert net.now - start >= 2.0


def test_a_hole_whose_acks_all_came_early_is_resent_by_the_loss_timer() -> None:
    """A burst sent at one instant loses one early packet. Every ACK arrives before the
    hole is old enough for the time rule (1.25 RTT; each RTT sample is the burst's own),
    and then no ACK comes. The loss timer (RFC 9002 §6.1.2) resends it when it comes of
    age: ~1.25 RTT after the burst, where the probe would take 2 SRTT + ack delay after
    the last ACK and the RTO 2 s."""
    lossy, net = _warm_without_probe()
    sent = iter(range(10_000))
    lossy.keep = lambda _: next(sent) != 2  # the third of 20 packets, once
    start = net.now
    for i in range(20):
        net.a.send_message(_msg(i), start)
    net.run_until(lambda: len(net.received["b"]) == 21)
    assert net.a.stats.timeouts == 0 and net.a.stats.fast_retransmissions == 1
    rtt = 2 * ONE_WAY
    assert net.now - start <= 1.25 * (rtt + NO_PROBE.ack_delay) + ONE_WAY + 0.001
    assert net.received["b"][1:] == [_msg(i) for i in range(20)]


class CountingDict(dict[int, Any]):
    """A dict that counts element visits: lookups, pops, and items iterated."""

    visits = 0

    def get(self, key: int, default: Any = None) -> Any:
        CountingDict.visits += 1
        return super().get(key, default)

    def pop(self, key: int, *default: Any) -> Any:
        CountingDict.visits += 1
        return super().pop(key, *default)

    def __contains__(self, key: object) -> bool:
        CountingDict.visits += 1
        return super().__contains__(key)

    def values(self) -> Any:
        for value in super().values():
            CountingDict.visits += 1
            yield value


def test_ack_processing_does_not_scan_the_window_while_a_hole_is_open() -> None:
    """The first packet of 4,000 (window 4,096) is lost and recovered late: every ACK
    until then carries a SACK block covering everything received so far. The sender's
    work per ACK (visits of in-flight packets) must stay flat, not grow with that block
    (one visit per SACKed packet per ACK would be ~8 M here)."""
    config = RudpConfig(
        window=4096, keepalive_interval=0, rto_initial=5.0, rto_min=5.0, tail_probe=False
    )
    a = RudpConnection(KEY, config, sender_id=1)
    b = RudpConnection(KEY, config, sender_id=2)
    a._inflight = CountingDict()
    n = 4000
    _send_all(a, n)
    datagrams = a.datagrams_to_send(0.0)
    assert len(datagrams) == n
    acks = 0
    now = 0.01
    CountingDict.visits = 0
    for d in datagrams[1:]:  # datagram 0 lost
        b.receive_datagram(d, now)
        for ack in b.datagrams_to_send(now):
            acks += 1
            a.receive_datagram(ack, now + 0.01)
        now += 0.0001
    assert 1000 < acks < n  # ACKs every ack_every packets above the hole, not each one
    # Each SACKed packet is visited about once in all, not once per ACK (~4 M visits).
    assert CountingDict.visits <= 2 * n, CountingDict.visits


def test_receiver_acks_a_new_hole_at_once_and_then_every_ack_every_packets() -> None:
    config = RudpConfig(keepalive_interval=0, ack_every=2, ack_delay=0.5)
    a = RudpConnection(KEY, config, sender_id=1)
    b = RudpConnection(KEY, config, sender_id=2)
    _send_all(a, 8)
    data = a.datagrams_to_send(0.0)
    acks = []
    for d in data[1:]:  # 0 is lost: 1 opens the hole, 2..7 extend the run above it
        b.receive_datagram(d, 0.01)
        acks.append(len(b.datagrams_to_send(0.01)))
    assert acks == [1, 0, 1, 0, 1, 0, 1]
    b.receive_datagram(data[0], 0.02)  # fills the hole: at once
    assert len(b.datagrams_to_send(0.02)) == 1


def _runs(buffer: Mapping[int, object]) -> list[list[int]]:
    runs: list[list[int]] = []
    for seq in sorted(buffer):
        if runs and runs[-1][1] == seq:
            runs[-1][1] = seq + 1
        else:
            runs.append([seq, seq + 1])
    return runs


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    loss=st.floats(0.0, 0.4),
    reorder=st.floats(0.0, 0.5),
    cap=st.sampled_from([1700, 1 << 20]),
)
def test_sack_runs_always_match_the_reordering_buffer(
    seed: int, loss: float, reorder: float, cap: int
) -> None:
    """The receiver's incremental SACK runs equal the runs computed from its buffer after
    every datagram, buffer-cap evictions included; and everything arrives once, in order."""
    config = RudpConfig(
        rto_initial=0.3,
        rto_min=0.05,
        max_retries=30,
        window=64,
        mtu=200,
        keepalive_interval=0,
        max_message_size=1500,
        max_buffer_bytes=cap,
    )
    rng = random.Random(seed)

    def fate(_: int) -> list[float]:
        if rng.random() < loss:
            return []
        return [0.01 + (0.1 * rng.random() if rng.random() < reorder else 0.0)]

    net = pair(config, fate)
    messages = [bytes([i]) * (1 + 37 * i % 1400) for i in range(30)]
    for m in messages:
        net.a.send_message(m, 0.0)
    for _ in range(200_000):
        if len(net.acked["a"]) == len(messages):
            break
        net.step()
        assert net.b._ranges != []  # no runs: None, no list kept
        assert (net.b._ranges or []) == _runs(net.b._buffer)
        assert all(start > net.b._rcv_next for start, _ in net.b._ranges or ())
    assert net.received["b"] == messages
