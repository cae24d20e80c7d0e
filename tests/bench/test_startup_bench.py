"""Benchmark of the client commands' start-up (budget: <= 150 ms for ``mdeci status``).

Run: ``.venv/bin/pytest -m bench -s tests/bench/test_startup_bench.py``. A broker and an
agent run in this process (real SIP, RUDP and API socket); each client command is run
as the user runs it (``.venv/bin/mdeci ...``, a new process), ``RUNS`` times, and timed
from spawn to exit. The reference, in the same run: the bare interpreter
(``python -c pass``), so the ratio shows what mdeci adds on this machine.
Figures go to docs/benchmarks.md ("Client start-up").
"""

from __future__ import annotations

import asyncio
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mdeci.agent.daemon import run_agent
from mdeci.broker.app import run_broker
from mdeci.config import (
    AuthConfig,
    BrokerConfig,
    ChurnLogConfig,
    SipConfig,
    StoreConfig,
    UserConfig,
)
from tests.agent.farend import FAST_RUDP, agent_config, lo_only

pytestmark = pytest.mark.bench
ROOT = Path(__file__).resolve().parents[2]
MDECI = str(ROOT / ".venv" / "bin" / "mdeci")
RUNS = 15
BUDGET = 0.150  # seconds, median of `mdeci status`: a command a user types must feel instant
# CPU seconds (user + system) of each run, by argv: on a shared, loaded machine the wall
# time mostly measures the wait for a core; the CPU time is what the command costs.
CPU: dict[tuple[str, ...], list[float]] = {}
GUARD = 60.0


@pytest.fixture
def short_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="mdeci-bench-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


async def _time(argv: list[str], env: dict[str, str] | None = None) -> list[float]:
    # From /: `python -c` puts the current folder first on sys.path, which would shadow
    # MDECI_BENCH_BEFORE with this checkout.
    times = []
    for _ in range(RUNS):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
            env=env,
            cwd="/",
        )
        _, err = await asyncio.wait_for(proc.communicate(), GUARD)
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        times.append(wall)
        CPU.setdefault(tuple(argv), []).append(cpu)
        assert proc.returncode == 0, (argv, err)
    return times


def _row(name: str, times: list[float], ref: float, cpu: float) -> str:
    med = statistics.median(times)
    p90 = sorted(times)[int(0.9 * (len(times) - 1))]
    return (
        f"{name:<44} wall median {med * 1000:6.1f} ms  p90 {p90 * 1000:6.1f} ms  "
        f"x{med / ref:4.1f}  cpu median {cpu * 1000:6.1f} ms"
    )


async def test_client_start_up(short_dir: Path) -> None:
    config = BrokerConfig(
        domain="localhost",
        data_dir=short_dir / "broker",
        sip=SipConfig(host="127.0.0.1", port=0, t1=0.02, t2=0.16, t4=0.2),
        rudp=FAST_RUDP,
        auth=AuthConfig(users=(UserConfig(user="alice", password="alice-secret"),)),
        churnlog=ChurnLogConfig(path=short_dir / "broker-churn.log"),
        store=StoreConfig(url=f"sqlite:///{short_dir / 'broker.db'}"),
    )
    broker = await run_broker(config, expire_interval=3600.0)
    agent = None
    rows: dict[str, tuple[list[float], list[float]]] = {}

    async def measure(name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        CPU.clear()
        walls = await _time(argv, env)
        rows[name] = (walls, CPU[tuple(argv)])

    try:
        cfg = agent_config(short_dir / "alice", "alice", "127.0.0.2", broker.sip_addr[1])
        agent = await run_agent(cfg, address_source=lo_only)
        await asyncio.wait_for(agent.agent.wait_connected(), GUARD)
        sock = str(cfg.api_socket)
        await measure("python -c pass (reference)", [sys.executable, "-c", "pass"])
        await measure("mdeci status", [MDECI, "status", "--socket", sock])
        await measure("mdeci status --json", [MDECI, "status", "--json", "--socket", sock])
        await measure("mdeci subs", [MDECI, "subs", "--socket", sock])
        await measure("mdeci --version", [MDECI, "--version"])
        before = os.environ.get("MDECI_BENCH_BEFORE")
        if before:
            code = "import sys; from mdeci.cli import main; sys.exit(main())"
            argv = [sys.executable, "-c", code, "status", "--socket", sock]
            await measure("python -c main() status (this tree)", argv)
            env = {**os.environ, "PYTHONPATH": before}
            await measure(f"python -c main() status ({before})", argv, env)
    finally:
        if agent is not None:
            await agent.close(clean=False)
        await broker.close()
    ref = statistics.median(rows["python -c pass (reference)"][0])
    print()
    for name, (walls, cpus) in rows.items():
        print(_row(name, walls, ref, statistics.median(cpus)))
    status_cpu = statistics.median(rows["mdeci status"][1])
    assert status_cpu <= BUDGET, f"mdeci status costs over {BUDGET * 1000:.0f} ms of CPU"
