# ruff: noqa: F811 - the fixtures of test_sip_endpoint are imported by name
"""Hardening of the running broker (or its store), each bound shown: failed logins,
generic errors, MSISDN, bound public values, MD5."""

from __future__ import annotations

import asyncio
import logging
import os
import stat
from pathlib import Path

import pytest
import sqlalchemy as sa

from mdeci.broker.app import RunningBroker
from mdeci.config import SubscriptionConfig, load_broker_config
from mdeci.store.base import make_engine
from mdeci.store.repo import BrokerStore
from mdeci.store.sessions import SessionStatus
from sip.errors import SipError
from sip.sdp import build_offer
from tests.broker.conftest import FakeClock, WaitingSink
from tests.broker.test_service import GUARD
from tests.broker.test_sip_endpoint import (  # noqa: F401 - fixtures
    ALICE,
    BOB,
    BROKER,
    Device,
    devices,
    open_device,
    running,
    start_broker,
)

ROOT = Path(__file__).resolve().parents[2]


async def raw_register(sip_addr: tuple[str, int]) -> bytes:
    """One REGISTER without credentials from a plain socket; the first answer's bytes."""
    loop = asyncio.get_running_loop()
    got: asyncio.Future[bytes] = loop.create_future()

    class Once(asyncio.DatagramProtocol):
        def datagram_received(self, data: bytes, addr: tuple[str | int, ...]) -> None:
            if not got.done():
                got.set_result(data)

    transport, _ = await loop.create_datagram_endpoint(Once, local_addr=("127.0.0.2", 0))
    port = transport.get_extra_info("sockname")[1]
    text = (
        "REGISTER sip:example.org SIP/2.0\r\n"
        f"Via: SIP/2.0/UDP 127.0.0.2:{port};branch=z9hG4bK{port}x;rport\r\n"
        "Max-Forwards: 70\r\nFrom: <sip:alice@example.org>;tag=1\r\n"
        "To: <sip:alice@example.org>\r\nCall-ID: raw-1\r\nCSeq: 1 REGISTER\r\n"
        f"Contact: <sip:alice@127.0.0.2:{port}>\r\n"
        f"Padding: {'x' * 400}\r\n"  # else smaller than the challenge: no answer
        "Content-Length: 0\r\n\r\n"
    )
    try:
        getattr(transport, "sendto")(text.encode(), sip_addr)  # noqa: B009
        return await asyncio.wait_for(got, GUARD)
    finally:
        transport.close()


async def test_failed_logins_are_logged_and_locked(
    tmp_path: Path,
    store: BrokerStore,
    clock: FakeClock,
    sink: WaitingSink,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Each failed login is one line with its source; after 5 the user and the source
    address are locked for 30 s of the monotonic clock: the source on every port, the
    user from every source that has failed (a clean one still gets in)."""
    caplog.set_level(logging.WARNING, logger="mdeci.broker")
    monotonic = FakeClock(0.0)
    running = await start_broker(tmp_path, store, clock, sink, monotonic=monotonic)
    devices: list[Device] = []
    try:
        await _lockout_ends_after_30_s(running, devices, monotonic, caplog)
    finally:
        for device in devices:
            await device.close()
        await running.close()


async def test_credentials_go_ahead_and_a_restarted_broker_logs_no_failed_login(
    tmp_path: Path,
    store: BrokerStore,
    clock: FakeClock,
    sink: WaitingSink,
    devices: list[Device],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """After one challenge, the device's REGISTER refresh and INVITE carry credentials
    ahead and are answered at once (one request each, not a challenged one and its
    retry). A restarted broker (a new nonce secret) finds the password right on a nonce
    it never issued: 401 stale=true, answered at once, and no failed login."""
    caplog.set_level(logging.WARNING, logger="mdeci.broker")
    first = await start_broker(tmp_path, store, clock, sink)
    try:
        alice = await open_device(devices, "alice", "127.0.0.2")
        await asyncio.wait_for(alice.ua.register(first.sip_addr, 600), GUARD)
        received = first.endpoint.ua.stats.received
        before = received["udp"]
        await asyncio.wait_for(alice.ua.register(first.sip_addr, 600), GUARD)
        await alice.call(first)
        await sink.wait_for("session_started", ALICE)
        assert received["udp"] - before == 3  # REGISTER, INVITE, the 2xx's ACK
    finally:
        await first.close()
    second = await start_broker(tmp_path, store, clock, sink)
    try:
        await asyncio.wait_for(alice.ua.register(second.sip_addr, 600), GUARD)
        assert second.endpoint.ua.stats.received["udp"] == 2  # stale 401, then 200
        assert second.endpoint.digest.failures == 0
    finally:
        await second.close()
    assert _fields(caplog, "auth_failed") == []


def _fields(caplog: pytest.LogCaptureFixture, event: str) -> list[dict[str, object]]:
    return [
        r.mdeci_fields  # type: ignore[attr-defined]
        for r in caplog.records
        if r.getMessage() == event
    ]


async def _lockout_ends_after_30_s(
    running: RunningBroker,
    devices: list[Device],
    monotonic: FakeClock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    guesser = await open_device(devices, "alice", "127.0.0.2", password="guess")
    for _ in range(5):
        with pytest.raises(SipError):
            await asyncio.wait_for(guesser.ua.register(running.sip_addr, 600), GUARD)
    failures = _fields(caplog, "auth_failed")
    assert len(failures) == 5  # one line per failed login, and no other
    assert len([r for r in caplog.records if r.name.startswith("mdeci")]) == 5
    assert all(f["user"] == "alice" and str(f["source"]).startswith("127.0.0.2:") for f in failures)
    assert "guess" not in caplog.text  # no secret in the log
    assert failures[-1].get("locked") == "user and source" and "locked" not in failures[0]
    # The source is locked on every port: the right password from a new socket is not checked.
    same_host = await open_device(devices, "alice", "127.0.0.2")
    with pytest.raises(SipError):
        await asyncio.wait_for(same_host.ua.register(running.sip_addr, 600), GUARD)
    assert _fields(caplog, "auth_failed")[-1]["reason"] == "too many failed logins"
    # The user is locked against a source that has failed too...
    typo = await open_device(devices, "alice", "127.0.0.4", password="typo")
    with pytest.raises(SipError):
        await asyncio.wait_for(typo.ua.register(running.sip_addr, 600), GUARD)
    retry = await open_device(devices, "alice", "127.0.0.4")
    with pytest.raises(SipError):
        await asyncio.wait_for(retry.ua.register(running.sip_addr, 600), GUARD)
    # ...but not against a clean one: the owner gets in despite the guesser elsewhere.
    honest = await open_device(devices, "alice", "127.0.0.3")
    await asyncio.wait_for(honest.ua.register(running.sip_addr, 600), GUARD)
    monotonic.advance(31.0)  # the first lock lasts 30 s
    await asyncio.wait_for(same_host.ua.register(running.sip_addr, 600), GUARD)


async def test_store_errors_reach_the_peer_as_generic_text(
    running: RunningBroker,
    devices: list[Device],
    sqlite_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Database errors (host, port, SQL) reach unauthenticated clients as generic text."""
    caplog.set_level(logging.ERROR, logger="mdeci.broker")
    alice = await open_device(devices, "alice", "127.0.0.2")
    other = make_engine(f"sqlite:///{sqlite_path}")  # break the database under the broker
    with other.begin() as conn:
        conn.execute(sa.text("DROP TABLE users"))
    other.dispose()
    # The UA answers the 401 with credentials; their lookup fails on the store.
    request = alice.ua.build_request("REGISTER", "sip:example.org", to=f"<{ALICE}>")
    response = await asyncio.wait_for(alice.ua.request(request, running.sip_addr), GUARD)
    assert response.status == 503
    warning = response.headers.get("Warning") or ""
    assert "service unavailable" in warning
    text = str(response).lower() + warning.lower()
    assert "users" not in text and "sqlite" not in text and "operationalerror" not in text
    # Our operator log has the details (mdeci.oplog keeps them in the record's fields).
    assert any(
        "no such table: users" in f"{r.getMessage()} {getattr(r, 'mdeci_fields', '')}"
        for r in caplog.records
    )


async def test_msisdn_comes_from_the_user_record_not_sdp(
    running: RunningBroker, devices: list[Device], store: BrokerStore
) -> None:
    """An MSISDN announced in SDP does not override the configured one."""
    alice = await open_device(devices, "alice", "127.0.0.2")
    port = alice.rudp.local_addr[1]
    offer = build_offer("alice", 1, 1, "127.0.0.2", port, alice.keys.public, "+19005550100")
    alice.dialog, _ = await asyncio.wait_for(
        alice.ua.invite(BROKER, running.sip_addr, offer.encode()), GUARD
    )
    session = store.sessions.get_session(ALICE)
    for _ in range(100):
        if session is not None:
            break
        await asyncio.sleep(0.01)  # the session row follows the UA's dialog event
        session = store.sessions.get_session(ALICE)
    assert session is not None and session.msisdn is None  # alice has none on record


async def test_a_public_value_bound_to_another_user_is_refused(
    running: RunningBroker, devices: list[Device], sink: WaitingSink
) -> None:
    alice = await open_device(devices, "alice", "127.0.0.2")
    await alice.call(running)
    await sink.wait_for("session_started", ALICE)
    bob = await open_device(devices, "bob", "127.0.0.4")
    bob.keys = alice.keys  # replays alice's public value as his own
    with pytest.raises(SipError) as info:
        await bob.call(running)
    assert "488" in str(info.value)
    assert not [e for e in sink.named("session_started") if e.uri == BOB]


async def test_only_sha256_is_offered_by_default(
    running: RunningBroker, devices: list[Device]
) -> None:
    answer = await raw_register(running.sip_addr)
    assert answer.startswith(b"SIP/2.0 401")
    offered = [line for line in answer.split(b"\r\n") if line.startswith(b"WWW-Authenticate")]
    assert len(offered) == 1 and b"algorithm=SHA-256" in offered[0]


def test_sqlite_files_are_private_and_ended_sessions_forget_their_key(tmp_path: Path) -> None:
    """The database (HA1s, session keys, also of ended sessions) is not world-readable."""
    from mdeci.store.migrate import upgrade
    from tests.broker.conftest import add_session

    path = tmp_path / "data" / "broker.db"
    url = f"sqlite:///{path}"
    engine = make_engine(url)  # creates the folder (0700) and the file (0600)
    upgrade(url)
    store = BrokerStore(engine)
    add_session(store, ALICE)
    assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700
    for name in ("broker.db", "broker.db-wal"):
        if (path.parent / name).exists():
            assert stat.S_IMODE(os.stat(path.parent / name).st_mode) == 0o600, name
    before = store.sessions.get_session(ALICE)
    assert before is not None and before.session_key
    ended = store.sessions.end_session(ALICE, 2000.0)
    assert ended is not None and ended.status is SessionStatus.ENDED
    assert ended.session_key == b""
    engine.dispose()
    os.chmod(path, 0o644)  # an existing file is narrowed at the next open
    make_engine(url).dispose()
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


def test_shipped_broker_config_limits_sms_and_offers_sha256_only() -> None:
    cfg = load_broker_config(ROOT / "configs" / "broker.toml", env={})
    assert cfg.sms.day_messages is not None and cfg.sms.month_messages is not None
    assert cfg.sms.month_money is not None
    assert cfg.auth.algorithms == ("SHA-256",)


def test_subscriptions_per_user_are_capped(store: BrokerStore, clock: FakeClock) -> None:
    """Subscriptions (and unacked lists) per user are capped."""
    from mdeci.frames import Error, Sub, SubOk, Unsub, encode
    from tests.broker.conftest import make_broker

    broker = make_broker(
        store, clock, WaitingSink(), subscriptions=SubscriptionConfig(max_per_user=3)
    )
    ids = []
    for i in range(3):
        (ok,) = broker.handle_frame(ALICE, encode(Sub(req=i, subject=f"s.{i}")))
        assert isinstance(ok, SubOk)
        ids.append(ok.sub_id)
    (refused,) = broker.handle_frame(ALICE, encode(Sub(req=9, subject="s.more")))
    assert isinstance(refused, Error) and refused.code == 403
    assert "limit" in refused.message
    assert len(store.subscriptions.list_subscriptions(ALICE, clock())) == 3
    (other,) = broker.handle_frame(BOB, encode(Sub(req=1, subject="s.0")))  # per user
    assert isinstance(other, SubOk)
    broker.handle_frame(ALICE, encode(Unsub(req=10, sub_id=ids[0])))
    (again,) = broker.handle_frame(ALICE, encode(Sub(req=11, subject="s.again")))
    assert isinstance(again, SubOk)
