"""A device whose SIP works while its IP downlink does not re-INVITEs while an SMS is on
its way: the SMS is neither stopped nor paid for a second time (stopping it and sending it
again when IP fails anew would pay every part twice).

The broker tells the SMS side that IP is back only once a datagram sent over the new
connection was acknowledged; the re-INVITE alone proves SIP, not IP.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from mdeci.sms.smsc import SmscConfig
from mdeci.store.repo import BrokerStore
from tests.broker.conftest import FakeClock
from tests.smsint.harness import (
    ALICE,
    Deaf,
    Sink,
    guard,
    network,
    sms_config,
    sms_world,
    until,
)


async def test_reinvite_without_ip_keeps_the_sms_in_flight(
    tmp_path: Path, store: BrokerStore, clock: FakeClock, sink: Sink
) -> None:
    # The SMSC loses every SMS and the link resends only after a minute: the one buffer
    # stays in flight for the whole test, so any second `sms_sent` is a resend of ours.
    net = network(SmscConfig(loss=1.0, time_scale=0.001), 7)
    sms = sms_config(ttl=600.0, ack_timeout=60.0, ack_timeout_max=60.0)
    async with sms_world(tmp_path, store, clock, sink, sms, net) as (broker, alice, bob):
        assert broker.sms is not None
        await guard(alice.subscribe("alerts.*"))
        deaf = Deaf(alice)
        deaf.on = True
        await guard(bob.publish("alerts.fire", {"i": 1}, b"x" * 50, urgent=True))
        await guard(until(sink, lambda: len(sink.named("media_disconnected")) >= 1))
        await guard(until(sink, lambda: len(sink.named("sms_sent")) >= 1))
        await guard(broker.sms.idle())

        # Still deaf, she moves: REGISTER and re-INVITE go through; the broker's first
        # send over IP is never acknowledged and the user is DISCONNECTED again.
        await guard(alice.move_to("127.0.0.3"))
        await guard(until(sink, lambda: len(sink.named("media_disconnected")) >= 2))
        await guard(broker.sms.idle())
        await broker.service.settled()
        assert [e.fields["nseq"] for e in sink.named("sms_sent")] == [1]

        # IP comes back for real: her ack of the IP copy stops the SMS, and the
        # notification reaches her application once.
        deaf.on = False
        await guard(alice.move_to("127.0.0.5"))
        await guard(until(sink, lambda: not store.queues.pending(ALICE), broker.service.settled))
        await guard(alice.wait_until(lambda: len(alice.delivered_since(0)) == 1))
        got = Counter(int(r["nseq"]) for r in alice.delivered_since(0))
        assert got == Counter([1])
        assert [e.fields["nseq"] for e in sink.named("sms_sent")] == [1]
