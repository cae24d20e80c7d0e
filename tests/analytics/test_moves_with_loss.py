"""The papers' per-move and per-device figures of a real deployment.

A broker and two agents run in this process, every RUDP datagram between them through
the impairment proxy (``python -m rudp.impair``, 5 % loss both ways); the broker's queue
is short, so that some notifications are dropped while A is between two addresses. A
moves a dozen times while B publishes notifications of varied sizes. The churn job then
reads the three churn logs, and its figures must equal what the agents saw themselves:

- per move, the notifications lost (the ``missed`` counts A's application was given
  after the first move) and duplicated (the duplicates A's gate refused);
- per device, A's deliveries and bytes: the payloads its application received.

It runs for minutes, so it is marked ``bench``:
``.venv/bin/pytest -m bench -s tests/analytics/test_moves_with_loss.py``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
from pathlib import Path
from typing import Any

import pytest

from analytics.churn import run_churn
from analytics.jobs import JobConfig
from mdeci.agent.daemon import run_agent
from mdeci.broker.app import run_broker
from mdeci.config import (
    AuthConfig,
    BrokerConfig,
    BrokerMediaConfig,
    ChurnLogConfig,
    HostPort,
    QueueConfig,
    SipConfig,
    UserConfig,
)
from mdeci.store.repo import BrokerStore
from tests.agent.farend import lo_only

# The store fixtures of the broker and store tests (a migrated SQLite file per test).
from tests.broker.conftest import store as store
from tests.e2e.harness_a import GUARD
from tests.e2e.test_handover import A_HOSTS, RUDP, Arrivals, agent_config
from tests.e2e.test_handover_bench import T1, T2, T4, _free_udp_port
from tests.rudp.test_bench import Proxy
from tests.store.conftest import sqlite_path as sqlite_path
from tests.store.conftest import sqlite_template as sqlite_template

# Minutes of moves, loss and a Spark job: a benchmark-length run (`make bench`).
pytestmark = [pytest.mark.bench, pytest.mark.peer("spark"), pytest.mark.timeout(600)]

MOVES = 12
PUBLISHES = 600
QUEUE = 8  # short: a move under load overflows it (drop-oldest)
ALICE = "sip:alice@localhost"


def _payload(i: int) -> bytes:
    return b"n%05d:" % i + b"x" * (i * 37 % 200)


async def _publish(b: Any, count: int) -> None:
    """B's publishes, a few in flight at a time (the broker's pace, not a fixed rate)."""
    pending: list[asyncio.Task[Any]] = []
    for i in range(count):
        while len(pending) >= 8:
            await pending.pop(0)
        pending.append(
            asyncio.create_task(
                asyncio.wait_for(b.agent.publish("moves.tick", {"i": i}, _payload(i)), GUARD)
            )
        )
        await asyncio.sleep(0.004)  # pacing (the offered load), not synchronisation
    await asyncio.gather(*pending)


async def _deployment(tmp: Path, store: BrokerStore, logs: Path) -> dict[str, Any]:
    media_port = _free_udp_port()
    proxy = Proxy(("127.0.0.1", media_port), 0.05, tcp=False, extra=("--max-clients", "64"))
    config = BrokerConfig(
        domain="localhost",
        data_dir=tmp / "broker",
        sip=SipConfig(host="127.0.0.1", port=0, t1=T1, t2=T2, t4=T4),
        media=BrokerMediaConfig(host="127.0.0.1", port=media_port, advertise=HostPort(*proxy.addr)),
        rudp=RUDP,
        queue=QueueConfig(max_per_uri=QUEUE),
        churnlog=ChurnLogConfig(path=logs / "broker.log"),
        auth=AuthConfig(
            users=tuple(UserConfig(user=u, password=f"{u}-secret") for u in ("alice", "bob"))
        ),
    )
    broker = await run_broker(config, sip_listen=("127.0.0.1", 0), store=store)
    port = broker.sip_addr[1]

    def agent(user: str, host: str) -> Any:
        cfg = agent_config(tmp / user, user, host, port)
        return dataclasses.replace(
            cfg,
            sip=dataclasses.replace(cfg.sip, t1=T1, t2=T2, t4=T4),
            churnlog=ChurnLogConfig(path=logs / f"{user}.log"),
        )

    a = await run_agent(agent("alice", A_HOSTS[0]), address_source=lo_only)
    b = await run_agent(agent("bob", "127.0.0.100"), address_source=lo_only)
    arrivals = Arrivals(a.agent)
    broker_open = True
    try:
        await asyncio.wait_for(a.wait_connected(), GUARD)
        await asyncio.wait_for(b.wait_connected(), GUARD)
        await asyncio.wait_for(a.agent.subscribe("moves.tick", ttl=3600), GUARD)
        publishing = asyncio.create_task(_publish(b, PUBLISHES))
        await asyncio.wait_for(arrivals.time_of(0), GUARD)
        before_moves = max(r["nseq"] for _, r in arrivals.received)
        for k in range(1, MOVES + 1):
            await asyncio.wait_for(a.move_to(A_HOSTS[k % len(A_HOSTS)]), GUARD)
            await asyncio.sleep(0.05)  # pacing: notifications flow between two moves
        await asyncio.wait_for(publishing, 300)
        # As long as deliveries keep coming; then no more (the broker stops), so that the
        # logs and the agents' own records end at the same notification.
        with contextlib.suppress(TimeoutError):
            await arrivals.at_least(PUBLISHES, idle=10.0)
        await broker.close()
        broker_open = False
        records = a.agent.delivered_since(0)
        seen = {
            "records": records,
            "missed_after_first_move": sum(
                r["missed"] for r in records if r["nseq"] > before_moves
            ),
            "duplicates": a.agent.event_counts["notify_duplicate"],
            "moves": a.agent.event_counts["ip_changed"],
        }
    finally:
        arrivals.close()
        await a.close()
        await b.close()
        if broker_open:
            await broker.close()
        proxy.stop()
    return seen


def _table(out: Path, name: str) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    return list(pq.read_table(out / name).to_pylist())


async def test_per_move_and_per_device_figures_equal_what_the_agents_saw(
    tmp_path: Path, store: BrokerStore, spark: Any
) -> None:
    logs = tmp_path / "logs"
    seen = await _deployment(tmp_path, store, logs)
    records = seen["records"]
    assert seen["moves"] == MOVES
    assert len({r["nseq"] for r in records}) == len(records) > PUBLISHES // 2

    out = tmp_path / "churn"
    run_churn(spark, str(logs), str(out), JobConfig())
    moves = [m for m in _table(out, "per_move") if m["uri"] == ALICE]
    assert len(moves) == MOVES
    assert sum(m["lost"] for m in moves) == seen["missed_after_first_move"]
    assert sum(m["duplicated"] for m in moves) == seen["duplicates"]
    assert all(m["restore_ms"] is not None for m in moves)  # each move's media came back

    devices = {(d["uri"], d["channel"]): d for d in _table(out, "per_device")}
    alice = devices[(ALICE, "ip")]
    assert alice["deliveries"] == len(records)
    assert alice["bytes"] == sum(len(base64.b64decode(r["payload"])) for r in records)
    print(
        f"\n{MOVES} moves through 5 % loss, queue {QUEUE}: {len(records)} of {PUBLISHES} "
        f"delivered, {sum(m['lost'] for m in moves)} lost and "
        f"{sum(m['duplicated'] for m in moves)} duplicated per the churn job's moves, "
        f"{alice['bytes']} bytes to alice"
    )
