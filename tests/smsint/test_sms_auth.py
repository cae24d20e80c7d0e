"""A replayed genuine MO is refused by a restarted broker (its counters persist)."""

from __future__ import annotations

import time
from pathlib import Path

from mdeci.frames import Ack, encode
from mdeci.sms.auth import KeyRing, MemoryCounters, Role, SmsAuth
from mdeci.sms.config import SmsConfig
from mdeci.sms.counterfile import COUNTER_FILE
from mdeci.sms.link import SmsLink
from mdeci.sms.smsc import SmscConfig
from mdeci.store.repo import BrokerStore
from mdeci.store.users import ha1
from tests.broker.conftest import FakeClock
from tests.smsint.harness import (
    ALICE,
    ALICE_NO,
    BROKER_NO,
    Sink,
    guard,
    network,
    sms_config,
    start_broker,
)


async def test_a_replayed_genuine_mo_is_refused_after_a_broker_restart(
    tmp_path: Path, store: BrokerStore, clock: FakeClock, sink: Sink
) -> None:
    net = network(SmscConfig(), seed=1)  # no loss, no delay
    ring = KeyRing(Role.DEVICE)
    ring.set(BROKER_NO, ha1("SHA-256", "alice", "localhost", "alice-secret"))
    phone = SmsLink(
        ALICE_NO,
        SmsConfig(authenticated=True),
        auth=SmsAuth(ring.get, MemoryCounters(), clock=time.time),
    )
    phone.send_frame(BROKER_NO, encode(Ack(upto=0)), 0.0)
    (genuine,) = phone.sms_to_send()
    gateway = net.gateway(ALICE_NO)
    await gateway.start(lambda _sms: None)  # the broker's acks: not needed here

    broker = await start_broker(tmp_path, store, clock, sink, sms_config(), net.gateway(BROKER_NO))
    try:
        await gateway.send(genuine)
        taken = await guard(sink.wait_for("sms_received", ALICE))
        assert taken.fields["reason"] == "op=ack"
    finally:
        await broker.close()
    assert (tmp_path / "broker" / COUNTER_FILE).exists()

    broker = await start_broker(tmp_path, store, clock, sink, sms_config(), net.gateway(BROKER_NO))
    try:
        await gateway.send(genuine)  # an SMS recorded on the network, sent again
        replayed = await guard(sink.wait_for("sms_received", ALICE, count=2))
        assert replayed.fields["reason"] == "refused buffer: replayed"
        assert broker.sms is not None and list(broker.sms.received) == []
        assert broker.sms.link.stats.replayed == 1
    finally:
        await broker.close()
        await gateway.close()
