"""The link's timers over the thesis' SMSC delay trace (mdeci.sms.tracesim).

The unit tests check what the simulation must show whatever the seed; the benchmark
prints docs/benchmarks.md's table ("SMS link timers").
"""

from __future__ import annotations

import pytest

from mdeci.sms.config import SmsConfig
from mdeci.sms.tracesim import TraceResult, TraceRun, simulate, table


def _run(timeout: float, size: int, *, stepped: bool = False, frames: int = 400) -> TraceResult:
    link = SmsConfig(ack_timeout=timeout, first_part_ack=stepped)
    return simulate(TraceRun(link=link, frames=frames, frame_bytes=size, seed=5))


def test_one_sms_frames_follow_the_trace_on_the_first_try() -> None:
    res = simulate(TraceRun(link=SmsConfig(), frames=1000, frame_bytes=100, seed=3))
    # 73.2% of SMS within 10 s (no resend can help that soon: the first timer is 200 s).
    assert 0.69 <= res.within[0] <= 0.77
    assert 0.86 <= res.within[1] <= 0.93  # + 17% within a minute
    assert res.never == 0.0  # resends until the 24 h TTL beat the 5.1% "never"
    assert res.mt_sms > res.min_mt_sms  # ... and they cost
    assert res.mo_sms >= 1000  # every frame was acknowledged by SMS


@pytest.mark.parametrize("size", [100, 300])
def test_200_s_sends_fewer_copies_than_60_s_and_delivers_as_much(size: int) -> None:
    short, long = _run(60.0, size), _run(200.0, size)
    assert long.mt_sms < short.mt_sms and long.duplicates < short.duplicates
    assert long.within[-1] >= short.within[-1] - 0.01


def test_first_part_ack_sends_one_sms_before_the_rest() -> None:
    stepped = _run(200.0, 300, stepped=True, frames=200)
    together = _run(200.0, 300, frames=200)
    # Waiting for the part ack costs a round trip: fewer frames within 10 s.
    assert stepped.within[0] < together.within[0]
    assert stepped.never == 0.0


def test_a_dead_path_costs_one_sms_per_try_with_the_first_part_acked() -> None:
    # TTL shorter than the first round trip can be: nothing arrives before it ends for the
    # frames whose first SMS is in the trace's tail; count SMS per frame then.
    link = SmsConfig(ack_timeout=5.0, ack_timeout_max=5.0, default_ttl=1.0)
    res = simulate(TraceRun(link=link, frames=50, frame_bytes=1000, ttl=1.0, seed=2))
    assert res.mt_sms == 50  # segment 1 of each, never the other 7
    together = SmsConfig(ack_timeout=5.0, ack_timeout_max=5.0, first_part_ack=False)
    res2 = simulate(TraceRun(link=together, frames=50, frame_bytes=1000, ttl=1.0, seed=2))
    assert res2.mt_sms == 50 * 8


@pytest.mark.bench
def test_bench_trace_table() -> None:
    print()
    print(table())
