"""Kannel interop: MT through sendsms seen at fakesmsc; MO from fakesmsc at our get-url.

Starts its own bearerbox, smsbox and fakesmsc on free loopback ports.
"""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import cbor2
import pytest

from mdeci.sms.codec import Sms
from mdeci.sms.config import SmsConfig
from mdeci.sms.fakesmsc import mo_argument, parse_mt_line
from mdeci.sms.gateway import LinkRunner
from mdeci.sms.kannel import KannelConfig, KannelGateway, parse_mo_query, sendsms_url
from mdeci.sms.link import FrameReceived, SmsLink
from tests.peers import free_port
from tests.sms.events import EventLog
from tests.sms.kannel_harness import fakesmsc_phone, running_kannel
from tests.sms.world import notify_frame

BROKER, AGENT = "+15550000001", "+15550000002"
pytestmark = pytest.mark.peer("kannel")


def test_sendsms_url_and_mo_query_are_binary_safe() -> None:
    sms = Sms("+1", "+2", b"\x06\x05\x04\x3f\xac\x3f\xad", bytes(range(256))[:130])
    url = sendsms_url(KannelConfig(password="p&w"), sms)
    assert "udh=%06%05%04%3F%AC%3F%AD" in str(url)
    assert "password=p%26w" in str(url) and "coding=1" in str(url)
    query = url.raw_query_string.replace("username=mdeci&password=p%26w&", "")
    back = parse_mo_query(query.replace("from=", "from=").replace("to=", "to="))
    assert back == sms


def test_fakesmsc_lines() -> None:
    line = "2026-11-22 21:15:10 [1] [0] INFO: Got message 1: <+2 +1 udh %06%05 data %00%FF+z>"
    assert parse_mt_line(line) == Sms("+2", "+1", b"\x06\x05", b"\x00\xff z")
    assert parse_mt_line("INFO: fakesmsc starting") is None
    sms = Sms("+1", "+2", b"\x01\x02", b"a b")
    assert mo_argument(sms) == "+1 +2 udh %01%02 a%20b"


async def _read_mt(proc: asyncio.subprocess.Process, count: int, timeout: float) -> list[Sms]:
    assert proc.stdout is not None
    got: list[Sms] = []
    async with asyncio.timeout(timeout):
        while len(got) < count:
            line = await proc.stdout.readline()
            if not line:
                break
            sms = parse_mt_line(line.decode("latin-1"))
            if sms is not None:
                got.append(sms)
    return got


async def test_mt_and_mo_through_kannel(tmp_path: Path) -> None:
    log = EventLog()
    events = log.items
    gateway = KannelGateway(
        KannelConfig(callback_port=free_port(socket.SOCK_STREAM), password="test-pw")
    )
    # All segments at once: this test is about Kannel's MT/MO paths, not the link's steps
    # (the first-part ack is tested in test_link and end to end in tests/smsint).
    broker = LinkRunner(SmsLink(BROKER, SmsConfig(first_part_ack=False)), gateway, log.append)
    await broker.start()
    try:
        with running_kannel(tmp_path, gateway.callback_url) as kannel:
            gateway_cfg = KannelConfig(
                sendsms_url=kannel.sendsms_url,
                username=kannel.username,
                password=kannel.password,
            )
            gateway.config = gateway_cfg  # same server, now pointing at this smsbox
            # The phone: an agent link whose one MO (a small 'ack' frame) fakesmsc injects.
            agent = SmsLink(AGENT)
            ack_frame = cbor2.dumps({"op": "ack", "upto": 3})
            agent.send_frame(BROKER, ack_frame, 0.0)
            (mo,) = agent.sms_to_send()
            phone = await fakesmsc_phone(kannel.fakesmsc, kannel.fake_port, mo)
            try:
                frame = notify_frame(3, bytes(range(200)))  # 3 segments
                broker.send_frame(AGENT, frame)
                mts = await _read_mt(phone, 3, timeout=20)
                assert len(mts) == 3 and {m.sender for m in mts} == {BROKER}
                for sms in mts:
                    agent.receive_sms(sms, 1.0)
                assert agent.next_event() == FrameReceived(BROKER, frame)
                assert len(agent.sms_to_send()) == 1  # its ack (MO), ready for the phone
                await asyncio.wait_for(
                    log.wait_until(lambda ev: any(isinstance(e, FrameReceived) for e in ev)), 20
                )
                assert [e for e in events if isinstance(e, FrameReceived)] == [
                    FrameReceived(AGENT, ack_frame)
                ]
                assert broker.send_errors == 0
            finally:
                if phone.returncode is None:
                    phone.terminate()  # our own child, by its PID
                await phone.wait()
    finally:
        await broker.close()
