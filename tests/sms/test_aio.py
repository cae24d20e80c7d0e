"""The asyncio glue on a real loop: two links over the embedded simulated SMSC."""

from __future__ import annotations

import asyncio

import pytest

from mdeci.sms.codec import Sms
from mdeci.sms.config import SmsConfig
from mdeci.sms.errors import GatewayError
from mdeci.sms.gateway import LinkRunner, SimulatedNetwork
from mdeci.sms.link import BufferAcknowledged, FrameReceived, LinkEvent, SmsLink
from mdeci.sms.smsc import DelayBin, SmscConfig
from tests.sms.events import EventLog

A, B = "+1000", "+2000"


async def test_frames_and_acks_over_the_simulated_network() -> None:
    net = SimulatedNetwork(
        SmscConfig(delays=(DelayBin(1.0, 0.001, 0.02),), loss=0.2, duplicate=0.2), seed=5
    )
    cfg = SmsConfig(ack_timeout=0.1, ack_timeout_max=0.4, default_ttl=10.0)
    log_a, log_b = EventLog(), EventLog()
    got_a, got_b = log_a.items, log_b.items
    a = LinkRunner(SmsLink(A, cfg), net.gateway(A), log_a.append)
    b = LinkRunner(SmsLink(B, cfg), net.gateway(B), log_b.append)
    await a.start()
    await b.start()
    frames = [bytes([i]) * (50 * i + 1) for i in range(1, 8)]
    ids = [a.send_frame(B, f) for f in frames]

    def all_acked(events: list[LinkEvent]) -> bool:
        return sum(isinstance(e, BufferAcknowledged) for e in events) >= len(frames)

    await asyncio.wait_for(log_a.wait_until(all_acked), 10)
    assert sorted(e.frame for e in got_b if isinstance(e, FrameReceived)) == sorted(frames)
    assert {e.buffer_id for e in got_a if isinstance(e, BufferAcknowledged)} == set(ids)
    await a.close()
    await b.close()


async def test_a_gateway_sends_only_as_its_own_number() -> None:
    net = SimulatedNetwork()
    gw = net.gateway(A)
    with pytest.raises(GatewayError):
        await gw.send(Sms(B, A, b"", b"x"))
