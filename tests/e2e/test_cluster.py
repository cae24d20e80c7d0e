"""Three brokers on one PostgreSQL behind Kamailio's dispatcher: a broker lost mid-stream.

Kamailio runs the shipped ``configs/kamailio.cfg`` with ``-A WITH_DISPATCHER`` and a
dispatcher list (written here) naming three ``mdeci broker`` processes, each on its own
loopback address and all on one fresh PostgreSQL schema; each broker registers at
Kamailio as ``sip:broker@localhost`` (``registrar.embedded = false``). Three ``mdeci
agent`` processes (alice, bob, and carol on the pjsua2 SIP stack), each on its own
loopback address, INVITE ``sip:broker@localhost`` through Kamailio; the dispatcher's hash
puts them on more than one broker, so bob's publishes cross brokers. alice and carol
subscribe with a filter; bob publishes at 50/s; mid-stream the broker that owns alice
(``mdeci admin sessions``) is killed (``kill -9``), drained (``mdeci admin drain``) or
frozen (``SIGSTOP`` until alice is owned elsewhere, then ``SIGCONT``). alice's agent
re-INVITEs through Kamailio, the dispatcher takes her to another broker, and she resumes
her queue from the store: alice and carol end with exactly the matching notifications,
in order (0 lost, 0 duplicated). The time from the kill (drain, freeze) to the end of
her stream's pause is printed; the broker that took her over logs the churn log's
``handoff`` naming the one before. The frozen broker, resumed, delivers and writes
nothing more for her: it logs ``session_lost``, and its ``notify_delivered`` lines name
none of her notifications past the first the new holder delivered.

The ``bench`` variants publish 1,000; ``test_kill_to_next_delivery_over_ten_kills``
kills alice's broker ten times in one stream (restarting each) and prints the p50/p99.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.e2e.harness_a import check_exactly, percentile
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
from tests.peers import free_port, missing, pg_url
from tests.sip.interop.kamailio import Kamailio

RATE = 50.0
BROKER_HOSTS = ("127.0.0.11", "127.0.0.12", "127.0.0.13")
# Each agent on its own loopback address; carol runs the pjsua2 SIP stack.
AGENTS = {"alice": "127.0.0.2", "bob": "127.0.0.4", "carol": "127.0.0.6"}
STACKS = {"carol": "pjsua2"}
SUBSCRIBERS = ("alice", "carol")
SWEEP = "\n[subscriptions]\nsweep_interval = 1.0\n"
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
    agents: dict[str, AgentProcess]  # by user
    frozen: set[str]  # nodes stopped with SIGSTOP: they answer nothing

    async def sessions(self) -> list[dict[str, object]]:
        """``mdeci admin sessions --json`` through a broker that runs."""
        live = next(b for node, b in self.brokers.items() if b.running and node not in self.frozen)
        code, out, err = await live.admin("sessions", "--json")
        assert code == 0, err
        return [json.loads(line) for line in out.splitlines()]

    async def owner(self, user: str) -> str:
        """The node that owns ``user``'s session."""
        owners = {row["uri"]: row["owner"] for row in await self.sessions()}
        return str(owners[uri(user)])

    def churn(self, node: str) -> list[dict[str, object]]:
        """The churn log of broker ``node`` as written so far."""
        path = self.brokers[node].loaded.churnlog.path
        lines = path.read_text("utf-8").splitlines() if path.exists() else []
        return [json.loads(line) for line in lines if line]

    async def handed_off(self, user: str, prev: str, node: str) -> None:
        """Await broker ``node``'s churn log line saying it took ``user`` over from
        ``prev``."""

        async def logged() -> bool:
            return any(
                r["event"] == "handoff" and r["uri"] == uri(user)
                and r.get("prev_node") == prev and r["node"] == node
                for r in self.churn(node)
            )  # fmt: skip

        await eventually(logged)


@pytest.fixture
async def cluster(
    tmp_path: Path, store_url: str, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Cluster]:
    """Kamailio (dispatcher mode), three brokers registered there, alice, bob and carol
    connected through it."""
    try:
        import pjsua2  # noqa: F401
    except ImportError:
        missing("pjsua2 (PJSIP Python binding)", "pip install pjsua2-python")
    # The recipe's broker password comes from the environment (the brokers inherit it).
    monkeypatch.setenv("MDECI_BROKER_PASSWORD", "broker-secret")
    ports = {host: free_port(host=host) for host in BROKER_HOSTS}
    listing = tmp_path / "dispatcher.list"
    listing.write_text(doc_dispatcher_list(list(ports.items())))
    kamailio = Kamailio(tmp_path, dispatcher=listing)
    children: list[BrokerProcess | AgentProcess] = []
    frozen: set[str] = set()
    brokers: dict[str, BrokerProcess] = {}
    try:
        await kamailio.ready()
        # A short sweep: a broker frozen while its users went elsewhere, with nothing to
        # send them, finds out at its next sweep (docs/broker.md).
        registrar = doc_registrar(f"127.0.0.1:{kamailio.port}") + SWEEP
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
        agents: dict[str, AgentProcess] = {}
        for user, host in AGENTS.items():
            stack = STACKS.get(user, "mdeci")
            sip, rest = agent_timers()
            agents[user] = AgentProcess(
                tmp_path / user, user, host, via, address=kamailio.addr,
                sip=f'stack = "{stack}"\n', timers=(sip, rest),
            )  # fmt: skip
        for agent in agents.values():
            children.append(await agent.start())
        for agent in agents.values():
            await agent.wait_connected()
        yield Cluster(kamailio, brokers, agents, frozen)
    finally:
        for node in frozen:  # a stopped process takes its SIGTERM only once continued
            proc = brokers[node].proc
            if proc is not None and proc.returncode is None:
                os.kill(proc.pid, signal.SIGCONT)
        for child in reversed(children):
            await child.stop()
            (Path(child.config).parent / "stderr.txt").write_bytes(child.stderr)
        kamailio.stop()


async def subscribe_all(cluster: Cluster) -> dict[str, TailCollector]:
    """alice and carol subscribe to bob's ticks with a filter (3 ticks filtered out), and
    their tails start; bob's publishes reach at least one of them through another broker."""
    tails: dict[str, TailCollector] = {}
    for user in SUBSCRIBERS:
        await cluster.agents[user].subscribe("cl.tick", "exists(i)", ttl=600)
        tails[user] = TailCollector(cluster.agents[user].socket).start()
    for _ in range(3):  # filtered out: never reaches them
        await cluster.agents["bob"].publish("cl.tick", "noise", noise=1)
    owners = {user: await cluster.owner(user) for user in AGENTS}
    assert any(owners[s] != owners["bob"] for s in SUBSCRIBERS), owners
    return tails


def resumed_after(tail: TailCollector, began: float, until: float) -> float:
    """Seconds from ``began`` (a kill, drain or freeze) to the end of the longest pause
    in ``tail``'s records between then and ``until``: the first record the failure held
    back (records already on their way when it began do not end the pause)."""
    times = tail.arrivals
    inside = [i for i in range(1, len(times)) if began < times[i] <= until]
    assert inside, "no record after the failure"
    last = max(inside, key=lambda i: times[i] - max(times[i - 1], began))
    return times[last] - began


async def publish_all(publisher: ApiPublisher, n: int) -> int:
    """Await the publisher's last publish; the count it sent."""

    async def all_sent() -> bool:
        return publisher.sent >= n

    await eventually(all_sent, guard=n / RATE + 30)
    return await publisher.stop()


async def freeze(cluster: Cluster, node: str, user: str) -> None:
    """SIGSTOP broker ``node`` until another broker owns ``user``, then SIGCONT."""
    victim = cluster.brokers[node]
    assert victim.proc is not None
    cluster.frozen.add(node)
    os.kill(victim.proc.pid, signal.SIGSTOP)
    try:

        async def moved() -> bool:
            return await cluster.owner(user) != node

        await eventually(moved)
    finally:
        os.kill(victim.proc.pid, signal.SIGCONT)
        cluster.frozen.discard(node)


async def check_frozen_broker_let_go(
    cluster: Cluster, node: str, new_node: str, records: list[dict[str, object]]
) -> None:
    """Broker ``node``, frozen while alice moved to ``new_node`` and resumed, ends her
    session there without writing for her (she stays owned by ``new_node``) and logs it;
    it delivered nothing of hers past the freeze."""
    alice = uri("alice")

    async def ended() -> bool:
        return any(
            r["event"] == "session_ended" and r["uri"] == alice
            and str(r.get("reason", "")).startswith(f"lost to {new_node} at epoch ")
            for r in cluster.churn(node)
        )  # fmt: skip

    await eventually(ended)
    assert await cluster.owner("alice") == new_node
    victim = cluster.brokers[node]
    await victim.stop()  # its log is read at exit
    # Its operator log (logfmt on stderr) names the user and the new holder.
    said = f"event=session_lost uri={alice} node={node} owner={new_node} "
    assert said in victim.stderr.decode(), victim.stderr.decode()[-2000:]
    # Each of her notifications is logged delivered by a broker (its ack came back). The
    # frozen one names none past where the new holder started: an ack in its socket from
    # before the freeze is the only thing it hears of her after it (the agent sent that
    # one to it; the new holder sends the row again since the store never removed it).
    by_node = {
        each: {
            int(str(r["nseq"])) for r in cluster.churn(each)
            if r["event"] == "notify_delivered" and r["uri"] == alice
        }
        for each in cluster.brokers
    }  # fmt: skip
    elsewhere = set().union(*(v for k, v in by_node.items() if k != node))
    assert by_node[node] and elsewhere, by_node
    assert max(by_node[node]) <= min(elsewhere), by_node
    assert by_node[node] | elsewhere == {int(str(r["nseq"])) for r in records}


@pytest.mark.parametrize(
    ("how", "n"),
    [
        pytest.param("kill", 150, id="kill-150"),
        pytest.param("drain", 150, id="drain-150"),
        pytest.param("freeze", 150, id="freeze-150"),
        pytest.param("kill", 1000, id="kill-1000", marks=pytest.mark.bench),
        pytest.param("drain", 1000, id="drain-1000", marks=pytest.mark.bench),
    ],
)
async def test_alice_moves_to_another_broker_with_0_lost_0_duplicated(
    cluster: Cluster, how: str, n: int
) -> None:
    tails = await subscribe_all(cluster)
    victim_node = await cluster.owner("alice")
    owners = {user: await cluster.owner(user) for user in AGENTS}
    victim = cluster.brokers[victim_node]
    publisher = ApiPublisher(cluster.agents["bob"], "cl.tick", RATE, limit=n).start()
    try:
        await tails["alice"].wait_for(at_least(n // 4))
        loop = asyncio.get_running_loop()
        began = loop.time()
        if how == "kill":
            await victim.kill9()
        elif how == "drain":
            code, out, err = await victim.admin("drain")
            assert code == 0, err
            assert out.startswith(f"draining {victim_node}: ended "), out
            assert int(out.split()[3]) >= 1, out
        else:
            await freeze(cluster, victim_node, "alice")
        sent = await publish_all(publisher, n)
        assert sent == n
        expected = [f"t{i}" for i in range(sent)]
        for tail in tails.values():
            await tail.wait_for(at_least(sent))
            check_exactly(tail.records, expected)
        gap = resumed_after(tails["alice"], began, loop.time())
        new_node = await cluster.owner("alice")
        assert new_node != victim_node
        # The new holder's churn log says whom it took her over from.
        await cluster.handed_off("alice", victim_node, new_node)
        if how == "drain":
            # The drained broker ends with no session (bob's or carol's too, if it held them).
            async def none_left() -> bool:
                return all(r["owner"] != victim_node for r in await cluster.sessions())

            await eventually(none_left)
        elif how == "freeze":
            await check_frozen_broker_let_go(cluster, victim_node, new_node, tails["alice"].records)
        print(
            f"\ncluster/{how}: alice on {victim_node} -> {new_node} ({owners}); {sent} "
            f"published at {RATE:.0f}/s: alice and carol 0 lost, 0 duplicated, order kept; "
            f"{how} to the end of alice's pause {gap * 1000:.0f} ms"
        )
    finally:
        await publisher.stop()
        for tail in tails.values():
            await tail.close()


KILLS = 10


@pytest.mark.bench
async def test_kill_to_next_delivery_over_ten_kills(cluster: Cluster) -> None:
    """alice's broker killed ten times in one stream (each restarted once she is
    elsewhere): the p50/p99 of the kill to the end of her pause; 0 lost, 0 duplicated."""
    tails = await subscribe_all(cluster)
    n = int(KILLS * 12 * RATE)  # ~12 s of stream per kill
    publisher = ApiPublisher(cluster.agents["bob"], "cl.tick", RATE, limit=n).start()
    loop = asyncio.get_running_loop()
    kills: list[float] = []
    try:
        for k in range(KILLS):
            await tails["alice"].wait_for(at_least((k + 1) * n // (KILLS + 2)))
            node = await cluster.owner("alice")
            began = loop.time()
            await cluster.brokers[node].kill9()
            kills.append(began)

            async def moved(node: str = node) -> bool:
                return await cluster.owner("alice") != node

            await eventually(moved)
            await cluster.brokers[node].start()  # on its ports: the dispatcher's list
        sent = await publish_all(publisher, n)
        assert sent == n
        for tail in tails.values():
            await tail.wait_for(at_least(sent))
            check_exactly(tail.records, [f"t{i}" for i in range(sent)])
    finally:
        await publisher.stop()
        for tail in tails.values():
            await tail.close()
    ends = [*kills[1:], loop.time()]
    gaps = [resumed_after(tails["alice"], k, end) for k, end in zip(kills, ends, strict=True)]
    print(
        f"\ncluster/kill x{KILLS}: kill to the end of alice's pause p50 "
        f"{percentile(gaps, 0.5) * 1000:.0f} ms, p99 {percentile(gaps, 0.99) * 1000:.0f} ms, "
        f"max {max(gaps) * 1000:.0f} ms (each: {', '.join(f'{g:.1f}' for g in gaps)} s); "
        f"{sent} published at {RATE:.0f}/s: 0 lost, 0 duplicated, order kept"
    )
