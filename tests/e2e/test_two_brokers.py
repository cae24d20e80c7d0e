"""Two `mdeci broker` processes on one PostgreSQL schema: a publish accepted by one
reaches a subscriber held by the other at once (LISTEN/NOTIFY), and `admin sessions`
names the broker that owns each user."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.harness_b import (
    AgentProcess,
    BrokerProcess,
    TailCollector,
    at_least,
    drop_pg_schema,
    pg_schema_url,
    uri,
)
from tests.peers import pg_url

# The wake-up's bound: without it the rows wait for b's next sweep (60 s).
WAKE = 1.0
ROUNDS = 5


@pytest.fixture
def store_url() -> Iterator[str]:
    base = pg_url()
    schema, url = pg_schema_url(base)
    try:
        yield url
    finally:
        drop_pg_schema(base, schema)


async def test_a_publish_on_broker_a_reaches_alice_on_broker_b_within_a_second(
    tmp_path: Path, store_url: str
) -> None:
    a = await BrokerProcess(tmp_path / "a", store_url, node="a").start()
    b = await BrokerProcess(tmp_path / "b", store_url, host="127.0.0.3", node="b").start()
    alice = AgentProcess(tmp_path / "alice", "alice", "127.0.0.2", b, address=b.sip_addr)
    bob = AgentProcess(tmp_path / "bob", "bob", "127.0.0.4", a)
    tail: TailCollector | None = None
    try:
        await alice.start()
        await bob.start()
        await alice.wait_connected()
        await bob.wait_connected()
        await alice.subscribe("feed.*")  # at b; a hears of it through the database
        tail = TailCollector(alice.socket).start()
        loop = asyncio.get_running_loop()
        waits = []
        for n in range(ROUNDS):
            answer = await bob.publish("feed.prices", str(n), n=n)
            assert answer["state"] == "published", answer
            start = loop.time()
            await asyncio.wait_for(tail.wait_for(at_least(n + 1)), WAKE)
            waits.append(loop.time() - start)
        assert tail.texts == [str(n) for n in range(ROUNDS)]
        print(f"cross-broker delivery after pub-ok: max {max(waits) * 1000:.0f} ms")

        code, out, err = await b.admin("sessions", "--json")
        assert code == 0, err
        owners = {row["uri"]: row["owner"] for row in map(json.loads, out.splitlines())}
        assert owners == {uri("alice"): "b", uri("bob"): "a"}
    finally:
        if tail is not None:
            await tail.close()
        for child in (alice, bob, a, b):
            await child.stop()
