"""Hypothesis: random loss/dup/reorder/delay; exactly-once in-order delivery, fragments included."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from rudp import RudpConfig

from .sim import pair

CONFIG = RudpConfig(
    rto_initial=0.3, rto_min=0.05, max_retries=30, window=16, mtu=200, keepalive_interval=0
)


@settings(max_examples=60, deadline=None)
@given(
    messages=st.lists(st.binary(max_size=700), min_size=1, max_size=25),
    seed=st.integers(0, 2**32 - 1),
    loss=st.floats(0.0, 0.3),
    dup=st.floats(0.0, 0.3),
    reorder=st.floats(0.0, 0.3),
    delay=st.floats(0.001, 0.05),
)
def test_exactly_once_in_order(
    messages: list[bytes], seed: int, loss: float, dup: float, reorder: float, delay: float
) -> None:
    rng = random.Random(seed)

    def fate(_: int) -> list[float]:
        if rng.random() < loss:
            return []
        base = delay + rng.uniform(0, delay) + (0.2 if rng.random() < reorder else 0.0)
        return [base, base + rng.uniform(0, 0.05)] if rng.random() < dup else [base]

    net = pair(CONFIG, fate)
    for i, m in enumerate(messages):
        net.a.send_message(m, 0.0)
        net.b.send_message(m[::-1], 0.0 + i * 0.001)
    n = len(messages)
    net.run_until(lambda: len(net.acked["a"]) == n and len(net.acked["b"]) == n)
    net.run_until(lambda: not net.step())  # drain: late duplicates must not surface either
    assert net.received["b"] == messages
    assert net.received["a"] == [m[::-1] for m in messages]
    assert net.acked["a"] == list(range(n))
    assert net.failed == {"a": [], "b": []}


def test_lossless_large_message_fragments() -> None:
    net = pair(CONFIG, lambda _: [0.01])
    big = bytes(range(256)) * 40  # 10240 bytes, ~67 fragments at mtu 200
    net.a.send_message(big, 0.0)
    net.run_until(lambda: net.acked["a"] == [0])
    assert net.received["b"] == [big]
    assert net.a.stats.retransmissions == 0


TIGHT = RudpConfig(
    rto_initial=0.3,
    rto_min=0.05,
    max_retries=30,
    window=64,
    mtu=200,
    keepalive_interval=0,
    max_message_size=1500,
    max_buffer_bytes=1700,  # far below window * payload: the cap bites, reneging included
)


@settings(max_examples=30, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 1500), min_size=1, max_size=20),
    seed=st.integers(0, 2**32 - 1),
    loss=st.floats(0.0, 0.2),
    reorder=st.floats(0.0, 0.5),
)
def test_exactly_once_in_order_under_a_tight_buffer_cap(
    sizes: list[int], seed: int, loss: float, reorder: float
) -> None:
    """Correctness only: with no flow control a cap this tight costs many resends."""
    messages = [bytes([i % 256]) * size for i, size in enumerate(sizes)]
    rng = random.Random(seed)

    def fate(_: int) -> list[float]:
        if rng.random() < loss:
            return []
        return [0.01 + (0.1 * rng.random() if rng.random() < reorder else 0.0)]

    net = pair(TIGHT, fate)
    for m in messages:
        net.a.send_message(m, 0.0)
    net.run_until(lambda: len(net.acked["a"]) == len(messages))
    net.run_until(lambda: not net.step())
    assert net.received["b"] == messages
    assert net.failed["a"] == []
    assert net.b.buffered_bytes == 0
