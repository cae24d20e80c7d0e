"""Microbenchmark of the broker's churn chain: CPU per record.

Run: ``.venv/bin/pytest -m bench -s -p no:cacheprovider tests/bench/test_churn_bench.py``.
It prints the CPU time per churn record of the chain the broker runs
(``LoopSink`` -> ``MetricsSink`` -> ``OperatorSink`` -> ``ChurnLogSink`` -> ``ChurnLog``
with ``defer``), building the records included, for single events (``emit``) and for the
rows the core hands over (``emit_rows``, batches of 1, 32 and 100). Everything runs on the
loop's thread (a ``LoopQueue`` call made there runs at once): one core, no hand-off, so
the figure is the chain's own cost. Best of three; the log is flushed every 64 records,
as a loop turn would. The lines written are checked, so the figure is of a correct chain.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from mdeci.broker.metrics import BrokerMetrics, MetricsSink
from mdeci.broker.sink import ChurnLogSink, Row, emit_rows
from mdeci.broker.worker import LoopQueue, LoopSink
from mdeci.churnlog import ChurnLog, Role
from mdeci.oplog import OperatorSink

pytestmark = [pytest.mark.bench]

RECORDS = 128_000  # per measurement: half queued, half delivered
URIS = [f"sip:user{i}@bench.example" for i in range(100)]
QUEUED, DELIVERED = ("nseq", "queue_depth"), ("nseq", "latency_ms")


async def test_churn_chain_cpu_per_record(tmp_path: Path) -> None:
    loop = asyncio.get_running_loop()
    pending: list[Callable[[], None]] = []
    log = ChurnLog(
        tmp_path / "churn.log", "bench", time.time, max_bytes=1 << 40, role=Role.BROKER,
        defer=pending.append,
    )  # fmt: skip
    metrics = BrokerMetrics()
    sink = LoopSink(MetricsSink(OperatorSink(ChurnLogSink(log)), metrics), LoopQueue(loop))

    def flush() -> None:
        while pending:
            pending.pop()()

    def single() -> None:
        for i in range(RECORDS // 2):
            uri = URIS[i % 100]
            sink.emit("notify_queued", uri, nseq=i, queue_depth=3)
            sink.emit("notify_delivered", uri, nseq=i, latency_ms=12.5 + i)
            if i % 32 == 0:
                flush()

    def rows(size: int) -> Callable[[], None]:
        def run() -> None:
            for j in range(RECORDS // 2 // size):
                queued: list[Row] = []
                for i in range(j * size, (j + 1) * size):
                    queued.append((URIS[i % 100], i, 3))
                emit_rows(sink, "notify_queued", QUEUED, queued)
                delivered: list[Row] = []
                for i in range(j * size, (j + 1) * size):
                    delivered.append((URIS[i % 100], i, 12.5 + i))
                emit_rows(sink, "notify_delivered", DELIVERED, delivered)
                if j % max(1, 32 // size) == 0:
                    flush()

        return run

    figures: dict[str, float] = {}
    for name, run in [("emit", single), *((f"rows of {n}", rows(n)) for n in (1, 32, 100))]:
        best = float("inf")
        for _ in range(3):
            start = time.process_time()
            run()
            flush()
            best = min(best, time.process_time() - start)
        figures[name] = best / RECORDS * 1e6
    log.close()
    print()
    for name, us in figures.items():
        print(f"churn chain, {name}: {us:.2f} µs per record")
    lines = (tmp_path / "churn.log").read_text("utf-8").splitlines()
    assert len(lines) == 4 * 3 * RECORDS  # four ways, three times each
    first, second = json.loads(lines[0]), json.loads(lines[1])
    assert (first["event"], first["nseq"], first["queue_depth"]) == ("notify_queued", 0, 3)
    assert (second["event"], second["latency_ms"]) == ("notify_delivered", 12.5)
    assert metrics.queued._value.get() == metrics._delivered_ip._value.get() == 6 * RECORDS
