"""The broker's SMS fallback through Kannel (bearerbox + smsbox from
a temp copy of configs/kannel.conf, fakesmsc as the phone, all on loopback).

MT: an urgent notification for DISCONNECTED alice leaves the broker through sendsms,
fakesmsc prints its segments, and alice's agent (whose SMS gateway reads fakesmsc's
output) hands it to the application. MO: a frame fakesmsc injects reaches the broker's
get-url callback (``sms_received``). Every SMS is sealed with the user's SMS keys: a
forged MO from alice's number is refused, logged, and changes nothing.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from mdeci.config import HostPort, SmsGatewayKind
from mdeci.frames import Ack, encode
from mdeci.sms.auth import KeyRing, MemoryCounters, Role, SmsAuth
from mdeci.sms.codec import Sms
from mdeci.sms.config import SmsConfig
from mdeci.sms.errors import GatewayError
from mdeci.sms.fakesmsc import parse_mt_line
from mdeci.sms.gateway import SmsHandler
from mdeci.sms.link import SmsLink
from mdeci.store.repo import BrokerStore
from mdeci.store.users import ha1
from tests.broker.conftest import FakeClock
from tests.sms.kannel_harness import fakesmsc_binary, fakesmsc_phone
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
from tests.smsint.kannel_sample import SENDSMS_PASSWORD, running_sample_kannel


def phone_link(password: str) -> SmsLink:
    """Alice's number with the SMS keys of ``password`` (hers is ``alice-secret``)."""
    ring = KeyRing(Role.DEVICE)
    ring.set(BROKER_NO, ha1("SHA-256", "alice", "localhost", password))
    auth = SmsAuth(ring.get, MemoryCounters(), clock=time.time)
    return SmsLink(ALICE_NO, SmsConfig(authenticated=True), auth=auth)


pytestmark = pytest.mark.peer("kannel")


class FakesmscPhone:
    """The agent's SMS gateway: MT read from fakesmsc's output. fakesmsc takes MO only on
    its command line, so the agent's buffer acks cannot go back (counted as send errors)."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self._task: asyncio.Task[None] | None = None

    async def start(self, on_sms: SmsHandler) -> None:
        self._task = asyncio.create_task(self._read(on_sms))

    async def _read(self, on_sms: SmsHandler) -> None:
        assert self.proc.stdout is not None
        while line := await self.proc.stdout.readline():
            sms = parse_mt_line(line.decode("latin-1"))
            if sms is not None:
                on_sms(sms)

    async def send(self, sms: Sms) -> None:
        raise GatewayError("fakesmsc takes MO only on its command line")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()


async def test_urgent_notification_through_kannel_and_mo_back(
    tmp_path: Path, store: BrokerStore, clock: FakeClock, sink: Sink
) -> None:
    fakesmsc = fakesmsc_binary()
    with running_sample_kannel(tmp_path) as kannel:
        sms = sms_config(
            gateway=SmsGatewayKind.KANNEL,
            kannel_sendsms_url=kannel.sendsms_url,
            kannel_password=SENDSMS_PASSWORD,
            kannel_callback=HostPort("127.0.0.1", kannel.callback_port),
            ttl=60.0,
            ack_timeout=30.0,  # fakesmsc cannot ack: no resend during the test
            ack_timeout_max=30.0,
            first_part_ack=False,  # nor part-ack: every segment goes at once
        )
        broker = await start_broker(tmp_path, store, clock, sink, sms, None)
        # The phone's one MO: a small frame from alice's number to the broker's.
        link = phone_link("alice-secret")
        link.send_frame(BROKER_NO, encode(Ack(upto=1)), 0.0)
        (mo,) = link.sms_to_send()
        phone = await fakesmsc_phone(fakesmsc, kannel.fake_port, mo)
        port = broker.sip_addr[1]
        alice = sms_agent(tmp_path, port, FakesmscPhone(phone))
        bob = plain_agent(tmp_path, "bob", "127.0.0.4", port)
        try:
            got_mo = await guard(sink.wait_for("sms_received"))
            assert got_mo.fields["reason"] == "op=ack"
            assert broker.sms is not None and broker.sms.received[0][0] == ALICE_NO

            await alice.start()
            await bob.start()
            await guard(alice.wait_connected())
            await guard(bob.wait_connected())
            await guard(alice.subscribe("alerts.*"))
            inbox = alice.listen()
            Deaf(alice).on = True
            payload = bytes(range(200))  # 3 SMS
            await guard(bob.publish("alerts.fire", {"level": 3}, payload, urgent=True))
            await guard(sink.wait_for("media_disconnected", ALICE))
            sent = await guard(sink.wait_for("sms_sent", ALICE))
            assert sent.fields["nseq"] == 1
            record = await guard(inbox.get())
            assert record["nseq"] == 1 and record["attrs"] == {"level": 3}
            await guard(alice.wait_event("sms_received", nseq=1))
            assert broker.sms.runner.send_errors == 0
            # No ack can come back through fakesmsc: still queued, still in flight.
            assert broker.sms.in_flight(ALICE) == (1,)
        finally:
            await alice.close()
            await bob.close()
            await broker.close()
            if phone.returncode is None:
                phone.terminate()  # our own child, by its PID
            await phone.wait()


async def test_a_forged_mo_from_the_victims_number_changes_nothing_and_is_logged(
    tmp_path: Path, store: BrokerStore, clock: FakeClock, sink: Sink
) -> None:
    fakesmsc = fakesmsc_binary()
    with running_sample_kannel(tmp_path) as kannel:
        sms = sms_config(
            gateway=SmsGatewayKind.KANNEL,
            kannel_sendsms_url=kannel.sendsms_url,
            kannel_password=SENDSMS_PASSWORD,
            kannel_callback=HostPort("127.0.0.1", kannel.callback_port),
            ttl=60.0,
            ack_timeout=30.0,  # nobody acks: no resend during the test
            ack_timeout_max=30.0,
            first_part_ack=False,
        )
        broker = await start_broker(tmp_path, store, clock, sink, sms, None)
        port = broker.sip_addr[1]
        alice = sms_agent(tmp_path, port, None)  # her phone is off: the SMS waits
        bob = plain_agent(tmp_path, "bob", "127.0.0.4", port)
        phone = None
        try:
            await alice.start()
            await bob.start()
            await guard(alice.wait_connected())
            await guard(bob.wait_connected())
            await guard(alice.subscribe("alerts.*"))
            Deaf(alice).on = True
            await guard(bob.publish("alerts.fire", {"level": 3}, b"fire", urgent=True))
            await guard(sink.wait_for("media_disconnected", ALICE))
            sent = await guard(sink.wait_for("sms_sent", ALICE))
            assert sent.fields["nseq"] == 1
            assert broker.sms is not None and broker.sms.in_flight(ALICE) == (1,)
            depth = store.queues.depth(ALICE)
            assert depth >= 1
            # Mallory knows alice's number and the format, not her password: a sealed
            # "ack everything" from alice's number, through Kannel like a real MO.
            forged_link = phone_link("mallory-guess")
            forged_link.send_frame(BROKER_NO, encode(Ack(upto=1_000_000)), 0.0)
            (forged,) = forged_link.sms_to_send()
            phone = await fakesmsc_phone(fakesmsc, kannel.fake_port, forged)
            logged = await guard(sink.wait_for("sms_received", ALICE))
            assert logged.fields["reason"] == "refused buffer: failed authentication"
            assert broker.sms.link.stats.unauthentic == 1
            assert list(broker.sms.received) == []  # never reached the frame handling
            assert store.queues.depth(ALICE) == depth
            assert broker.sms.in_flight(ALICE) == (1,)
        finally:
            await alice.close()
            await bob.close()
            await broker.close()
            if phone is not None:
                if phone.returncode is None:
                    phone.terminate()  # our own child, by its PID
                await phone.wait()
