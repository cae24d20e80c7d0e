"""Benchmark of several brokers on one PostgreSQL store: what a second hop costs.

Run: ``CI=true MDECI_TEST_PG_URL=postgresql+psycopg://postgres@127.0.0.1:5432/test
.venv/bin/pytest -m bench -s tests/bench/test_cluster_bench.py``; it prints two tables.

- Latency: brokers a, b, c (``python -m mdeci broker`` children, nodes a/b/c on
  127.0.0.1/.3/.5, one schema). alice (an ``mdeci agent`` process) is held by b; bob on a
  (cross-broker: a queues the rows, b is woken by LISTEN/NOTIFY) and carol on b (same
  broker) publish in turn, ``BENCH_CLUSTER_PUBS`` each at ``BENCH_CLUSTER_RATE`` per second
  each. A latency is from the wall clock just before the publisher's API call (and from
  the broker's ``published_at``) to the instant alice's ``tail`` yields it in this
  process; every process is on this machine, so one clock.
- CPU: ``BENCH_CLUSTER_SUBS`` light subscribers (a SIP UA and a RUDP peer each, acking
  as ``mdeci.agent`` does: ``LightAgent`` of the broker bench) spread evenly over a, b
  and c, a publisher on a, ``BENCH_CLUSTER_FAN_PUBS`` publishes matching all of them;
  then the same on one broker alone (its own schema). Broker CPU is the on-CPU time of
  the broker processes' threads (schedstat, summed) over the phase, per notification
  delivered.
- Every wait is guarded by ``RUN_LIMIT``; every loop is bounded by its count.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from mdeci.agent.api import ApiClient
from rudp.aio import RudpEndpoint
from sip.aio.ua import UaConfig, UserAgent
from sip.sdp import build_offer, parse_session
from tests.bench.test_broker_bench import LightAgent, bounded_gather, password
from tests.e2e.harness_b import (
    BROKER_AOR,
    DOMAIN,
    AgentProcess,
    BrokerProcess,
    drop_pg_schema,
    pg_schema_url,
    uri,
)
from tests.keyx import OfferKeys
from tests.peers import pg_url

pytestmark = [pytest.mark.bench, pytest.mark.timeout(600)]

PUBS = int(os.environ.get("BENCH_CLUSTER_PUBS", "300"))  # per publisher
RATE = float(os.environ.get("BENCH_CLUSTER_RATE", "20"))  # per publisher, per second
SUBS = int(os.environ.get("BENCH_CLUSTER_SUBS", "30"))
FAN_PUBS = int(os.environ.get("BENCH_CLUSTER_FAN_PUBS", "500"))
RUN_LIMIT = 120.0  # seconds: a guard per phase, never a synchronisation
CLIENT_HOST = "127.0.0.1"
SUB_USERS = [f"s{i:02d}" for i in range(SUBS)]
LIGHT_USERS = [*SUB_USERS, "pub"]
# Users beyond harness_b's alice and bob: carol publishes on b, the light clients.
EXTRA_USERS = "".join(
    f'[[auth.users]]\nuser = "{u}"\npassword = "{password(u)}"\n\n' for u in ["carol", *LIGHT_USERS]
)


@pytest.fixture
def store_urls() -> Iterator[tuple[str, str]]:
    """Two fresh schemas: the three brokers' and the lone broker's."""
    base = pg_url()
    made: list[str] = []
    try:
        urls = []
        for _ in range(2):
            schema, url = pg_schema_url(base)
            made.append(schema)
            urls.append(url)
        yield urls[0], urls[1]
    finally:
        for schema in made:
            drop_pg_schema(base, schema)


def cpu_s(broker: BrokerProcess) -> float:
    """On-CPU time of the broker process's threads so far (their schedstat run time, in
    nanoseconds: /proc/PID/stat counts in clock ticks of 10 ms, too coarse here)."""
    assert broker.proc is not None
    total = 0
    for task in Path(f"/proc/{broker.proc.pid}/task").iterdir():
        with contextlib.suppress(FileNotFoundError):  # a thread that just ended
            total += int((task / "schedstat").read_text().split()[0])
    return total / 1e9


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


class Light(LightAgent):
    """The broker bench's light client in harness_b's domain (the brokers here are
    harness_b's), on loopback ``CLIENT_HOST``."""

    @classmethod
    async def open_here(cls, user: str) -> Light:
        ua = UserAgent(UaConfig(aor=uri(user), password=password(user), tcp=False))
        await ua.start(CLIENT_HOST, 0)
        return cls(user, ua, await RudpEndpoint.open(CLIENT_HOST, 0), True)

    async def connect(self, sip: tuple[str, int], *, register: bool, read: bool = True) -> None:
        if register:
            await self.ua.register(sip, 3600)
        self.version += 1
        keys = OfferKeys(self.user, DOMAIN, password(self.user))
        port = self.rudp.local_addr[1]
        offer = build_offer(self.user, 1, self.version, CLIENT_HOST, port, keys.public).encode()
        self.dialog, response = await self.ua.invite(BROKER_AOR, sip, offer)
        media = parse_session(response.body)
        assert media.key is not None
        self.key = keys.secret(media.key, offer, response.body)
        peer = self.peer = self.rudp.peer(self.key, (media.addr, media.port))
        if read:
            peer.on_message = lambda data: self._on_message(peer, data)


# ---------------------------------------------------------------------------- latency


@dataclass
class Arrivals:
    """What alice's tail yields: text -> (wall clock at arrival, broker's published_at)."""

    want: int
    seen: dict[str, tuple[float, float]] = field(default_factory=dict)
    complete: asyncio.Event = field(default_factory=asyncio.Event)

    async def read(self, agent: AgentProcess) -> None:
        async with ApiClient(agent.socket) as client:
            async for record in client.tail(1):
                self.seen[str(record["text"])] = (time.time(), float(record["published_at"]))
                if len(self.seen) >= self.want:
                    self.complete.set()


async def _publish_in_turn(
    publishers: dict[str, AgentProcess], count: int, prefix: str
) -> dict[str, float]:
    """``count`` publishes per publisher, in turn, paced at RATE each; text -> the wall
    clock just before its API call."""
    sent: dict[str, float] = {}
    loop = asyncio.get_running_loop()
    interval = 1.0 / (RATE * len(publishers))
    async with contextlib.AsyncExitStack() as stack:
        clients = {
            name: await stack.enter_async_context(ApiClient(agent.socket))
            for name, agent in publishers.items()
        }
        start = loop.time()
        for i in range(count):
            for j, (name, client) in enumerate(clients.items()):
                delay = start + (i * len(clients) + j) * interval - loop.time()
                if delay > 0:  # pacing (the offered load), not synchronisation
                    await asyncio.sleep(delay)
                text = f"{prefix}{name}-{i}"
                request = {"op": "pub", "subject": "lat.feed", "attrs": {}, "text": text}
                sent[text] = time.time()
                answer = await asyncio.wait_for(client.call(request), RUN_LIMIT)
                assert answer["state"] == "published", answer
    return sent


def _percentiles(values: list[float]) -> tuple[float, float, float]:
    """p50, p99, max in milliseconds."""
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return statistics.median(ordered) * 1e3, p99 * 1e3, ordered[-1] * 1e3


async def _latency(tmp: Path, brokers: list[BrokerProcess]) -> dict[str, Any]:
    a, b, _c = brokers
    alice = AgentProcess(tmp / "alice", "alice", "127.0.0.2", b, address=b.sip_addr)
    bob = AgentProcess(tmp / "bob", "bob", "127.0.0.4", a, address=a.sip_addr)
    carol = AgentProcess(
        tmp / "carol", "carol", "127.0.0.7", b, password=password("carol"), address=b.sip_addr
    )
    agents = [alice, bob, carol]
    reader: asyncio.Task[None] | None = None
    try:
        for agent in agents:
            await agent.start()
        for agent in agents:
            await agent.wait_connected()
        await alice.subscribe("lat.*")
        code, listing, err = await b.admin("sessions", "--json")
        assert code == 0, err
        owners = {row["uri"]: row["owner"] for row in map(json.loads, listing.splitlines())}
        assert owners == {uri("alice"): "b", uri("bob"): "a", uri("carol"): "b"}, owners
        publishers = {"cross": bob, "same": carol}
        # One warm-up publish each, awaited at alice: both paths are known to work.
        warm = Arrivals(want=2)
        reader = asyncio.create_task(warm.read(alice))
        await _publish_in_turn(publishers, 1, "warm-")
        await asyncio.wait_for(warm.complete.wait(), RUN_LIMIT)
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)

        arrivals = Arrivals(want=2 + 2 * PUBS)  # the kept warm-up ones come again first
        reader = asyncio.create_task(arrivals.read(alice))
        load0 = load_average()
        t0 = time.perf_counter()
        sent = await _publish_in_turn(publishers, PUBS, "")
        await asyncio.wait_for(arrivals.complete.wait(), RUN_LIMIT)
        out: dict[str, Any] = {"elapsed": time.perf_counter() - t0, "load": (load0, load_average())}
        for name in publishers:
            texts = [f"{name}-{i}" for i in range(PUBS)]
            assert all(t in arrivals.seen for t in texts)
            out[name] = _percentiles([arrivals.seen[t][0] - sent[t] for t in texts])
            seen = [arrivals.seen[t] for t in texts]
            out[f"{name}.broker"] = _percentiles([max(0.0, w - p) for w, p in seen])
        return out
    finally:
        if reader is not None:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
        for agent in agents:
            await agent.stop()


# ---------------------------------------------------------------------------- CPU


async def _fan_out(
    subscribers_at: list[BrokerProcess], publisher_at: BrokerProcess, brokers: list[BrokerProcess]
) -> tuple[list[float], float, int]:
    """Subscriber i on ``subscribers_at[i % len]``; (CPU s of each of ``brokers``, elapsed s,
    notifications)."""
    lights: list[Light] = []
    try:
        lights = await bounded_gather(LIGHT_USERS, Light.open_here)
        subs, pub = lights[:SUBS], lights[SUBS]
        homes = [subscribers_at[i % len(subscribers_at)] for i in range(SUBS)]
        await bounded_gather(
            list(zip(subs, homes, strict=True)),
            lambda pair: pair[0].connect(pair[1].sip_addr, register=True),
        )
        await bounded_gather(subs, lambda s: s.subscribe("fan.all"))
        await pub.connect(publisher_at.sip_addr, register=True)
        # A warm-up publish reaches everyone first: every broker has read its rows once.
        for s in subs:
            s.expect(1)
        await asyncio.wait_for(pub.publish("fan.all", 1, "w"), RUN_LIMIT)
        await asyncio.wait_for(asyncio.gather(*(s.done.wait() for s in subs)), RUN_LIMIT)
        for s in subs:
            s.expect(1 + FAN_PUBS)
        cpu0, t0 = [cpu_s(b) for b in brokers], time.perf_counter()
        await asyncio.wait_for(pub.publish("fan.all", FAN_PUBS, "f"), RUN_LIMIT)
        await asyncio.wait_for(asyncio.gather(*(s.done.wait() for s in subs)), RUN_LIMIT)
        elapsed = time.perf_counter() - t0
        cpu = [cpu_s(b) - before for b, before in zip(brokers, cpu0, strict=True)]
        return cpu, elapsed, FAN_PUBS * SUBS
    finally:
        for light in lights:
            await light.close()


# ---------------------------------------------------------------------------- run


async def test_cross_broker_latency_and_cpu(tmp_path: Path, store_urls: tuple[str, str]) -> None:
    cluster_url, alone_url = store_urls
    cluster = [
        BrokerProcess(tmp_path / node, cluster_url, extra=EXTRA_USERS, host=host, node=node)
        for node, host in (("a", "127.0.0.1"), ("b", "127.0.0.3"), ("c", "127.0.0.5"))
    ]
    alone = BrokerProcess(
        tmp_path / "alone", alone_url, extra=EXTRA_USERS, host="127.0.0.6", node="alone"
    )
    started = time.perf_counter()
    try:
        for broker in cluster:
            await broker.start()
        lat = await _latency(tmp_path, cluster)
        three = await _fan_out(cluster, cluster[0], cluster)
        await alone.start()
        one = await _fan_out([alone], alone, [alone])
    finally:
        for broker in [*cluster, alone]:
            await broker.stop()
    assert lat["cross"][0] > 0 and lat["same"][0] > 0
    assert sum(three[0]) > 0 and sum(one[0]) > 0

    print(
        f"\n\nDelivery latency, {PUBS} publishes per path at {RATE:g}/s each, in turn "
        f"({lat['elapsed']:.1f} s; load average {lat['load'][0]} -> {lat['load'][1]})"
    )
    print("| path | p50 | p99 | max | p50 from published_at | p99 from published_at |")
    print("|---|---|---|---|---|---|")
    for name, label in (("same", "same broker (carol on b)"), ("cross", "cross-broker (bob on a)")):
        p50, p99, top = lat[name]
        b50, b99, _ = lat[f"{name}.broker"]
        print(
            f"| {label} | {p50:.1f} ms | {p99:.1f} ms | {top:.1f} ms "
            f"| {b50:.1f} ms | {b99:.1f} ms |"
        )
    print(
        f"ratio cross / same: p50 {lat['cross'][0] / lat['same'][0]:.2f}, "
        f"p99 {lat['cross'][1] / lat['same'][1]:.2f}"
    )
    print(f"\nFan-out {FAN_PUBS} publishes x {SUBS} subscribers, publisher on a")
    print("| brokers | notifications/s | broker CPU (sum) | per notification |")
    print("|---|---|---|---|")
    for label, (cpus, elapsed, total) in (("3 (a, b, c)", three), ("1", one)):
        each = " + ".join(f"{c:.2f}" for c in cpus)
        cpu = sum(cpus)
        print(
            f"| {label} | {total / elapsed:.0f} | {cpu:.2f} s ({each}) "
            f"| {cpu / total * 1e6:.0f} µs |"
        )
    ratio = (sum(three[0]) / three[2]) / (sum(one[0]) / one[2])
    print(f"CPU per notification, 3 brokers / 1 broker: {ratio:.2f}")
    print(f"run {time.perf_counter() - started:.0f} s, load average now {load_average()}")
