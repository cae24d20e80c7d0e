"""A user's monthly SMS limit stops SMS and logs it; the urgent
notifications over the limit wait in the queue (and IP delivers them later)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from mdeci.channels import Period, period_days
from mdeci.sms.smsc import SmscConfig
from mdeci.store.repo import BrokerStore
from mdeci.store.usage import SqlUsage
from tests.broker.conftest import FakeClock
from tests.smsint.harness import (
    ALICE,
    Deaf,
    Sink,
    guard,
    ip_back,
    network,
    sms_config,
    sms_world,
    until,
)

LIMIT = 3


async def test_monthly_limit_stops_sms_and_urgent_ones_wait(
    tmp_path: Path, store: BrokerStore, clock: FakeClock, sink: Sink
) -> None:
    net = network(SmscConfig(time_scale=0.001), 5)  # 1-5 ms, no loss, no duplicates
    async with sms_world(tmp_path, store, clock, sink, sms_config(month_messages=LIMIT), net) as (
        broker,
        alice,
        bob,
    ):
        await guard(alice.subscribe("alerts.*"))
        deaf = Deaf(alice)
        deaf.on = True
        for i in range(6):
            await guard(bob.publish("alerts.fire", {"i": i}, b"x" * 50, urgent=True))
        await guard(sink.wait_for("media_disconnected", ALICE))
        await guard(until(sink, lambda: len(sink.named("notify_delivered")) >= LIMIT))
        assert broker.sms is not None
        await guard(broker.sms.idle())  # every look decided ...
        await broker.service.settled()  # ... and its writes (usage, deletions) are done

        sent = [e.fields["nseq"] for e in sink.named("sms_sent")]
        assert sent == [1, 2, 3]
        blocked = [e for e in sink.named("notify_queued") if e.fields.get("channel") == "sms"]
        assert {e.fields["nseq"] for e in blocked} == {4, 5, 6}  # logged once each
        assert all("month limit" in str(e.fields["reason"]) for e in blocked)
        assert [n.nseq for n in store.queues.pending(ALICE)] == [4, 5, 6]
        spend = SqlUsage(store.engine).spend(*period_days(Period.MONTH, clock()), user=ALICE)
        assert [(s.channel, s.messages) for s in spend] == [("sms", LIMIT)]

        # A new urgent one is still refused SMS; the queue keeps it.
        await guard(bob.publish("alerts.fire", {"i": 7}, b"y", urgent=True))
        await guard(broker.sms.idle())
        assert [n.nseq for n in store.queues.pending(ALICE)] == [4, 5, 6, 7]
        assert len(sink.named("sms_sent")) == LIMIT

        deaf.on = False
        await ip_back(alice)
        await guard(until(sink, lambda: not store.queues.pending(ALICE), broker.service.settled))
        await guard(alice.wait_until(lambda: len(alice.delivered_since(0)) == 7))
        got = Counter(int(r["nseq"]) for r in alice.delivered_since(0))
        assert got == Counter(range(1, 8))
