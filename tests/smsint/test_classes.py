"""A subscription or a publish names its queue class; the running broker's
selector decides with that class's policy. Unknown classes are refused (400)."""

from __future__ import annotations

from pathlib import Path

import pytest

from mdeci.agent.errors import BrokerRefused
from mdeci.frames import Pub, Sub
from mdeci.sms.smsc import SmscConfig
from mdeci.store.repo import BrokerStore
from tests.broker.conftest import FakeClock
from tests.smsint.harness import (
    ALICE,
    BOB,
    BROKER_NO,
    Deaf,
    Sink,
    guard,
    network,
    sms_config,
    sms_world,
    start_broker,
    until,
)


async def test_subscription_and_publish_classes_choose_the_policy(
    tmp_path: Path, store: BrokerStore, clock: FakeClock, sink: Sink
) -> None:
    net = network(SmscConfig(time_scale=0.001), 5)
    async with sms_world(tmp_path, store, clock, sink, sms_config(ttl=600.0), net) as (
        _broker,
        alice,
        bob,
    ):
        with pytest.raises(BrokerRefused, match="unknown queue class 'vip'"):
            await guard(alice.subscribe("x.*", qclass="vip"))
        await guard(alice.subscribe("alarms.*", qclass="urgent"))  # everything urgent
        await guard(alice.subscribe("news.*"))  # the default class (normal: IP only)
        sub_ok = [s for s in await guard(alice.list_subscriptions())]
        assert len(sub_ok) == 2
        Deaf(alice).on = True
        # Not marked urgent by bob: urgent by alice's subscription -> SMS.
        await guard(bob.publish("alarms.smoke", {}, b"kitchen"))
        await guard(sink.wait_for("media_disconnected", ALICE))
        sent = await guard(sink.wait_for("sms_sent", ALICE))
        assert sent.fields["nseq"] == 1 and "class urgent" in str(sent.fields["reason"])
        # A normal one waits for IP.
        await guard(bob.publish("news.daily", {}, b"digest"))
        pending = [n.nseq for n in store.queues.pending(ALICE)]
        assert 2 in pending
        await guard(until(sink, lambda: len(sink.named("notify_delivered")) >= 1))
        # Only nseq 1 went by SMS (a slow ack may make the link send it again: the test's
        # ack timeout is 50 ms, and copies are the link's business, docs/sms.md).
        assert {e.fields["nseq"] for e in sink.named("sms_sent")} == {1}


async def test_publish_class_is_checked_and_stored(
    tmp_path: Path, store: BrokerStore, clock: FakeClock, sink: Sink
) -> None:
    net = network(SmscConfig(), 1)
    broker = await start_broker(tmp_path, store, clock, sink, sms_config(), net.gateway(BROKER_NO))
    try:
        core, on_core = broker.broker, broker.service.worker.run  # the core's own thread
        sub = await on_core(core.handle, ALICE, Sub(req=1, subject="a.*"))
        assert sub[0].op == "sub-ok"
        (bad,) = await on_core(
            core.handle, BOB, Pub(req=2, msg_id="m1", subject="a.b", qclass="vip")
        )
        assert bad.op == "error" and "unknown queue class" in str(bad)
        assert store.queues.pending(ALICE) == []
        (ok,) = await on_core(
            core.handle, BOB, Pub(req=3, msg_id="m2", subject="a.b", qclass="urgent")
        )
        assert ok.op == "pub-ok"
        (row,) = store.queues.pending(ALICE)
        assert row.qclass == "urgent" and row.urgent  # a class that may use SMS
        (ok,) = await on_core(
            core.handle, BOB, Pub(req=4, msg_id="m3", subject="a.b", qclass="bulk")
        )
        rows = store.queues.pending(ALICE)
        assert (rows[1].qclass, rows[1].urgent) == ("bulk", False)
    finally:
        await broker.close()
