"""A cluster of brokers behind Kamailio's dispatcher rides through a PostgreSQL failover.

docs/operations.md §9.4, "PostgreSQL fails over", as a run of real processes: a
PostgreSQL server of the test's own (:mod:`tests.faults.pgserver`), two ``mdeci broker``
processes (nodes b1 and b2, each on its own loopback address) on it, Kamailio with the
shipped config in dispatcher mode naming both, and ``mdeci agent`` processes for alice
(subscribed) and carol (publishing at 50/s through her agent's local API, retrying what
is refused, as docs/faults.md tells applications to), each through Kamailio to the
broker its user's hash picks.

Mid-stream the server is stopped (``pg_ctl -m fast``: every connection of both brokers
is closed at once) and started again on the same address and data: what a failover to a
promoted replica with synchronous replication looks like to brokers that reach the
primary by a name that follows the promotion. While it is down, dave (a raw SIP device)
sends each broker a new INVITE and an OPTIONS, and one INVITE through Kamailio; alice's
and carol's agent status is read; bob's agent is started and INVITEs through Kamailio.
The run (once per module, shared by the tests below) keeps what everyone was answered.

The normal suite publishes 150; the ``bench`` variant 1,000.
"""

from __future__ import annotations

import asyncio
import json
import re
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sip.aio.ua import UserAgent
from sip.errors import SipRequestFailed
from tests.e2e.harness_a import check_exactly
from tests.e2e.harness_b import (
    BROKER_AOR,
    AgentProcess,
    BrokerProcess,
    Device,
    TailCollector,
    at_least,
    eventually,
    uri,
)
from tests.e2e.test_cluster import agent_timers, doc_registrar
from tests.faults.children import Run
from tests.faults.pgserver import PgServer
from tests.faults.publisher import Refusal, RetryingPublisher
from tests.faults.test_pg_restart import INTERNAL
from tests.peers import free_port
from tests.sip.interop.kamailio import Kamailio

pytestmark = [pytest.mark.peer("postgres"), pytest.mark.peer("kamailio"), pytest.mark.slow]

RATE = 50.0
COUNT = 150
BENCH_COUNT = 1000
SUBJECT = "cluster.pg"
BROKERS = {"b1": "127.0.0.21", "b2": "127.0.0.22"}
HOSTS = {"alice": "127.0.0.23", "carol": "127.0.0.24", "bob": "127.0.0.25", "dave": "127.0.0.26"}
# alice subscribes, carol publishes: the dispatcher's hash of the user puts them on
# different brokers (alice and bob share one), so carol's publishes reach alice's broker
# by the store's wake-ups. bob's agent starts during the outage; dave is a raw device.
PASSWORDS = {"dave": "dave-secret"}  # alice, bob and carol: harness_b's
# Refusals carol's publisher meets before the server comes back (it retries every 0.1 s):
# the outage lasts seconds, longer than an agent's liveness bound on these timers.
HOLD_REFUSALS = 30
WARM = "warm"  # published by carol until her broker matches it to alice's subscription
INVITE_GUARD = 30.0  # one INVITE's answer: a guard, it synchronises nothing


@dataclass(frozen=True)
class Answer:
    """A final answer to a request of the test: status and Retry-After."""

    status: int
    retry_after: str | None


@dataclass(frozen=True)
class FailoverRun:
    owners: dict[str, str]  # AOR -> node holding its session, before the outage
    taken_before_outage: int  # publishes carol's agent took before the server stopped
    published: list[str]  # every publish carol's agent took, in order
    refusals: list[Refusal]
    invites: dict[str, Answer]  # node -> its answer to dave's INVITE during the outage
    invite_via_kamailio: Answer  # dave's INVITE through Kamailio during the outage
    options: dict[str, int]  # node -> its answer to an OPTIONS during the outage
    invites_after: dict[str, int]  # node -> its answer to dave's INVITE after it
    before: dict[str, dict[str, Any]]  # alice's and carol's agent status before it
    during: dict[str, dict[str, Any]]  # and at its end
    late_during: dict[str, Any]  # bob's agent status during the outage
    late_connected: bool  # bob's agent connected after it, by itself
    received_during: int  # what alice had received when the server came back
    received: list[dict[str, Any]]  # everything alice's application got
    broker_logs: dict[str, str]  # node -> its stderr


def _users(passwords: dict[str, str]) -> str:
    return "".join(
        f'[[auth.users]]\nuser = "{u}"\npassword = "{p}"\n\n' for u, p in passwords.items()
    )


async def _final(ua: UserAgent, method: str, dest: tuple[str, int], body: bytes = b"") -> Answer:
    """``method`` to ``sip:broker@<domain>`` at ``dest`` (credentials given on a 401)."""
    request = ua.build_request(method, BROKER_AOR, to=f"<{BROKER_AOR}>", body=body)
    _sent, response = await asyncio.wait_for(ua.exchange(request, dest), INVITE_GUARD)
    return Answer(response.status, response.headers.get("Retry-After"))


async def _invited(dave: Device, dest: tuple[str, int]) -> int:
    """dave INVITEs the broker at ``dest`` (ACKed when taken): the final status."""
    try:
        await asyncio.wait_for(dave.ua.invite(BROKER_AOR, dest, dave.offer()), INVITE_GUARD)
    except SipRequestFailed as exc:
        return exc.status
    return 200


async def _owners(broker: BrokerProcess) -> dict[str, str]:
    code, out, err = await broker.admin("sessions", "--json")
    assert code == 0, err
    return {str(row["uri"]): str(row["owner"]) for row in map(json.loads, out.splitlines())}


async def _warm_up(publisher: AgentProcess) -> None:
    """:data:`WARM` published until the publisher's broker matches it to alice's
    subscription (another broker learns of a subscription by a notification)."""

    async def matched() -> bool:
        return bool((await publisher.publish(SUBJECT, WARM)).get("matched"))

    await eventually(matched)


async def _run(tmp: Path, count: int) -> FailoverRun:
    server = PgServer()
    async with Run(tmp) as run:
        run.on_exit(server.close)
        await asyncio.to_thread(server.start)
        ports = {node: free_port(host=host) for node, host in BROKERS.items()}
        listing = tmp / "dispatcher.list"
        listing.write_text("".join(f"1 sip:{BROKERS[n]}:{p}\n" for n, p in ports.items()))
        kamailio = Kamailio(tmp, dispatcher=listing)
        run.on_exit(kamailio.stop)
        await kamailio.ready()
        extra = doc_registrar(f"127.0.0.1:{kamailio.port}") + "\n" + _users(PASSWORDS)
        brokers: dict[str, BrokerProcess] = {}
        for node, host in BROKERS.items():  # one at a time: the first migrates the schema
            broker = BrokerProcess(tmp / node, server.url, extra=extra, host=host, node=node)
            broker.sip_addr = (host, ports[node])
            run.later(broker.stop)
            brokers[node] = await broker.start()
        via = BrokerProcess(tmp / "kamailio-address")  # never started

        def agent(user: str) -> AgentProcess:
            return AgentProcess(
                tmp / user, user, HOSTS[user], via, password=PASSWORDS.get(user),
                address=kamailio.addr, timers=agent_timers(),
            )  # fmt: skip

        alice, carol, bob = agent("alice"), agent("carol"), agent("bob")
        for child in (alice, carol):
            run.later(child.stop)
            await child.start()
        for child in (alice, carol):
            await child.wait_connected()
        await alice.subscribe(SUBJECT, ttl=600)
        await _warm_up(carol)
        owners = await _owners(brokers["b1"])
        before = {"alice": await alice.status(), "carol": await carol.status()}
        dave = await Device.open("dave", HOSTS["dave"], password=PASSWORDS["dave"])
        run.later(dave.close)
        tail = TailCollector(alice.socket).start()
        run.later(tail.close)
        publisher = run.publisher(RetryingPublisher(carol.socket, SUBJECT, count, RATE))
        await publisher.wait(taken=count // 3)

        # ---- the outage: every connection of every broker closes at once
        await asyncio.to_thread(server.stop)
        taken_before = len(publisher.taken)
        refused_before = len(publisher.refusals)
        await publisher.wait(refused=refused_before + 1)
        invites = {}
        options = {}
        for node, broker in brokers.items():
            invites[node] = await _final(dave.ua, "INVITE", broker.sip_addr, dave.offer())
            options[node] = (await _final(dave.ua, "OPTIONS", broker.sip_addr)).status
        via_kamailio = await _final(dave.ua, "INVITE", kamailio.addr, dave.offer())
        run.later(bob.stop)
        await bob.start()

        async def bob_refused() -> bool:
            return int((await bob.status())["failed_attempts"]) >= 1

        await eventually(bob_refused)
        late_during = await bob.status()
        await publisher.wait(refused=refused_before + HOLD_REFUSALS)
        during = {"alice": await alice.status(), "carol": await carol.status()}
        received_during = len(tail.records)
        await asyncio.to_thread(server.resume)

        # ---- the brokers reach the database again
        await publisher.finish()
        await tail.wait_for(at_least(1 + len(publisher.taken)))
        seen = len(tail.records)
        await eventually(lambda: _at_least_nseq(alice, seen))
        late_connected = True
        try:
            await bob.wait_connected()
        except TimeoutError:
            late_connected = False
        invites_after = {node: await _invited(dave, b.sip_addr) for node, b in brokers.items()}
        received = list(tail.records)
        for broker in brokers.values():  # their logs are read when they end
            await broker.stop()
        return FailoverRun(
            owners=owners,
            taken_before_outage=taken_before,
            published=list(publisher.taken),
            refusals=list(publisher.refusals),
            invites=invites,
            invite_via_kamailio=via_kamailio,
            options=options,
            invites_after=invites_after,
            before=before,
            during=during,
            late_during=late_during,
            late_connected=late_connected,
            received_during=received_during,
            received=received,
            broker_logs={n: b.stderr.decode(errors="replace") for n, b in brokers.items()},
        )


async def _at_least_nseq(agent: AgentProcess, n: int) -> bool:
    return int((await agent.status())["highest_nseq"]) >= n


def run_failover(count: int) -> FailoverRun:
    with tempfile.TemporaryDirectory(prefix="mdeci-faults-cluster-pg-") as tmp:
        return asyncio.run(_run(Path(tmp), count))


@pytest.fixture(scope="module")
def failover() -> Iterator[FailoverRun]:
    with pytest.MonkeyPatch.context() as patch:
        # The recipe's broker password comes from the environment (the brokers inherit it).
        patch.setenv("MDECI_BROKER_PASSWORD", "broker-secret")
        yield run_failover(COUNT)


# ------------------------------------------------------------------ checks


def check_delivery(run: FailoverRun, count: int) -> None:
    assert run.published == [f"t{i}" for i in range(count)]
    check_exactly(run.received, [WARM, *run.published])


def check_refusals(run: FailoverRun) -> None:
    assert run.refusals
    for refusal in run.refusals:
        assert refusal.code == 503, refusal
        assert "storage-unavailable" in refusal.error, refusal
        assert not INTERNAL.search(refusal.error), refusal


def _lines(log: str, event: str) -> list[str]:
    return [line for line in log.splitlines() if f"event={event}" in line]


def _outage_s(run: FailoverRun) -> str:
    found = (
        re.search(r"outage_s=([\d.]+)", x)
        for x in _lines(run.broker_logs["b1"], "database_recovered")
    )
    return ", ".join(m.group(1) for m in found if m)


# ------------------------------------------------------------------ tests


def test_alice_and_carol_are_on_different_brokers(failover: FailoverRun) -> None:
    # The dispatcher's hash of the user (algorithm 1) decides; what the rest checks
    # about delivery between brokers needs them apart.
    assert failover.owners[uri("alice")] != failover.owners[uri("carol")], failover.owners


def test_every_broker_loses_the_database_and_logs_it(failover: FailoverRun) -> None:
    for node, log in failover.broker_logs.items():
        assert _lines(log, "database_error"), (node, log[-2000:])
        assert _lines(log, "database_recovered"), (node, log[-2000:])


def test_publishes_are_refused_with_503_and_the_retries_taken(failover: FailoverRun) -> None:
    check_refusals(failover)


def test_a_new_invite_gets_503_with_retry_after_from_every_broker(failover: FailoverRun) -> None:
    assert failover.invites == {n: Answer(503, "5") for n in BROKERS}


def test_through_kamailio_a_new_invite_gets_500(failover: FailoverRun) -> None:
    # A proxy turns the 503 it would pass on into a 500 (RFC 3261 §16.7, Kamailio's tm
    # remap_503_500), without the broker's Retry-After.
    assert failover.invite_via_kamailio == Answer(500, None)


def test_every_broker_answers_options_with_200(failover: FailoverRun) -> None:
    assert failover.options == {n: 200 for n in BROKERS}


def test_connected_agents_stay_connected(failover: FailoverRun) -> None:
    for user in ("alice", "carol"):
        before, during = failover.before[user], failover.during[user]
        assert during["status"] == "CONNECTED", during
        # The same session, and no INVITE tried meanwhile.
        assert (during["call_id"], during["attempts"]) == (before["call_id"], before["attempts"])


def test_nothing_new_is_delivered_during_the_outage(failover: FailoverRun) -> None:
    assert failover.received_during <= 1 + failover.taken_before_outage


def test_deliveries_resume_with_0_lost_0_duplicated(failover: FailoverRun) -> None:
    check_delivery(failover, COUNT)
    print(
        f"\ncluster pg failover: alice on {failover.owners[uri('alice')]}, carol on "
        f"{failover.owners[uri('carol')]}; {COUNT} published at {RATE:.0f}/s, "
        f"{len(failover.refusals)} refusals retried, outage {_outage_s(failover)} s; "
        "0 lost, 0 duplicated, order kept"
    )


def test_a_new_agent_retries_and_connects_once_the_database_is_back(
    failover: FailoverRun,
) -> None:
    during = failover.late_during
    assert during["status"] != "CONNECTED", during
    # Kamailio's 500 (every broker refused), or its own 503 while it holds every broker
    # that refused out of the choice (until its next OPTIONS probe gets 200).
    refusals = ("INVITE refused: 500 ", "INVITE refused: 503 No broker available")
    assert str(during["last_error"]).startswith(refusals), during
    assert failover.late_connected


def test_new_invites_are_taken_again(failover: FailoverRun) -> None:
    assert failover.invites_after == {n: 200 for n in BROKERS}


@pytest.mark.bench
def test_thousand_publishes_at_fifty_per_second_through_a_failover() -> None:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MDECI_BROKER_PASSWORD", "broker-secret")
        run = run_failover(BENCH_COUNT)
    check_delivery(run, BENCH_COUNT)
    check_refusals(run)
    print(
        f"\ncluster pg failover: {BENCH_COUNT} at {RATE:.0f}/s, {len(run.refusals)} "
        f"refusals retried, outage {_outage_s(run)} s; 0 lost, 0 duplicated, order kept"
    )
