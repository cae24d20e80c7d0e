"""Three brokers on one PostgreSQL behind Kamailio's dispatcher: a broker lost mid-stream.

Kamailio runs the shipped ``configs/kamailio.cfg`` with ``-A WITH_DISPATCHER`` and a
dispatcher list (written here) naming three ``mdeci broker`` processes, each on its own
loopback address and all on one fresh PostgreSQL schema; each broker registers at
Kamailio as ``sip:broker@localhost`` (``registrar.embedded = false``). Two ``mdeci
agent`` processes (alice, bob), each on its own loopback address, INVITE
``sip:broker@localhost`` through Kamailio. alice subscribes with a filter; bob publishes
at 50/s; mid-stream the broker that owns alice (``mdeci admin sessions``) is killed
(``kill -9``) or drained (``mdeci admin drain``). alice's agent re-INVITEs through
Kamailio, the dispatcher takes her to another broker, and she resumes her queue from the
store: she ends with exactly the matching notifications, in order (0 lost, 0 duplicated).
The time from the kill (or drain) to her next delivery is printed; the broker that took
her over logs the churn log's ``handoff`` naming the one before.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.e2e.harness_a import check_exactly
from tests.e2e.harness_b import (
    FAST_AGENT_TIMERS,
    AgentProcess,
    ApiPublisher,
    BrokerProcess,
    TailCollector,
    at_least,
    drop_pg_schema,
    eventually,
    pg_schema_url,
    uri,
)
from tests.ops.test_tls_recipe import code_blocks, section
from tests.peers import free_port, pg_url
from tests.sip.interop.kamailio import Kamailio

RATE = 50.0
BROKER_HOSTS = ("127.0.0.11", "127.0.0.12", "127.0.0.13")
# The agents notice a dead broker within keepalive_interval + dead_after (docs/agent.md).
DEAD_AFTER = "dead_after = 1.0\n"


def agent_timers() -> tuple[str, str]:
    """The fast loopback timers with a short ``dead_after``."""
    sip, rest = FAST_AGENT_TIMERS
    head, sep, tail = rest.partition("keepalive_interval = 0.5\n")
    assert sep, rest
    return sip, head + sep + DEAD_AFTER + tail


# docs/operations.md §9.4, the recipe this test follows: its config lines are read here.
RECIPE = section(
    (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text("utf-8"),
    "### 9.4 Several brokers behind Kamailio's dispatcher (a cluster)",
)
BLOCKS = code_blocks(RECIPE)
DOC_KAMAILIO = "10.0.0.10:5060"


def doc_registrar(kamailio: str) -> str:
    """The broker's ``[registrar]`` and own ``[[auth.users]]`` of the recipe's step 2,
    with Kamailio's address."""
    (toml,) = [body for lang, body in BLOCKS if lang == "toml"]
    tail = toml[toml.index("[registrar]") :]
    assert DOC_KAMAILIO in tail, tail
    return tail.replace(DOC_KAMAILIO, kamailio)


def doc_dispatcher_list(brokers: list[tuple[str, int]]) -> str:
    """The recipe's dispatcher list (step 3), one line per broker of ``brokers``."""
    (listing,) = [body for lang, body in BLOCKS if lang == "text"]
    lines = listing.splitlines()
    assert len(lines) == len(brokers) and all(re.fullmatch(r"1 sip:[\d.]+:\d+", x) for x in lines)
    return "".join(f"1 sip:{host}:{port}\n" for host, port in brokers)


def test_the_recipe_starts_kamailio_in_the_mode_the_helper_uses() -> None:
    (start,) = [body for lang, body in BLOCKS if lang == "sh" and "kamailio -f" in body]
    assert "-A WITH_DISPATCHER -A 'DISPATCHER_LIST=\"/etc/mdeci/dispatcher.list\"'" in start
    assert "configs/kamailio.cfg" in start


@pytest.fixture
def store_url() -> Iterator[str]:
    base = pg_url()
    schema, url = pg_schema_url(base)
    try:
        yield url
    finally:
        drop_pg_schema(base, schema)


@dataclass
class Cluster:
    kamailio: Kamailio
    brokers: dict[str, BrokerProcess]  # by node name
    alice: AgentProcess
    bob: AgentProcess

    async def owner(self, user: str) -> str:
        """The node that owns ``user``'s session (``mdeci admin sessions --json``)."""
        live = next(b for b in self.brokers.values() if b.running)
        code, out, err = await live.admin("sessions", "--json")
        assert code == 0, err
        owners = {row["uri"]: row["owner"] for row in map(json.loads, out.splitlines())}
        return str(owners[uri(user)])


@pytest.fixture
async def cluster(
    tmp_path: Path, store_url: str, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Cluster]:
    """Kamailio (dispatcher mode), three brokers registered there, alice and bob
    connected through it."""
    # The recipe's broker password comes from the environment (the brokers inherit it).
    monkeypatch.setenv("MDECI_BROKER_PASSWORD", "broker-secret")
    ports = {host: free_port(host=host) for host in BROKER_HOSTS}
    listing = tmp_path / "dispatcher.list"
    listing.write_text(doc_dispatcher_list(list(ports.items())))
    kamailio = Kamailio(tmp_path, dispatcher=listing)
    children: list[BrokerProcess | AgentProcess] = []
    try:
        await kamailio.ready()
        registrar = doc_registrar(f"127.0.0.1:{kamailio.port}")
        brokers: dict[str, BrokerProcess] = {}
        for n, host in enumerate(BROKER_HOSTS, 1):
            node = f"b{n}"
            broker = BrokerProcess(
                tmp_path / node, store_url, extra=registrar, host=host, node=node
            )
            broker.sip_addr = (host, ports[host])
            brokers[node] = broker
        # One at a time: each migrates the schema at start (the first does the work).
        for broker in brokers.values():
            children.append(await broker.start())
        via = BrokerProcess(tmp_path / "kamailio-address")  # never started
        alice = AgentProcess(
            tmp_path / "alice", "alice", "127.0.0.2", via, address=kamailio.addr,
            timers=agent_timers(),
        )  # fmt: skip
        bob = AgentProcess(
            tmp_path / "bob", "bob", "127.0.0.4", via, address=kamailio.addr,
            timers=agent_timers(),
        )  # fmt: skip
        for agent in (alice, bob):
            children.append(await agent.start())
        for agent in (alice, bob):
            await agent.wait_connected()
        yield Cluster(kamailio, brokers, alice, bob)
    finally:
        for child in reversed(children):
            await child.stop()
            (Path(child.config).parent / "stderr.txt").write_bytes(child.stderr)
        kamailio.stop()


@pytest.mark.parametrize(
    ("how", "n"),
    [
        pytest.param("kill", 150, id="kill-150"),
        pytest.param("drain", 150, id="drain-150"),
        pytest.param("kill", 1000, id="kill-1000", marks=pytest.mark.bench),
        pytest.param("drain", 1000, id="drain-1000", marks=pytest.mark.bench),
    ],
)
async def test_alice_moves_to_another_broker_with_0_lost_0_duplicated(
    cluster: Cluster, how: str, n: int
) -> None:
    alice, bob = cluster.alice, cluster.bob
    tail = TailCollector(alice.socket).start()
    publisher: ApiPublisher | None = None
    try:
        await alice.subscribe("cl.tick", "exists(i)", ttl=600)
        for _ in range(3):  # filtered out: never reaches alice
            await bob.publish("cl.tick", "noise", noise=1)
        victim_node = await cluster.owner("alice")
        bob_node = await cluster.owner("bob")
        victim = cluster.brokers[victim_node]
        publisher = ApiPublisher(bob, "cl.tick", RATE, limit=n).start()
        await tail.wait_for(at_least(n // 4))
        loop = asyncio.get_running_loop()
        mark = len(tail.records)
        began = loop.time()
        if how == "kill":
            await victim.kill9()
        else:
            code, out, err = await victim.admin("drain")
            assert code == 0, err
            assert out.startswith(f"draining {victim_node}: ended "), out
            assert int(out.split()[3]) >= 1, out
        await tail.wait_for(at_least(mark + 1))
        gap = loop.time() - began

        async def all_sent() -> bool:
            return publisher is not None and publisher.sent >= n

        await eventually(all_sent, guard=n / RATE + 30)
        sent = await publisher.stop()
        assert sent == n
        publisher = None
        await tail.wait_for(at_least(sent))
        check_exactly(tail.records, [f"t{i}" for i in range(sent)])
        new_node = await cluster.owner("alice")
        assert new_node != victim_node
        # The new holder's churn log says whom it took her over from.
        path = cluster.brokers[new_node].loaded.churnlog.path

        async def handed_off() -> bool:
            lines = path.read_text("utf-8").splitlines() if path.exists() else []
            records = [json.loads(line) for line in lines if line]
            return any(
                r["event"] == "handoff" and r["uri"] == uri("alice")
                and r.get("prev_node") == victim_node and r["node"] == new_node
                for r in records
            )  # fmt: skip

        await eventually(handed_off)
        if how == "drain":
            # The drained broker ends with no session (bob too, if it held his).
            async def none_left() -> bool:
                code, out, _err = await victim.admin("sessions", "--json")
                rows = [json.loads(line) for line in out.splitlines()]
                return code == 0 and all(r["owner"] != victim_node for r in rows)

            await eventually(none_left)
        print(
            f"\ncluster/{how}: alice on {victim_node} -> {new_node} (bob on {bob_node}); "
            f"{sent} published at {RATE:.0f}/s: 0 lost, 0 duplicated, order kept; "
            f"{how} to alice's next delivery {gap * 1000:.0f} ms"
        )
    finally:
        if publisher is not None:
            await publisher.stop()
        await tail.close()
