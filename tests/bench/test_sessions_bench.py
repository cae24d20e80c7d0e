"""Benchmark of the broker's memory per session: 10,000
registered sessions with one subscription each in at most 200 MB of broker RSS.

Run: ``.venv/bin/pytest -m bench -s tests/bench/test_sessions_bench.py``. It prints the
broker's RSS before and after, kB per session and the set-up rate.

- The broker is a child process (``python -m mdeci broker``, SQLite), so ``VmRSS`` from
  ``/proc/<pid>/status`` is its own.
- The agents are :class:`tests.bench.swarm.Swarm` in this process: per agent a real
  digest REGISTER, a real INVITE with the X25519 offer (the 2xx ACKed), the RUDP secret
  derived from the answer and a ``sub`` to its own subject over a real RUDP peer, each
  answered ``sub-ok``. ``BENCH_SESSIONS`` changes the count (default 10,000).
- ``BENCH_MEMTRACE=<prefix>`` runs the broker under :mod:`tests.bench.memtrace` and
  prints the object types that grew during the set-up; with ``BENCH_TRACEMALLOC=1``
  also a tracemalloc snapshot of what the set-up allocated (``<prefix>.1.snap``; read it
  with ``python -m tests.bench.memtrace --top``). Traced figures are not the RSS of
  record: tracing costs memory (and much time) of its own. ``BENCH_ROOT=<dir>`` runs
  the broker of another source tree (e.g. ``git archive`` of an older commit).
- ``BENCH_IDLE=<s>``: the second reading that many seconds after the set-up (default 40);
  ``BENCH_KEEPALIVE=<s>``: the agents' keepalive interval, to carry every connection's
  counters past 256 in minutes.
- Every wait is bounded by ``RUN_LIMIT``; the number of sessions bounds every loop.
"""

from __future__ import annotations

import ast
import asyncio
import dataclasses
import os
import signal
import time
from pathlib import Path

import pytest

from rudp.aio import DEFAULT_CONFIG
from tests.bench.swarm import Swarm, set_up
from tests.bench.test_broker_bench import BROKER, DOMAIN, HOST, BrokerProc, password

pytestmark = [pytest.mark.bench, pytest.mark.timeout(3000)]

SESSIONS = int(os.environ.get("BENCH_SESSIONS", "10000"))
CONCURRENCY = 32  # set-ups in flight (the broker answers 503 past 64 open requests per host)
RUN_LIMIT = 2400.0  # seconds for the whole set-up: a guard, never a synchronisation
GOAL_MB = 200.0
# Seconds between the two readings: longer than SIP's Timer J (64 T1 = 32 s).
# BENCH_IDLE=N: N instead, e.g. long enough for the keepalives to carry each connection's
# counters past the small ints Python shares (256), as on a broker idle for an hour.
SETTLE = float(os.environ.get("BENCH_IDLE", "40"))
# BENCH_KEEPALIVE=S: the agents' RUDP keepalive interval (default rudp's).
KEEPALIVE = float(os.environ.get("BENCH_KEEPALIVE", "0")) or DEFAULT_CONFIG.keepalive_interval
TRACEMALLOC = os.environ.get("BENCH_TRACEMALLOC") == "1"
# A traced or very busy broker may take longer than the default 10 s between answering
# an INVITE and reading the agent's first datagram; it would end the session as a key
# mismatch.
SETTINGS = ["[auth]", "key_confirm_timeout = 120.0"]
# Another source tree's broker (e.g. an export of an older commit), to compare.
ROOT = Path(os.environ["BENCH_ROOT"]) if os.environ.get("BENCH_ROOT") else None


def _load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


async def _memtrace(broker: BrokerProc, signum: int) -> str:
    """Signal the broker under tests.bench.memtrace; what it printed in answer."""
    stdout = broker.proc.stdout
    assert stdout is not None
    broker.proc.send_signal(signum)
    while True:
        line = (await asyncio.wait_for(stdout.readline(), 300)).decode()
        if not line:
            raise AssertionError("the broker ended before writing its snapshot")
        if line.startswith("memtrace "):
            return line.split(maxsplit=1)[1].strip()


def _answer(text: str) -> str:
    """A census answer is a quoted table (one line on the pipe)."""
    if text.startswith("census '"):
        return "census, what grew (shallow sizes):\n" + str(ast.literal_eval(text[7:]))
    return text


async def test_rss_with_10000_sessions(tmp_path: Path) -> None:
    users = [f"u{i:05d}" for i in range(SESSIONS)]
    trace = os.environ.get("BENCH_MEMTRACE")
    wrapper = None if trace is None else ["-m", "tests.bench.memtrace", trace]
    # The broker stores the configured users before it listens: ~100k take minutes.
    broker = await BrokerProc.start(
        tmp_path, "sqlite:///broker.db", users, wrapper=wrapper, settings=SETTINGS, root=ROOT,
        ready=120.0 + SESSIONS / 100,
    )  # fmt: skip
    swarm: Swarm | None = None
    try:
        config = dataclasses.replace(DEFAULT_CONFIG, keepalive_interval=KEEPALIVE)
        swarm = await Swarm.open(HOST, DOMAIN, BROKER, config)
        if trace is not None:
            await _memtrace(broker, signal.SIGUSR2)
            if TRACEMALLOC:
                await _memtrace(broker, signal.SIGUSR1)
        rss0 = broker.rss_kb()
        await broker.spy("setup")
        cpu0, loop0, t0 = broker.cpu_s(), broker.loop_cpu_s(), time.perf_counter()
        await set_up(
            swarm, users, {u: password(u) for u in users}, broker.sip, CONCURRENCY, RUN_LIMIT
        )
        await broker.unspy()
        elapsed = time.perf_counter() - t0
        cpu = broker.cpu_s() - cpu0
        loop = broker.loop_cpu_s() - loop0
        rss1 = broker.rss_kb()
        assert len(swarm.peers) == SESSIONS
        per = (rss1 - rss0) / SESSIONS
        print(
            f"\nbroker RSS {rss0 / 1024:.1f} MB -> {rss1 / 1024:.1f} MB with {SESSIONS} "
            f"sessions, 1 subscription each: {per:.1f} kB per session; set up in "
            f"{elapsed:.1f} s = {SESSIONS / elapsed:.0f} sessions/s (broker CPU {cpu:.1f} s, "
            f"{cpu / SESSIONS * 1e3:.2f} ms per session, of which the event loop "
            f"{loop / SESSIONS * 1e3:.2f} ms; {swarm.retransmits} SIP "
            f"retransmissions; load {_load()})"
        )
        # A second reading once the set-up's transients are due to be gone (SIP
        # transactions live 32 s after their answer, Timer J / L): a measurement delay in
        # the broker's own time, not a synchronisation.
        await asyncio.sleep(SETTLE)
        rss2 = broker.rss_kb()
        print(
            f"broker RSS {SETTLE:.0f} s later: {rss2 / 1024:.1f} MB "
            f"({(rss2 - rss0) / SESSIONS:.1f} kB per session)"
        )
        if trace is not None:
            print(_answer(await _memtrace(broker, signal.SIGUSR2)))
            if TRACEMALLOC:
                print(f"snapshot {await _memtrace(broker, signal.SIGUSR1)}")
        elif SESSIONS == 10_000:
            verdicts = ["met" if kb / 1024 <= GOAL_MB else "NOT met" for kb in (rss1, rss2)]
            print(f"goal <= {GOAL_MB:.0f} MB: {verdicts[0]} after set-up, {verdicts[1]} later")
    finally:
        if swarm is not None:
            await swarm.close()
        await broker.stop()
