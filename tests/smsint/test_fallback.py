"""SMS fallback end to end: a real broker (``run_broker``) and agents, the
simulated SMSC with the thesis' delay distribution scaled down.

Alice's IP path fails (her RUDP endpoint goes deaf): the broker marks her DISCONNECTED
and sends her urgent notifications by SMS to the MSISDN her SDP announced; each one
reaches her application exactly once or is reported undeliverable when its TTL ends;
normal ones wait for IP. When IP comes back, nothing is delivered twice.
"""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import pytest

from mdeci.agent import Agent
from mdeci.store.repo import BrokerStore
from tests.broker.conftest import FakeClock
from tests.smsint.harness import (
    ALICE,
    ALICE_NO,
    THESIS_SMSC,
    Deaf,
    Sink,
    guard,
    ip_back,
    network,
    sms_config,
    sms_world,
    until,
)

N = 40


def _inbox(agent: Agent) -> Counter[int]:
    return Counter(int(r["nseq"]) for r in agent.delivered_since(0))


def _sms_outcome(sink: Sink, event: str) -> set[int]:
    return {
        int(e.fields["nseq"])  # type: ignore[arg-type]
        for e in sink.named(event)
        if e.uri == ALICE and e.fields.get("channel") == "sms"
    }


async def _publish(bob: Agent, rng: random.Random, indices: range, urgent: bool = True) -> None:
    for i in indices:
        # 1 to 6 SMS per frame; every fifth one is a normal notification.
        payload = rng.randbytes(rng.randint(10, 700))
        result = await guard(
            bob.publish("alerts.fire", {"i": i}, payload, urgent=urgent and i % 5 != 4)
        )
        assert result.state == "published"


@pytest.mark.parametrize("seed", [1, 2])
async def test_urgent_by_sms_exactly_once_or_undeliverable(
    tmp_path: Path, store: BrokerStore, clock: FakeClock, sink: Sink, seed: int
) -> None:
    net = network(THESIS_SMSC, seed)
    async with sms_world(tmp_path, store, clock, sink, sms_config(), net) as (
        broker,
        alice,
        bob,
    ):
        await guard(alice.subscribe("alerts.*"))
        session = store.sessions.get_session(ALICE)
        assert session is not None and session.msisdn == ALICE_NO  # from the user record

        deaf = Deaf(alice)
        deaf.on = True  # the IP path fails
        rng = random.Random(seed)
        await _publish(bob, rng, range(N))
        await guard(sink.wait_for("media_disconnected", ALICE))
        urgent = {i + 1 for i in range(N) if i % 5 != 4}
        normal = {i + 1 for i in range(N) if i % 5 == 4}

        def resolved() -> bool:
            done = _sms_outcome(sink, "notify_delivered") | _sms_outcome(sink, "notify_dropped")
            return done >= urgent

        await guard(until(sink, resolved))
        got = _inbox(alice)
        delivered = _sms_outcome(sink, "notify_delivered")
        undeliverable = _sms_outcome(sink, "notify_dropped")
        assert max(got.values()) == 1  # never twice
        assert delivered | undeliverable == urgent
        assert delivered <= set(got)  # an acknowledged buffer reached the application
        for nseq in urgent - set(got):
            assert nseq in undeliverable, f"{nseq} lost without a report"
        assert len(delivered) >= 0.9 * len(urgent)
        assert not set(got) & normal  # normal notifications never go by SMS
        await broker.service.settled()  # the acked rows are deleted on the database thread
        assert {n.nseq for n in store.queues.pending(ALICE)} == normal
        sent = [e for e in sink.named("sms_sent") if e.uri == ALICE]
        assert {e.fields["nseq"] for e in sent} == urgent
        assert all(e.fields["bytes"] and e.fields["cost"] for e in sent)
        assert alice.event_counts["sms_received"] > 0

        # IP comes back: the normal ones arrive over IP, nothing twice.
        deaf.on = False
        await ip_back(alice)
        await guard(alice.wait_until(lambda: set(_inbox(alice)) >= normal))
        await guard(until(sink, lambda: not store.queues.pending(ALICE), broker.service.settled))
        assert max(_inbox(alice).values()) == 1


async def test_ip_back_midway_shows_no_duplicate(
    tmp_path: Path, store: BrokerStore, clock: FakeClock, sink: Sink
) -> None:
    net = network(THESIS_SMSC, 7)
    async with sms_world(tmp_path, store, clock, sink, sms_config(ttl=600.0), net) as (
        broker,
        alice,
        bob,
    ):
        await guard(alice.subscribe("alerts.*"))
        deaf = Deaf(alice)
        deaf.on = True
        rng = random.Random(7)
        await _publish(bob, rng, range(N // 2))
        await guard(sink.wait_for("media_disconnected", ALICE))
        await guard(until(sink, lambda: len(_sms_outcome(sink, "notify_delivered")) >= 5))

        deaf.on = False
        await ip_back(alice)
        await guard(sink.wait_for("media_connected", ALICE, count=2))
        await _publish(bob, rng, range(N // 2, N))
        everything = set(range(1, N + 1))
        await guard(alice.wait_until(lambda: set(_inbox(alice)) >= everything))
        await guard(until(sink, lambda: not store.queues.pending(ALICE), broker.service.settled))
        got = _inbox(alice)
        assert set(got.values()) == {1}  # every one exactly once
        by = Counter(
            r.get("channel") for r in alice.recent_events if r["event"] == "notify_delivered"
        )
        assert by["sms"] >= 5 and by["ip"] >= N // 2
        assert broker.sms is not None and broker.sms.in_flight(ALICE) == ()
