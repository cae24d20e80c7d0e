"""The broker's answer to offers naming the QUIC data channel (docs/sip.md
"UDP/MDECI-QUIC"): it accepts RUDP only, so an offer with both lines gets RUDP, the QUIC
line refused with port 0 (RFC 3264 §6), and a session that works; an offer of QUIC
alone gets 488."""

from __future__ import annotations

import asyncio

from mdeci.broker.app import RunningBroker
from mdeci.frames import Sub, SubOk
from sip.sdp import MDECI_PROTO, MDECI_QUIC_PROTO, build_offer, parse_session
from tests.broker.test_service import GUARD
from tests.broker.test_sip_endpoint import BROKER, Device
from tests.broker.test_sip_endpoint import devices as devices
from tests.broker.test_sip_endpoint import running as running


class AutoDevice(Device):
    """Offers QUIC first, then RUDP (an agent on ``transport = "auto"``)."""

    transports: tuple[str, ...] = ("quic", "rudp")

    def offer(self) -> bytes:
        port = self.rudp.local_addr[1]
        return build_offer(
            self.user, 1, self.version, self.host, port, self.keys.public,
            transports=self.transports, quic_port=port,
        ).encode()  # fmt: skip


async def test_an_offer_of_both_gets_rudp_and_the_quic_line_refused(
    running: RunningBroker, devices: list[Device]
) -> None:
    alice = await AutoDevice.open("alice", "127.0.0.2")
    devices.append(alice)
    response = await alice.call(running)
    assert response.status == 200
    lines = [line for line in response.body.decode().splitlines() if line.startswith("m=")]
    port = running.media_addr[1]
    assert lines == [
        f"m=application 0 {MDECI_QUIC_PROTO} mdeci",
        f"m=application {port} {MDECI_PROTO} mdeci",
    ]
    media = parse_session(response.body, transports=("quic", "rudp"))
    assert (media.transport, media.fingerprint) == ("rudp", None)
    assert alice.agent is not None  # keyed over both full bodies, as for one line
    await alice.agent.send(Sub(req=1, subject="stock.*"))
    assert isinstance(await alice.agent.next(), SubOk)


async def test_an_offer_of_quic_alone_gets_488(
    running: RunningBroker, devices: list[Device]
) -> None:
    alice = await AutoDevice.open("alice", "127.0.0.2")
    devices.append(alice)
    assert isinstance(alice, AutoDevice)
    alice.transports = ("quic",)
    request = alice.ua.build_request("INVITE", BROKER, to=f"<{BROKER}>", body=alice.offer())
    response = await asyncio.wait_for(alice.ua.request(request, running.sip_addr), GUARD)
    assert response.status == 488
    assert MDECI_PROTO in (response.headers.get("Warning") or "")
