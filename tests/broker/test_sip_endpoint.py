"""The broker as a SIP endpoint, on loopback with real sockets: our UserAgent plays the
device (digest REGISTER and INVITE with our SDP), a RudpEndpoint plays its data channel."""

from __future__ import annotations

import asyncio
import copy
import secrets
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from mdeci.broker.app import RunningBroker, run_broker
from mdeci.broker.sink import ChurnEvent
from mdeci.config import AuthConfig, BrokerConfig, HostPort, RegistrarConfig, SipConfig, UserConfig
from mdeci.frames import Ack, Pub, PubOk, Sub, SubOk
from mdeci.store.repo import BrokerStore
from mdeci.store.sessions import SessionStatus
from rudp.aio import RudpEndpoint
from sip.aio.ua import UaConfig, UserAgent
from sip.auth import DigestConfig, DigestServer, MemoryCredentialStore
from sip.dialog import Dialog
from sip.errors import SipRequestFailed
from sip.message import Response
from sip.registrar import MemoryBindingStore, Registrar
from sip.registrar import RegistrarConfig as SipRegistrarConfig
from sip.sdp import build_offer, parse_session
from sip.tools.registrar import RegistrarService
from sip.transaction import TimerConfig
from tests.broker.conftest import FakeClock, WaitingSink
from tests.broker.test_service import FAST, GUARD, Agent
from tests.keyx import OfferKeys

DOMAIN = "example.org"
BROKER = f"sip:broker@{DOMAIN}"
ALICE = f"sip:alice@{DOMAIN}"
BOB = f"sip:bob@{DOMAIN}"
PASSWORDS = {"alice": "alice-secret", "bob": "bob-secret"}
TIMERS = TimerConfig(t1=0.05, t2=0.2, t4=0.25)


def broker_config(tmp_path: Path) -> BrokerConfig:
    return BrokerConfig(
        domain=DOMAIN,
        data_dir=tmp_path,
        sip=SipConfig(host="127.0.0.1", port=0, t1=0.05, t2=0.2, t4=0.25),
        rudp=FAST,
        auth=AuthConfig(
            users=(
                UserConfig(user="alice", password=PASSWORDS["alice"]),
                UserConfig(user="bob", password=PASSWORDS["bob"], msisdn="+5521999990002"),
            )
        ),
    )


async def start_broker(
    tmp_path: Path,
    store: BrokerStore,
    clock: FakeClock,
    sink: WaitingSink,
    sip_port: int = 0,
    monotonic: Callable[[], float] = time.monotonic,
) -> RunningBroker:
    return await run_broker(
        broker_config(tmp_path),
        sip_listen=("127.0.0.1", sip_port),
        media_listen=("127.0.0.1", 0),
        store=store,
        log=sink,
        clock=clock,
        expire_interval=3600.0,  # tests sweep by hand
        monotonic=monotonic,
    )


@pytest.fixture
async def running(
    tmp_path: Path, store: BrokerStore, clock: FakeClock, sink: WaitingSink
) -> AsyncIterator[RunningBroker]:
    rb = await start_broker(tmp_path, store, clock, sink)
    try:
        yield rb
    finally:
        await rb.close()


@pytest.fixture
async def running_any(
    tmp_path: Path, any_store: BrokerStore, clock: FakeClock, sink: WaitingSink
) -> AsyncIterator[RunningBroker]:
    """A broker on SQLite, then on PostgreSQL (skipped unless MDECI_TEST_PG_URL)."""
    rb = await start_broker(tmp_path, any_store, clock, sink)
    try:
        yield rb
    finally:
        await rb.close()


@dataclass
class Device:
    """A device: a SIP UA and a RUDP endpoint on one loopback address."""

    user: str
    ua: UserAgent
    rudp: RudpEndpoint
    keys: OfferKeys
    host: str
    version: int = 1
    key: bytes = b""  # the RUDP session secret, once the INVITE is answered
    dialog: Dialog | None = None
    agent: Agent | None = None

    @classmethod
    async def open(
        cls, user: str, host: str, password: str | None = None, *, aor: str | None = None
    ) -> Device:
        ua = UserAgent(
            UaConfig(
                aor=aor or f"sip:{user}@{DOMAIN}",
                username=user,
                password=PASSWORDS[user] if password is None else password,
                timers=TIMERS,
            )
        )
        await ua.start(host, 0)
        rudp = await RudpEndpoint.open(host, 0, config=FAST)
        keys = OfferKeys(user, DOMAIN, PASSWORDS.get(user, "") if password is None else password)
        return cls(user, ua, rudp, keys, host)

    def offer(self) -> bytes:
        port = self.rudp.local_addr[1]
        return build_offer(self.user, 1, self.version, self.host, port, self.keys.public).encode()

    async def call(self, broker: RunningBroker) -> Response:
        offer = self.offer()
        self.dialog, response = await asyncio.wait_for(
            self.ua.invite(BROKER, broker.sip_addr, offer), GUARD
        )
        media = parse_session(response.body)
        assert media.key is not None
        self.key = self.keys.secret(media.key, offer, response.body)
        self.agent = Agent(self.rudp, self.rudp.peer(self.key, (media.addr, media.port)), self.key)
        return response

    async def move(self, host: str) -> None:
        self.host = host
        await self.rudp.rebind(host, 0)

        def body(_dialog: Dialog) -> bytes:
            self.version += 1
            return self.offer()

        await asyncio.wait_for(self.ua.move(host, 0, reinvite_body=body), GUARD)

    async def close(self) -> None:
        if self.agent is not None:
            await self.agent.close()
        else:
            await self.rudp.close()
        await self.ua.close()


@pytest.fixture
async def devices() -> AsyncIterator[list[Device]]:
    opened: list[Device] = []
    yield opened
    for d in opened:
        await d.close()


async def open_device(devices: list[Device], user: str, host: str, **kw: object) -> Device:
    dev = await Device.open(user, host, **kw)  # type: ignore[arg-type]
    devices.append(dev)
    return dev


def fields(event: ChurnEvent) -> dict[str, object]:
    return dict(event.fields)


async def test_register_call_publish_move_bye(
    running_any: RunningBroker,
    clock: FakeClock,
    sink: WaitingSink,
    devices: list[Device],
) -> None:
    running, store = running_any, running_any.store
    alice = await open_device(devices, "alice", "127.0.0.2")
    bob = await open_device(devices, "bob", "127.0.0.4")

    # REGISTER with digest: the binding is in SQL, the churn log has it.
    await asyncio.wait_for(alice.ua.register(running.sip_addr, 600), GUARD)
    bindings = store.bindings.bindings(ALICE, clock())
    assert [b.contact for b in bindings] == [alice.ua.contact_uri]
    registered = await sink.wait_for("registered", ALICE)
    assert fields(registered)["addr"] == f"127.0.0.2:{alice.ua.local_addr[1]}"

    # INVITE: answered on the broker's RUDP address; the session is stored CONNECTED.
    response = await alice.call(running)
    answer = parse_session(response.body)
    assert (answer.addr, answer.port) == running.media_addr
    # The answer carries the broker's X25519 public value, never a key.
    assert answer.key is not None and answer.key != alice.keys.public
    assert alice.key not in response.body and alice.key.hex().encode() not in response.body
    started = await sink.wait_for("session_started", ALICE)
    await sink.wait_for("media_connected", ALICE)
    assert alice.dialog is not None
    assert fields(started)["call_id"] == alice.dialog.call_id
    session = store.sessions.get_session(ALICE)
    assert session is not None
    assert session.status is SessionStatus.CONNECTED
    assert session.session_key == alice.key
    assert session.media_addr == f"127.0.0.2:{alice.rudp.local_addr[1]}"
    assert session.call_id == alice.dialog.call_id
    assert session.remote_tag == alice.dialog.local_tag

    await bob.call(running)
    await sink.wait_for("media_connected", BOB)
    bob_session = store.sessions.get_session(BOB)
    assert bob_session is not None and bob_session.msisdn == "+5521999990002"  # from config

    assert alice.agent is not None and bob.agent is not None
    await alice.agent.send(Sub(req=1, subject="stock.*", filter="price < 25"))
    assert isinstance(await alice.agent.next(), SubOk)
    await bob.agent.send(Pub(req=1, msg_id="m1", subject="stock.petr4", attrs={"price": 20}))
    ok = await bob.agent.next()
    assert isinstance(ok, PubOk) and ok.matched == 1
    first = await alice.agent.next_notify()
    assert first.msg_id == "m1"
    await alice.agent.send(Ack(upto=first.nseq))

    # The device moves: new SIP contact and new RUDP address; delivery follows.
    old_media = f"127.0.0.2:{alice.rudp.local_addr[1]}"
    await alice.move("127.0.0.3")
    reinvited = await sink.wait_for("session_reinvited", ALICE)
    new_media = f"127.0.0.3:{alice.rudp.local_addr[1]}"
    assert fields(reinvited)["addr"] == new_media
    assert fields(reinvited)["prev_addr"] == old_media
    session = store.sessions.get_session(ALICE)
    assert session is not None and session.media_addr == new_media
    assert "127.0.0.3" in session.remote_target
    contacts = [b.contact for b in store.bindings.bindings(ALICE, clock())]
    assert alice.ua.contact_uri in contacts and "127.0.0.3" in alice.ua.contact_uri
    await bob.agent.send(Pub(req=2, msg_id="m2", subject="stock.vale3", attrs={"price": 10}))
    assert isinstance(await bob.agent.next(), PubOk)
    second = await alice.agent.next_notify()
    assert second.msg_id == "m2" and second.nseq > first.nseq
    assert fields(await sink.wait_for("media_connected", ALICE, count=2))["addr"] == new_media

    # BYE ends the session; the row stays, ENDED.
    assert alice.dialog is not None
    await asyncio.wait_for(alice.ua.bye(alice.dialog), GUARD)
    ended = await sink.wait_for("session_ended", ALICE)
    assert fields(ended)["call_id"] == alice.dialog.call_id
    assert not running.service.is_connected(ALICE)
    session = store.sessions.get_session(ALICE)
    assert session is not None and session.status is SessionStatus.ENDED


async def test_unregister_and_expiry_are_logged(
    running: RunningBroker,
    store: BrokerStore,
    clock: FakeClock,
    sink: WaitingSink,
    devices: list[Device],
) -> None:
    alice = await open_device(devices, "alice", "127.0.0.2")
    bob = await open_device(devices, "bob", "127.0.0.4")
    await alice.ua.register(running.sip_addr, 600)
    await bob.ua.register(running.sip_addr, 60)
    await alice.ua.unregister()
    assert (await sink.wait_for("unregistered", ALICE)).uri == ALICE
    assert store.bindings.bindings(ALICE, clock()) == []
    clock.advance(61)
    assert await running.endpoint.expire_now() == 1
    assert (await sink.wait_for("registration_expired", BOB)).uri == BOB
    assert store.bindings.bindings(BOB, clock()) == []


async def test_wrong_password_is_refused(running: RunningBroker, devices: list[Device]) -> None:
    mallory = await open_device(devices, "alice", "127.0.0.2", password="guess")
    # Our UA answers the first challenge; the second 401 is final.
    with pytest.raises(SipRequestFailed) as reg:
        await asyncio.wait_for(mallory.ua.register(running.sip_addr, 600), GUARD)
    assert reg.value.status == 401
    with pytest.raises(SipRequestFailed) as inv:
        await mallory.call(running)
    assert inv.value.status == 401
    assert running.store.sessions.get_session(ALICE) is None


async def test_invite_as_someone_else_is_forbidden(
    running: RunningBroker, devices: list[Device]
) -> None:
    # bob's own credentials, alice's AOR in From.
    bob_as_alice = await open_device(devices, "bob", "127.0.0.2", aor=ALICE)
    with pytest.raises(SipRequestFailed) as exc:
        await bob_as_alice.call(running)
    assert exc.value.status == 403
    with pytest.raises(SipRequestFailed) as reg:
        await bob_as_alice.ua.register(running.sip_addr, 600)
    assert reg.value.status == 403
    assert running.store.sessions.get_session(ALICE) is None


async def test_request_in_another_users_session_is_forbidden(
    running: RunningBroker, sink: WaitingSink, devices: list[Device]
) -> None:
    alice = await open_device(devices, "alice", "127.0.0.2")
    bob = await open_device(devices, "bob", "127.0.0.4")
    await alice.call(running)
    await sink.wait_for("media_connected", ALICE)
    assert alice.dialog is not None
    # bob learned alice's Call-ID and tags and re-INVITEs in her dialog as himself.
    stolen = copy.copy(alice.dialog)
    stolen.local_uri = BOB
    request = stolen.create_request(
        "INVITE", via=bob.ua._via("udp"), contact=bob.ua.contact_header(), body=bob.offer()
    )
    request.headers.set("Content-Type", "application/sdp")
    response = await asyncio.wait_for(bob.ua.request(request, running.sip_addr), GUARD)
    assert response.status == 403
    assert "session of sip:alice@example.org" in (response.headers.get("Warning") or "")
    assert sink.named("session_reinvited") == []
    assert running.endpoint.session_of(ALICE) is not None


async def test_offer_without_our_line_gets_488(
    running: RunningBroker, devices: list[Device]
) -> None:
    alice = await open_device(devices, "alice", "127.0.0.2")
    sdp = (
        "v=0\r\no=alice 1 1 IN IP4 127.0.0.2\r\ns=-\r\nc=IN IP4 127.0.0.2\r\nt=0 0\r\n"
        "m=audio 4000 RTP/AVP 0\r\na=rtpmap:0 PCMU/8000\r\n"
    )
    request = alice.ua.build_request("INVITE", BROKER, to=f"<{BROKER}>", body=sdp.encode())
    response = await asyncio.wait_for(alice.ua.request(request, running.sip_addr), GUARD)
    assert response.status == 488
    assert "MDECI-RUDP" in (response.headers.get("Warning") or "")
    # An offer with our line but no key is refused too.
    nokey = build_offer("alice", 1, 1, "127.0.0.2", 4000, b"k" * 32).replace(
        "a=mdeci-kx:", "a=x-key:"
    )
    request = alice.ua.build_request("INVITE", BROKER, to=f"<{BROKER}>", body=nokey.encode())
    response = await asyncio.wait_for(alice.ua.request(request, running.sip_addr), GUARD)
    assert response.status == 488


async def test_other_users_are_not_found(running: RunningBroker, devices: list[Device]) -> None:
    alice = await open_device(devices, "alice", "127.0.0.2")
    carol = f"sip:carol@{DOMAIN}"
    request = alice.ua.build_request("INVITE", carol, to=f"<{carol}>", body=alice.offer())
    response = await asyncio.wait_for(alice.ua.request(request, running.sip_addr), GUARD)
    assert response.status == 404


class _Catcher(asyncio.DatagramProtocol):
    def __init__(self) -> None:
        self.received: asyncio.Queue[bytes] = asyncio.Queue()

    def datagram_received(self, data: bytes, addr: tuple[str | int, ...]) -> None:
        self.received.put_nowait(data)


async def test_garbage_gets_400_and_the_broker_keeps_serving(
    running: RunningBroker, sink: WaitingSink, devices: list[Device]
) -> None:
    loop = asyncio.get_running_loop()
    transport, catcher = await loop.create_datagram_endpoint(_Catcher, local_addr=("127.0.0.1", 0))
    try:
        port = transport.get_extra_info("sockname")[1]
        transport.sendto(
            b"INVITE sip:broker@example.org SIP/2.0\r\n"
            b"Via: SIP/2.0/UDP 127.0.0.1:%d;branch=z9hG4bKjunk\r\n"
            b"CSeq: banana INVITE\r\n"
            b"Padding: %s\r\n\r\n" % (port, b"x" * 300),  # else too small for an answer
            running.sip_addr,
        )
        transport.sendto(b"\x00\xff not sip at all", running.sip_addr)
        # The reply echoes our broken CSeq, so it is checked as text, not parsed.
        reply = await asyncio.wait_for(catcher.received.get(), GUARD)
        assert reply.startswith(b"SIP/2.0 400 ")
        assert b"Warning: 399 mdeci" in reply
    finally:
        transport.close()
    alice = await open_device(devices, "alice", "127.0.0.2")
    await alice.call(running)
    await sink.wait_for("media_connected", ALICE)


async def test_new_invite_replaces_the_old_session(
    running: RunningBroker, store: BrokerStore, sink: WaitingSink, devices: list[Device]
) -> None:
    first = await open_device(devices, "alice", "127.0.0.2")
    await first.call(running)
    await sink.wait_for("media_connected", ALICE)
    # The agent restarted: a new UA, a new key, a new dialog.
    second = await open_device(devices, "alice", "127.0.0.3")
    await second.call(running)
    await sink.wait_for("session_started", ALICE, count=2)
    await sink.wait_for("media_connected", ALICE, count=2)
    assert second.dialog is not None and first.dialog is not None
    session = store.sessions.get_session(ALICE)
    assert session is not None
    assert session.call_id == second.dialog.call_id and session.session_key == second.key
    # The old dialog got a BYE from the broker; ending it does not end the new session.
    assert second.agent is not None
    await second.agent.send(Sub(req=1, subject="a.b"))
    assert isinstance(await second.agent.next(), SubOk)
    assert sink.named("session_ended") == []
    assert running.endpoint.session_of(ALICE) == (
        second.dialog.call_id,
        ("127.0.0.3", second.rudp.local_addr[1]),
    )


async def test_sessions_survive_a_broker_restart(
    tmp_path: Path,
    store: BrokerStore,
    clock: FakeClock,
    sink: WaitingSink,
    devices: list[Device],
) -> None:
    first = await start_broker(tmp_path, store, clock, sink)
    sip_port = first.sip_addr[1]
    try:
        alice = await open_device(devices, "alice", "127.0.0.2")
        await alice.call(running := first)
        await sink.wait_for("media_connected", ALICE)
    finally:
        await running.close()
    # The restored peer will be a new RUDP incarnation (sender id) under the old key: an
    # agent side that heard the first broker (its first keepalive: a matter of timing)
    # refuses it as unknown_sender, which is why the real agent re-keys (docs/agent.md).
    # A fresh agent side under the same key has heard no one: only the restored key can
    # answer it.
    assert alice.agent is not None
    alice.agent._reader.cancel()
    alice.rudp.remove_peer(alice.key)
    alice.agent = Agent(alice.rudp, alice.rudp.peer(alice.key, alice.agent.peer.addr), alice.key)
    heard = asyncio.Event()
    alice.agent.peer.on_heard = heard.set
    # Same SIP address, a new media port: the dialog and the peer come back from SQL.
    second = await start_broker(tmp_path, store, clock, sink, sip_port=sip_port)
    try:
        await sink.wait_for("media_connected", ALICE, count=2)
        # The restored association speaks first (a PING), before the agent says anything:
        # what makes a real agent resume at once (docs/protocol.md §4).
        await asyncio.wait_for(heard.wait(), 5.0)
        await alice.move("127.0.0.3")  # a re-INVITE in the dialog of the first process
        reinvited = await sink.wait_for("session_reinvited", ALICE)
        assert fields(reinvited)["addr"] == f"127.0.0.3:{alice.rudp.local_addr[1]}"
        assert alice.agent is not None
        alice.agent.peer.set_address(second.media_addr)
        await alice.agent.send(Sub(req=7, subject="x.y"))
        assert isinstance(await alice.agent.next(), SubOk)
    finally:
        await second.close()


async def test_a_restarting_broker_listens_for_sip_once_its_sessions_are_back(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    store: BrokerStore,
    clock: FakeClock,
    sink: WaitingSink,
    devices: list[Device],
) -> None:
    """A request that came while the sessions were still being read would find no dialog
    (481) or no cached credentials (a second 401): SIP is bound after the restore, and
    a re-INVITE sent meanwhile succeeds on its retransmission."""
    first = await start_broker(tmp_path, store, clock, sink)
    sip_port = first.sip_addr[1]
    try:
        alice = await open_device(devices, "alice", "127.0.0.2")
        await alice.call(first)
        await sink.wait_for("media_connected", ALICE)
    finally:
        await first.close()
    # The restore's read of the stored sessions waits until the test lets it go.
    reading, release = threading.Event(), threading.Event()
    owned = store.sessions.owned_sessions

    def held(*args: Any) -> Any:
        reading.set()
        release.wait(GUARD)
        return owned(*args)

    monkeypatch.setattr(store.sessions, "owned_sessions", held)
    starting = asyncio.create_task(start_broker(tmp_path, store, clock, sink, sip_port=sip_port))
    try:
        assert await asyncio.to_thread(reading.wait, GUARD)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.bind(("127.0.0.1", sip_port))  # free: nothing answers SIP yet
        moving = asyncio.create_task(alice.move("127.0.0.3"))
        release.set()
        second = await starting
    finally:
        release.set()
    try:
        await moving  # its re-INVITE went unanswered, then its retransmission was served
        reinvited = await sink.wait_for("session_reinvited", ALICE)
        assert fields(reinvited)["addr"] == f"127.0.0.3:{alice.rudp.local_addr[1]}"
        assert second.endpoint.digest.failures == 0
    finally:
        await second.close()


async def test_external_registrar_mode(
    tmp_path: Path, store: BrokerStore, clock: FakeClock, sink: WaitingSink, devices: list[Device]
) -> None:
    # A registrar of the domain elsewhere (our sip.tools registrar, in-process).
    creds = MemoryCredentialStore()
    creds.add_password("broker", DOMAIN, "broker-secret")
    registrar = Registrar(
        SipRegistrarConfig(domains=(DOMAIN, "127.0.0.1")),
        MemoryBindingStore(),
        secrets.token_bytes,
        auth=DigestServer(DigestConfig(realm=DOMAIN), creds, secrets.token_bytes),
    )
    home = UserAgent(
        UaConfig(aor=f"sip:registrar@{DOMAIN}", methods=frozenset({"REGISTER"})),
        RegistrarService(registrar, True),
    )
    home_addr = await home.start("127.0.0.1", 0)
    loop = asyncio.get_running_loop()
    config = broker_config(tmp_path)
    config = replace(
        config,
        registrar=RegistrarConfig(embedded=False, address=HostPort(*home_addr)),
        auth=replace(
            config.auth,
            users=(*config.auth.users, UserConfig(user="broker", password="broker-secret")),
        ),
    )
    rb = await run_broker(config, sip_listen=("127.0.0.1", 0), store=store, log=sink, clock=clock)
    try:
        (binding,) = registrar.lookup(BROKER, loop.time())
        assert binding.contact == rb.endpoint.ua.contact_uri
        # Devices register at the home registrar, not here; INVITEs work as before.
        alice = await open_device(devices, "alice", "127.0.0.2")
        with pytest.raises(SipRequestFailed) as exc:
            await alice.ua.register(rb.sip_addr, 600)
        assert exc.value.status == 405
        await alice.call(rb)
        await sink.wait_for("media_connected", ALICE)
    finally:
        await rb.close()
        await home.close()
    assert registrar.lookup(BROKER, loop.time()) == []  # unregistered at close
