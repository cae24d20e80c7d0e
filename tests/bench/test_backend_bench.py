"""Benchmark of the agent's SIP backends: pjsua2 against ours.

Run: ``.venv/bin/pytest -m bench -s tests/bench/test_backend_bench.py``. A broker runs in
this process (real SIP and RUDP on loopback); one agent per backend connects
(REGISTER + INVITE + key agreement + RUDP probe) and moves ``MOVES`` times
(MoveSip: new socket and REGISTER; then the re-INVITE), each move timed from
``move_to`` to its end. The reference, in the same run: the ``mdeci`` backend (our
``sip/`` stack); the ratio is pjsua2 / mdeci. Figures go to docs/benchmarks.md
("SIP backends").
"""

from __future__ import annotations

import asyncio
import dataclasses
import statistics
import time
from pathlib import Path

import pytest

from mdeci.agent import Agent
from mdeci.store.repo import BrokerStore
from tests.agent.farend import GUARD, agent_config, lo_only
from tests.agent.test_real_broker import start_broker
from tests.broker.conftest import FakeClock, WaitingSink

# The broker tests' fixtures (a migrated SQLite file per test, a fake clock, a sink).
from tests.broker.conftest import clock as clock
from tests.broker.conftest import sink as sink
from tests.broker.conftest import store as store
from tests.e2e.harness_a import percentile
from tests.peers import missing
from tests.store.conftest import sqlite_path as sqlite_path
from tests.store.conftest import sqlite_template as sqlite_template

pytestmark = pytest.mark.bench
MOVES = 50
HOSTS = tuple(f"127.0.0.{n}" for n in range(2, 8))


async def _measure(tmp: Path, port: int, user: str, stack: str) -> tuple[float, list[float]]:
    config = agent_config(tmp / stack, user, HOSTS[0], port)
    config = dataclasses.replace(config, sip=dataclasses.replace(config.sip, stack=stack))
    agent = Agent(config, address_source=lo_only)
    try:
        t0 = time.perf_counter()
        await agent.start()
        await asyncio.wait_for(agent.wait_connected(), GUARD)
        connect = time.perf_counter() - t0
        moves: list[float] = []
        for k in range(1, MOVES + 1):
            t0 = time.perf_counter()
            await asyncio.wait_for(agent.move_to(HOSTS[k % len(HOSTS)]), GUARD)
            moves.append(time.perf_counter() - t0)
            assert agent.status().state == "CONNECTED"
        return connect, moves
    finally:
        await agent.close()


async def test_pjsua2_backend_against_ours(
    tmp_path: Path, store: BrokerStore, clock: FakeClock, sink: WaitingSink
) -> None:
    try:
        import pjsua2  # noqa: F401
    except ImportError:
        missing("pjsua2 (PJSIP Python binding)", "pip install pjsua2-python")
    broker = await start_broker(tmp_path, store, clock, sink)
    try:
        port = broker.sip_addr[1]
        ours = await _measure(tmp_path, port, "alice", "mdeci")
        theirs = await _measure(tmp_path, port, "bob", "pjsua2")
    finally:
        await broker.close()
    print()
    for name, (connect, moves) in (("mdeci", ours), ("pjsua2", theirs)):
        p50, p99 = statistics.median(moves), percentile(moves, 0.99)
        print(
            f"{name:7} connect {connect * 1000:7.1f} ms; "
            f"move p50 {p50 * 1000:6.1f} ms, p99 {p99 * 1000:6.1f} ms"
        )
    ratio = statistics.median(theirs[1]) / statistics.median(ours[1])
    print(f"pjsua2 / mdeci: move p50 x{ratio:.2f}, connect x{theirs[0] / ours[0]:.2f}")
    assert len(ours[1]) == len(theirs[1]) == MOVES
