"""``mdeci agent`` opens its own SMS gateway from ``[sms]`` (no gateway object
handed in), takes notifications by SMS, acknowledges them by SMS, and publishes urgent
ones by SMS while its IP is down.

The device binds to an SMPP SMSC (``tests/smsint/smppsim.py``) as its config says; the
broker is, for this SMSC, the phone at the broker's number. Bob, over IP, subscribes to
what alice publishes.
"""

from __future__ import annotations

import base64
import dataclasses
from pathlib import Path

from mdeci.agent import Agent
from mdeci.config import AgentSmsConfig, HostPort, SmsGatewayKind
from mdeci.store.repo import BrokerStore
from tests.agent.farend import agent_config, lo_only
from tests.broker.conftest import FakeClock
from tests.smsint.harness import (
    ALICE,
    ALICE_NO,
    BROKER_NO,
    Deaf,
    Sink,
    guard,
    plain_agent,
    sms_config,
    start_broker,
)
from tests.smsint.smppsim import SmppSim


async def test_agent_opens_its_gateway_from_config_and_uses_sms_both_ways(
    tmp_path: Path, store: BrokerStore, clock: FakeClock, sink: Sink
) -> None:
    smsc = SmppSim()
    port = await smsc.start()
    broker = await start_broker(
        tmp_path, store, clock, sink, sms_config(ttl=60.0), smsc.phone(BROKER_NO)
    )
    sip_port = broker.sip_addr[1]
    cfg = agent_config(tmp_path / "alice", "alice", "127.0.0.2", sip_port)
    cfg = dataclasses.replace(
        cfg,
        msisdn=ALICE_NO,
        sms=AgentSmsConfig(
            enabled=True,
            broker_number=BROKER_NO,
            gateway=SmsGatewayKind.SMPP,
            smpp_address=HostPort("127.0.0.1", port),
            smpp_system_id="alice-phone",
            ack_timeout=5.0,
        ),
    )
    alice = Agent(cfg, address_source=lo_only)  # no sms_gateway: from [sms]
    bob = plain_agent(tmp_path, "bob", "127.0.0.4", sip_port)
    try:
        await alice.start()
        await guard(smsc.bound.wait())
        assert smsc.binds == ["alice-phone"]
        await bob.start()
        await guard(alice.wait_connected())
        await guard(bob.wait_connected())
        await guard(alice.subscribe("alerts.*"))
        await guard(bob.subscribe("replies.*"))
        bob_inbox = bob.listen()
        Deaf(alice).on = True
        await guard(bob.publish("alerts.fire", {"level": 3}, b"x" * 300, urgent=True))
        await guard(sink.wait_for("media_disconnected", ALICE))
        await guard(alice.wait_event("sms_received", nseq=1))
        done = await guard(sink.wait_for("notify_delivered", ALICE))  # her SMS ack came
        assert done.fields["channel"] == "sms"
        # Alice, IP cut, answers urgently: by SMS to the broker, to bob over IP.
        await guard(alice.wait_until(lambda: not alice.connected))
        result = await guard(alice.publish("replies.ok", {"from": "alice"}, b"on it", urgent=True))
        assert result.state == "buffered"  # and on its way by SMS
        got = await guard(bob_inbox.get())
        assert got["subject"] == "replies.ok" and base64.b64decode(got["payload"]) == b"on it"
        mo = [e for e in sink.named("sms_received") if e.fields.get("reason") == "op=pub"]
        assert [e.uri for e in mo] == [ALICE]
    finally:
        await alice.close()
        await bob.close()
        await broker.close()
        await smsc.close()
