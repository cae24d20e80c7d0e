"""The SMS side of a broker that lost a user to another broker sends nothing for them.

alice's IP path fails and the broker marks her DISCONNECTED; then another broker takes her
over in the shared store (her agent went there). bob publishes an urgent notification:
the first broker's SMS side finds, before it plans, that it no longer holds her; it
drops her session (``session_ended``, "lost to b") and sends no SMS, which the new holder
would send too.
"""

from __future__ import annotations

from pathlib import Path

from mdeci.store.ownership import Held
from mdeci.store.repo import BrokerStore
from tests.broker.conftest import FakeClock
from tests.smsint.harness import (
    ALICE,
    THESIS_SMSC,
    Deaf,
    Sink,
    guard,
    network,
    sms_config,
    sms_world,
)


async def test_a_broker_that_lost_a_user_plans_no_sms_for_them(
    tmp_path: Path, store: BrokerStore, clock: FakeClock, sink: Sink
) -> None:
    net = network(THESIS_SMSC, 3)
    async with sms_world(tmp_path, store, clock, sink, sms_config(ttl=600.0), net) as (
        broker,
        alice,
        bob,
    ):
        await guard(alice.subscribe("alerts.*"))
        Deaf(alice).on = True
        first = await guard(bob.publish("alerts.fire", {"i": 0}, b"before", urgent=True))
        assert first.state == "published"
        await guard(sink.wait_for("media_disconnected", ALICE))
        await guard(sink.wait_for("sms_sent", ALICE))  # the SMS side serves her here
        sent_before = len([e for e in sink.named("sms_sent") if e.uri == ALICE])

        other = BrokerStore(store.engine, "b")
        held = other.ownership.holder(ALICE)
        assert held is not None and held[0] != "b"
        assert isinstance(other.ownership.take_over(ALICE, held[1]), Held)

        second = await guard(bob.publish("alerts.fire", {"i": 1}, b"after", urgent=True))
        assert second.state == "published"
        ended = await guard(sink.wait_for("session_ended", ALICE))
        assert "lost to b" in str(ended.fields["reason"])
        await broker.service.settled()
        assert len([e for e in sink.named("sms_sent") if e.uri == ALICE]) == sent_before
        assert other.ownership.holder(ALICE) == ("b", held[1] + 1)
