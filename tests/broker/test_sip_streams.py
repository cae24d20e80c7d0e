"""The broker over SIP/TCP and SIP/TLS, with our UA as the device: call, move (re-INVITE),
and the broker's own in-dialog request (the BYE of a replaced session) over the
transport of the device's Contact, never UDP. The TLS listener comes from
``[sip] transports = [..., "tls"]`` with certificate paths in the config, as an operator
writes it."""

from __future__ import annotations

import asyncio
import dataclasses
import secrets
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from mdeci.broker.app import RunningBroker, run_broker
from mdeci.config import SipConfig, load_broker_config
from mdeci.store.repo import BrokerStore
from rudp.aio import RudpEndpoint
from sip.aio.ua import DialogEnded, UaConfig, UserAgent
from sip.sdp import build_offer
from tests.broker.conftest import FakeClock, WaitingSink
from tests.broker.test_service import FAST, GUARD
from tests.broker.test_sip_endpoint import ALICE, BROKER, PASSWORDS, TIMERS, broker_config
from tests.sip.certs import Certs, make_certs


@pytest.fixture
def certs(tmp_path: Path) -> Certs:
    return make_certs(tmp_path / "certs")


@pytest.fixture
async def broker(
    tmp_path: Path, store: BrokerStore, clock: FakeClock, sink: WaitingSink, certs: Certs
) -> AsyncIterator[RunningBroker]:
    config = broker_config(tmp_path)
    config = dataclasses.replace(
        config,
        sip=dataclasses.replace(
            config.sip,
            transports=("udp", "tcp", "tls"),
            tls_port=0,
            tls_cert=certs.cert,
            tls_key=certs.key,
        ),
    )
    rb = await run_broker(config, sip_listen=("127.0.0.1", 0), store=store, log=sink, clock=clock)
    try:
        yield rb
    finally:
        await rb.close()


async def device(host: str, certs: Certs) -> tuple[UserAgent, RudpEndpoint]:
    ua = UserAgent(
        UaConfig(aor=ALICE, username="alice", password=PASSWORDS["alice"], timers=TIMERS,
                 tls_ca=str(certs.ca)),
    )  # fmt: skip
    await ua.start(host)
    return ua, await RudpEndpoint.open(host, 0, config=FAST)


def offer(rudp: RudpEndpoint, version: int) -> bytes:
    host, port = rudp.local_addr
    return build_offer("alice", 1, version, host, port, secrets.token_bytes(32)).encode()


@pytest.mark.parametrize("transport", ["tcp", "tls"])
async def test_session_over_a_stream_transport(
    broker: RunningBroker, sink: WaitingSink, certs: Certs, transport: str
) -> None:
    ua, rudp = await device("127.0.0.2", certs)
    try:
        if transport == "tls":
            assert broker.endpoint.ua.tls_addr is not None
            dest = broker.endpoint.ua.tls_addr
        else:
            dest = broker.sip_addr
        dialog, response = await asyncio.wait_for(
            ua.invite(BROKER, dest, offer(rudp, 1), transport=transport), GUARD
        )
        assert response.status == 200
        await sink.wait_for("session_started", ALICE)
        # The broker's Contact names the transport: our re-INVITE follows it.
        assert UserAgent.dialog_transport(dialog) == transport
        await asyncio.wait_for(ua.reinvite(dialog, offer(rudp, 2)), GUARD)
        # A second session replaces the first: the broker BYEs the old dialog, to our
        # Contact, over the same transport, never as a UDP datagram.
        await asyncio.wait_for(ua.invite(BROKER, dest, offer(rudp, 1), transport=transport), GUARD)
        while True:
            event = await asyncio.wait_for(ua.events.get(), GUARD)
            if isinstance(event, DialogEnded) and event.dialog.id == dialog.id:
                break
        assert event.reason == "bye received"
        assert ua.stats.received.get("udp", 0) == 0
        # The first INVITE's 401 and 200, then (credentials sent ahead) the re-INVITE's
        # 200, the second INVITE's 200 and the broker's BYE.
        assert ua.stats.received.get(transport, 0) >= 5
    finally:
        await ua.close()
        await rudp.close()


def test_tls_keys_in_the_broker_toml(tmp_path: Path, certs: Certs) -> None:
    path = tmp_path / "broker.toml"
    path.write_text(
        '[sip]\ntransports = ["udp", "tcp", "tls"]\ntls_port = 5061\n'
        f'tls_cert = "{certs.cert}"\ntls_key = "{certs.key}"\n'
    )
    sip = load_broker_config(path).sip
    assert (sip.tls_cert, sip.tls_key, sip.tls_port) == (certs.cert, certs.key, 5061)
    with pytest.raises(Exception, match="go together"):
        SipConfig(tls_cert=certs.cert)
