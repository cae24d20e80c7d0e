"""The SMPP backend (smpplib) bound to an SMSC: the broker's urgent
notification goes out as ``submit_sm``, the agent's buffer ack comes back as
``deliver_sm`` and removes the notification from the queue."""

from __future__ import annotations

from pathlib import Path

import pytest

from mdeci.config import HostPort, SmsGatewayKind
from mdeci.sms import segments_needed
from mdeci.store.repo import BrokerStore
from tests.broker.conftest import FakeClock
from tests.smsint.harness import (
    ALICE,
    ALICE_NO,
    BROKER_NO,
    Deaf,
    Sink,
    guard,
    plain_agent,
    sms_agent,
    sms_config,
    start_broker,
)
from tests.smsint.smppsim import SmppSim


# A gateway's reader thread must end quietly when the gateway closes (smpplib drops its
# socket under a blocked recv(): an AttributeError in the thread, once per run).
@pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")
async def test_urgent_notification_through_smpp_and_ack_back(
    tmp_path: Path, store: BrokerStore, clock: FakeClock, sink: Sink
) -> None:
    smsc = SmppSim()
    port = await smsc.start()
    sms = sms_config(
        gateway=SmsGatewayKind.SMPP,
        smpp_address=HostPort("127.0.0.1", port),
        smpp_system_id="mdeci-test",
        ttl=60.0,
        ack_timeout=5.0,
        ack_timeout_max=5.0,
    )
    broker = await start_broker(tmp_path, store, clock, sink, sms, None)
    sip_port = broker.sip_addr[1]
    alice = sms_agent(tmp_path, sip_port, smsc.phone(ALICE_NO))
    bob = plain_agent(tmp_path, "bob", "127.0.0.4", sip_port)
    try:
        assert smsc.binds == ["mdeci-test"]
        await alice.start()
        await bob.start()
        await guard(alice.wait_connected())
        await guard(bob.wait_connected())
        await guard(alice.subscribe("alerts.*"))
        inbox = alice.listen()
        Deaf(alice).on = True
        await guard(bob.publish("alerts.fire", {"level": 3}, bytes(300), urgent=True))
        await guard(sink.wait_for("media_disconnected", ALICE))
        record = await guard(inbox.get())
        assert record["nseq"] == 1
        done = await guard(sink.wait_for("notify_delivered", ALICE))
        assert done.fields["channel"] == "sms" and done.fields["nseq"] == 1
        await broker.service.settled()  # the row is deleted on the database thread
        assert store.queues.pending(ALICE) == []
        size = sink.named("sms_sent")[0].fields["bytes"]
        assert isinstance(size, int) and len(smsc.submitted) == segments_needed(size) == 4
        assert {s.sender for s in smsc.submitted} == {BROKER_NO}
        # The agent's part ack (segment 1 came; the broker then sent the other 3), its ack.
        assert [s.recipient for s in smsc.delivered] == [BROKER_NO, BROKER_NO]
    finally:
        await alice.close()
        await bob.close()
        await broker.close()
        await smsc.close()
