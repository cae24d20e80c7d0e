"""The broker's answer to offers naming the QUIC data channel (docs/sip.md
"UDP/MDECI-QUIC") for each ``[media] transports``: by default RUDP only, so an offer with
both lines gets RUDP, the QUIC line refused with port 0 (RFC 3264 §6), and an offer of
QUIC alone gets 488; a broker taking QUIC answers it with its server's port and
certificate fingerprint, the agent's QUIC connection carries the frames (sub, notify,
ack), the Session Manager records the transport, and a connection that ends marks the
user DISCONNECTED."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from pathlib import Path

import pytest

from mdeci.broker.app import RunningBroker, run_broker
from mdeci.frames import Ack, Frame, List, Notify, Pub, PubOk, Sub, SubOk, decode, encode
from mdeci.store.repo import BrokerStore
from mdeci.store.sessions import SessionStatus
from quicdata.aio import QuicDataClient, connect
from quicdata.connection import DEFAULT_CONFIG, QuicDataConfig
from sip.message import Response
from sip.sdp import MDECI_PROTO, MDECI_QUIC_PROTO, build_offer, parse_session
from tests.broker.conftest import FakeClock, WaitingSink
from tests.broker.test_service import FEED, GUARD
from tests.broker.test_sip_endpoint import BROKER, DOMAIN, Device, broker_config
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


async def quic_broker(
    tmp_path: Path, store: BrokerStore, clock: FakeClock, sink: WaitingSink, accept: tuple[str, ...]
) -> RunningBroker:
    config = broker_config(tmp_path)
    config = replace(config, media=replace(config.media, transports=accept))
    return await run_broker(
        config,
        sip_listen=("127.0.0.1", 0),
        media_listen=("127.0.0.1", 0),
        store=store,
        log=sink,
        clock=clock,
        expire_interval=3600.0,
    )


class QuicDevice(AutoDevice):
    """A device that speaks QUIC when the answer accepts it."""

    quic: QuicDataClient | None = None
    quic_config: QuicDataConfig = DEFAULT_CONFIG
    frames: asyncio.Queue[bytes]

    async def call_quic(self, broker: RunningBroker) -> tuple[Response, str]:
        offer = self.offer()
        self.dialog, response = await asyncio.wait_for(
            self.ua.invite(BROKER, broker.sip_addr, offer), GUARD
        )
        media = parse_session(response.body, transports=self.transports)
        assert media.key is not None
        self.key = self.keys.secret(media.key, offer, response.body)
        if media.transport == "quic":
            assert media.fingerprint is not None
            self.quic = await connect(
                (media.addr, media.port),
                self.key,
                media.fingerprint,
                local_host=self.host,
                config=self.quic_config,
            )
            assert self.quic.peer is not None
            self.frames = asyncio.Queue()
            self.quic.peer.on_message = self.frames.put_nowait
            await asyncio.wait_for(self.quic.peer.wait_connected(), GUARD)
        return response, media.transport

    def send(self, frame: Frame) -> None:
        assert self.quic is not None and self.quic.peer is not None
        self.quic.peer.send(encode(frame))

    async def next(self) -> Frame:
        return decode(await asyncio.wait_for(self.frames.get(), GUARD))

    async def close(self) -> None:
        if self.quic is not None:
            self.quic.close()
        await super().close()


@pytest.mark.parametrize("accept", [("quic",), ("rudp", "quic")])
async def test_a_broker_taking_quic_answers_it_and_the_frames_travel_over_it(
    tmp_path: Path,
    store: BrokerStore,
    clock: FakeClock,
    sink: WaitingSink,
    devices: list[Device],
    accept: tuple[str, ...],
) -> None:
    broker = await quic_broker(tmp_path, store, clock, sink, accept)
    try:
        alice = await QuicDevice.open("alice", "127.0.0.2")
        devices.append(alice)
        assert isinstance(alice, QuicDevice)
        response, transport = await alice.call_quic(broker)
        assert response.status == 200 and transport == "quic"
        assert broker.service.quic is not None
        quic_port = broker.service.quic.local_addr[1]
        lines = [line for line in response.body.decode().splitlines() if line.startswith("m=")]
        assert lines == [
            f"m=application {quic_port} {MDECI_QUIC_PROTO} mdeci",
            f"m=application 0 {MDECI_PROTO} mdeci",
        ]
        await broker.service.settled()
        session = broker.service.sessions.get("sip:alice@" + DOMAIN)
        assert session is not None and session.transport == "quic"
        # A QUIC user is one of the service's users (woken by other brokers' publishes),
        # and no RUDP association (the RUDP metrics).
        assert broker.service.users() == ["sip:alice@" + DOMAIN]
        assert broker.service.peers() == []
        alice.send(Sub(req=1, subject="stock.*"))
        assert isinstance(await alice.next(), SubOk)
        for n in range(1, 4):
            [reply] = await broker.service.worker.run(
                broker.broker.handle, FEED, Pub(req=n, msg_id=f"m{n}", subject="stock.x")
            )
            assert isinstance(reply, PubOk) and reply.matched == 1
        got = [await alice.next() for _ in range(3)]
        assert [f.nseq for f in got if isinstance(f, Notify)] == [1, 2, 3]
        alice.send(Ack(upto=3))
        # The connection ends (the agent is gone): the user is DISCONNECTED.
        assert alice.quic is not None
        alice.quic.close()
        uri = "sip:alice@" + DOMAIN
        event = await asyncio.wait_for(sink.wait_for("media_disconnected", uri), GUARD)
        assert "quic" in str(dict(event.fields).get("reason"))
        assert not broker.service.is_connected(uri)
    finally:
        await broker.close()


async def test_a_quic_only_broker_answers_an_rudp_offer_488(
    tmp_path: Path, store: BrokerStore, clock: FakeClock, sink: WaitingSink, devices: list[Device]
) -> None:
    broker = await quic_broker(tmp_path, store, clock, sink, ("quic",))
    try:
        alice = await QuicDevice.open("alice", "127.0.0.2")
        devices.append(alice)
        assert isinstance(alice, QuicDevice)
        alice.transports = ("rudp",)
        request = alice.ua.build_request("INVITE", BROKER, to=f"<{BROKER}>", body=alice.offer())
        response = await asyncio.wait_for(alice.ua.request(request, broker.sip_addr), GUARD)
        assert response.status == 488
        assert MDECI_QUIC_PROTO in (response.headers.get("Warning") or "")
    finally:
        await broker.close()


async def test_a_quic_connection_that_goes_silent_times_out_and_disconnects_the_user(
    tmp_path: Path, store: BrokerStore, clock: FakeClock, sink: WaitingSink, devices: list[Device]
) -> None:
    broker = await quic_broker(tmp_path, store, clock, sink, ("quic",))
    try:
        # QUIC's idle timeout, short: the connection is the peer's only sign of life.
        quick = QuicDataConfig(idle_timeout=0.5, keepalive=0.1)
        assert broker.service.quic is not None
        await broker.service.quic.close()
        await broker.service.open_quic("127.0.0.1", 0, quick)
        alice = await QuicDevice.open("alice", "127.0.0.2")
        devices.append(alice)
        assert isinstance(alice, QuicDevice)
        alice.quic_config = quick
        _, transport = await alice.call_quic(broker)
        assert transport == "quic"
        uri = "sip:alice@" + DOMAIN
        await asyncio.wait_for(sink.wait_for("media_connected", uri), GUARD)
        alice.send(Sub(req=1, subject="stock.*"))
        assert isinstance(await alice.next(), SubOk)
        # The device vanishes without a word (no CONNECTION_CLOSE): its socket is gone.
        assert alice.quic is not None and alice.quic._transport is not None
        alice.quic._transport.close()
        alice.quic._transport = None
        event = await asyncio.wait_for(sink.wait_for("media_disconnected", uri), GUARD)
        assert dict(event.fields).get("reason") == "quic: idle timeout"
        assert not broker.service.is_connected(uri)
        await broker.service.settled()
        row = store.sessions.get_session(uri)
        assert row is not None and row.status is SessionStatus.DISCONNECTED
    finally:
        await broker.close()


class _Watch(logging.Handler):
    """Sets ``event`` when the operator event ``name`` is logged (on the loop's thread)."""

    def __init__(self, name: str, event: asyncio.Event) -> None:
        super().__init__()
        self.name_ = name
        self.event = event

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage() == self.name_:
            self.event.set()


async def test_an_agent_that_acknowledges_nothing_over_quic_is_held_to_the_reply_cap(
    tmp_path: Path, store: BrokerStore, clock: FakeClock, sink: WaitingSink, devices: list[Device]
) -> None:
    """QUIC takes each reply at once, so what the broker holds for an agent that reads
    nothing is what its QUIC has not acknowledged: the cap on unacknowledged replies
    counts it (503, then dropped), as RUDP's unacknowledged replies."""
    cap = 1 << 16
    config = broker_config(tmp_path)
    config = replace(
        config,
        media=replace(config.media, transports=("quic",)),
        queue=replace(config.queue, max_unacked_reply_bytes=cap),
    )
    broker = await run_broker(
        config,
        sip_listen=("127.0.0.1", 0),
        media_listen=("127.0.0.1", 0),
        store=store,
        log=sink,
        clock=clock,
        expire_interval=3600.0,
    )
    try:
        alice = await QuicDevice.open("alice", "127.0.0.2")
        devices.append(alice)
        assert isinstance(alice, QuicDevice)
        await alice.call_quic(broker)
        for n in range(40):  # a listing of about 3 KB
            alice.send(Sub(req=n + 1, subject=f"stock.{n}.{'x' * 40}"))
            assert isinstance(await alice.next(), SubOk)
        # Alice stops reading her socket: she acknowledges nothing from now on.
        assert alice.quic is not None and alice.quic._transport is not None
        udp = alice.quic._transport
        asyncio.get_running_loop().remove_reader(udp._sock.fileno())
        refused = asyncio.Event()
        watch = _Watch("requests_refused", refused)
        logging.getLogger("mdeci.broker").addHandler(watch)
        try:
            for group in range(30):
                for n in range(10):
                    alice.send(List(req=1000 + 10 * group + n))
                # Pacing, not waiting for anything: the groups reach the broker in rounds
                # of their own, where the replies of earlier rounds are no longer in
                # flight as far as the futures tell.
                await asyncio.sleep(0.02)
            await asyncio.wait_for(refused.wait(), GUARD)
        finally:
            logging.getLogger("mdeci.broker").removeHandler(watch)
        link = broker.service._users["sip:alice@" + DOMAIN]
        await broker.service.settled()
        assert broker.service.refused_requests > 0
        # What it holds stays near the cap (past twice the cap requests are dropped).
        assert link.peer.backlog <= 2 * cap + 16384, link.peer.backlog
    finally:
        await broker.close()
