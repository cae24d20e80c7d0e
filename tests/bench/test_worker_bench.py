"""Benchmark of one round trip to the broker's database thread (:class:`DbWorker.run` of
a call that does nothing), against the reference: the same through a one-thread
``concurrent.futures.ThreadPoolExecutor`` and ``loop.run_in_executor``.

Run: ``.venv/bin/pytest -m bench -s tests/bench/test_worker_bench.py``. It prints the
CPU time of the event loop's thread and of the whole process per round trip for both,
and the ratios. Figures go to docs/benchmarks.md ("Session set-up and memory per
session"). ``BENCH_TRIPS`` changes the count (default 20,000).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import time
from collections.abc import Awaitable, Callable

import pytest

from mdeci.broker.worker import DbWorker

pytestmark = pytest.mark.bench

TRIPS = int(os.environ.get("BENCH_TRIPS", "20000"))
WARM = 500


def _nothing() -> int:
    return 1


async def _timed(trip: Callable[[], Awaitable[int]]) -> tuple[float, float]:
    """(loop thread, process) CPU seconds per round trip."""
    for _ in range(WARM):
        await trip()
    thread0, process0 = time.thread_time(), time.process_time()
    for _ in range(TRIPS):
        await trip()
    return (time.thread_time() - thread0) / TRIPS, (time.process_time() - process0) / TRIPS


async def test_round_trip_to_the_database_thread() -> None:
    loop = asyncio.get_running_loop()
    worker = DbWorker()
    pool = concurrent.futures.ThreadPoolExecutor(1)
    try:
        ours = await _timed(lambda: worker.run(_nothing))
        reference = await _timed(lambda: loop.run_in_executor(pool, _nothing))
    finally:
        worker.close()
        pool.shutdown()
    print(
        f"\nround trip to the database thread, CPU µs (loop thread / process): DbWorker "
        f"{ours[0] * 1e6:.1f} / {ours[1] * 1e6:.1f}; run_in_executor (reference) "
        f"{reference[0] * 1e6:.1f} / {reference[1] * 1e6:.1f}; ratios "
        f"{ours[0] / reference[0]:.2f} / {ours[1] / reference[1]:.2f}; "
        f"load {os.getloadavg()[0]:.2f}"
    )
    assert ours[0] > 0 and reference[0] > 0
