"""Operations in one short session against a real broker on PostgreSQL:
metrics move as they should, ``/readyz`` turns unready when the database goes away, the
admin commands work on the running broker (a user added registers at once, a session is
kicked), and each operator event is one log line with no secret in any line.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
import sqlalchemy as sa
from prometheus_client.parser import text_string_to_metric_families

from mdeci.agent import Agent, Status
from mdeci.broker.app import run_broker
from mdeci.cli import main
from mdeci.config import load_broker_config
from mdeci.store.users import ha1
from sip.aio.ua import UaConfig, UserAgent
from sip.errors import SipRequestFailed
from tests.agent.farend import FAST_RUDP, agent_config, lo_only
from tests.broker.conftest import WaitingSink
from tests.peers import pg_url

GUARD = 30.0  # seconds; guards against a hang, synchronises nothing
PASSWORDS = ("alice-secret", "bob-secret", "carol-secret", "carol-new-secret")


@pytest.fixture
def pg_database() -> Iterator[str]:
    """A database of its own, so that the test can make it go away."""
    base = sa.make_url(pg_url())
    name = f"mdeci_ops_{secrets.token_hex(4)}"
    admin = sa.create_engine(base, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    try:
        yield base.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A short folder: the admin socket's path must fit in sun_path (108 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="mdeci-ops-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _config(folder: Path, url: str) -> Path:
    path = folder / "broker.toml"
    path.write_text(
        f"""
domain = "localhost"
data_dir = "data"
[sip]
host = "127.0.0.1"
port = 0
t1 = 0.02
t2 = 0.16
t4 = 0.2
[rudp]
rto_initial = {FAST_RUDP.rto_initial}
rto_min = {FAST_RUDP.rto_min}
rto_max = {FAST_RUDP.rto_max}
max_retries = {FAST_RUDP.max_retries}
ack_delay = {FAST_RUDP.ack_delay}
[store]
url = "{url}"
[queue]
max_per_uri = 3
[metrics]
enabled = true
port = 0
[[auth.users]]
user = "alice"
password = "alice-secret"
[[auth.users]]
user = "bob"
password = "bob-secret"
"""
    )
    return path


class Scraper:
    def __init__(self, session: aiohttp.ClientSession, base: str) -> None:
        self.session = session
        self.base = base

    async def metrics(self) -> dict[str, float]:
        async with self.session.get(f"{self.base}/metrics") as resp:
            assert resp.status == 200
            text = await resp.text()
        values: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
                values[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
        return values

    async def get(self, path: str) -> tuple[int, str]:
        async with self.session.get(f"{self.base}{path}") as resp:
            return resp.status, await resp.text()


def _moved(before: dict[str, float], after: dict[str, float], name: str) -> float:
    return after.get(name, 0.0) - before.get(name, 0.0)


async def _cli(*argv: str) -> int:
    return await asyncio.to_thread(main, list(argv))


async def test_a_short_session_seen_by_an_operator(
    pg_database: str,
    short_dir: Path,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    caplog.set_level(logging.INFO, logger="mdeci")
    cfg_path = _config(short_dir, pg_database)
    config = load_broker_config(cfg_path)
    sink = WaitingSink()
    broker = await run_broker(config, log=sink, expire_interval=3600.0)
    assert broker.metrics_addr is not None
    port = broker.sip_addr[1]
    host, mport = broker.metrics_addr
    http = aiohttp.ClientSession()
    scrape = Scraper(http, f"http://{host}:{mport}")
    agents: list[Agent] = []
    try:
        assert await scrape.get("/healthz") == (200, "ok\n")
        assert (await scrape.get("/readyz"))[0] == 200
        m0 = await scrape.metrics()

        # --- admin users add while the broker runs: carol registers at once.
        monkeypatch.setenv("CAROL_PW", "carol-secret")
        cfg = str(cfg_path)
        assert (
            await _cli(
                "admin", "users", "add", "carol", "--config", cfg, "--password-env", "CAROL_PW"
            )
            == 0
        )
        assert "added sip:carol@localhost" in capsys.readouterr().out

        def agent(user: str, ip: str) -> Agent:
            a = Agent(agent_config(short_dir / user, user, ip, port), address_source=lo_only)
            agents.append(a)
            return a

        alice, bob, carol = (
            agent("alice", "127.0.0.2"),
            agent("bob", "127.0.0.4"),
            agent("carol", "127.0.0.5"),
        )
        for a in (alice, bob, carol):
            await a.start()
        for a in (alice, bob, carol):
            await asyncio.wait_for(a.wait_connected(), GUARD)
        assert carol.status().status is Status.CONNECTED

        # --- subscribe, publish, deliver.
        await asyncio.wait_for(alice.subscribe("stocks.*"), GUARD)
        inbox = alice.listen()
        await asyncio.wait_for(bob.publish("stocks.br", {"Stock": "PETR4"}, b"1"), GUARD)
        assert (await asyncio.wait_for(inbox.get(), GUARD))["nseq"] == 1
        await asyncio.wait_for(sink.wait_for("notify_delivered", "sip:alice@localhost"), GUARD)
        m1 = await scrape.metrics()
        assert _moved(m0, m1, "mdeci_registrations_total") >= 3
        assert _moved(m0, m1, "mdeci_sessions_started_total") == 3
        assert _moved(m0, m1, "mdeci_notifications_published_total") == 1
        assert _moved(m0, m1, "mdeci_notifications_queued_total") == 1
        assert _moved(m0, m1, "mdeci_notifications_delivered_total{channel=ip}") == 1
        assert m1["mdeci_sessions{state=CONNECTED}"] == 3
        assert m1["mdeci_subscriptions"] == 1
        assert m1["mdeci_users"] == 3
        assert m1["mdeci_rudp_associations"] == 3
        assert m1["mdeci_rudp_rtt_seconds{stat=max}"] > 0
        assert m1["mdeci_db_up"] == 1
        assert m1["mdeci_db_query_seconds_count"] >= 1

        # --- move: a re-INVITE from a new address.
        await asyncio.wait_for(alice.move_to("127.0.0.3"), GUARD)
        await asyncio.wait_for(sink.wait_for("session_reinvited", "sip:alice@localhost"), GUARD)
        m2 = await scrape.metrics()
        assert _moved(m1, m2, "mdeci_moves_total") == 1

        # --- outage: alice vanishes without BYE; what bob publishes overflows her queue.
        await alice.close(clean=False)
        for i in range(6):
            await asyncio.wait_for(bob.publish("stocks.br", {"i": i}, b"x"), GUARD)
        await asyncio.wait_for(sink.wait_for("media_disconnected", "sip:alice@localhost"), GUARD)
        await asyncio.wait_for(sink.wait_for("notify_dropped", "sip:alice@localhost"), GUARD)
        m3 = await scrape.metrics()
        assert _moved(m2, m3, "mdeci_disconnections_total") == 1
        assert _moved(m2, m3, "mdeci_notifications_published_total") == 6
        assert _moved(m2, m3, "mdeci_notifications_dropped_total{reason=overflow}") >= 1
        assert m3["mdeci_queue_depth_max"] == 3
        assert m3["mdeci_queue_depth"] >= 3
        assert m3["mdeci_sessions{state=DISCONNECTED}"] == 1
        assert m3["mdeci_rudp_retransmissions_total"] > m2.get(
            "mdeci_rudp_retransmissions_total", 0
        )
        assert m3["mdeci_rudp_failures_total"] >= 1

        # --- an authentication failure, with its source.
        ua = UserAgent(UaConfig(aor="sip:bob@localhost", password="wrong"))
        await ua.start("127.0.0.6", 0)
        try:
            with pytest.raises(SipRequestFailed) as refused:
                await asyncio.wait_for(ua.register(broker.sip_addr, 600), GUARD)
            assert refused.value.status == 401
        finally:
            await ua.close()

        # --- admin sessions, kick, passwd, list, del.
        capsys.readouterr()
        assert await _cli("admin", "sessions", "--config", cfg) == 0
        table = capsys.readouterr().out.splitlines()
        row = next(line for line in table if line.startswith("sip:alice@localhost"))
        # uri, owner (the broker's node name, by default the host name), state, ..., queue, subs
        fields = row.split()
        assert fields[1:3] == [socket.gethostname(), "DISCONNECTED"]
        assert fields[-2:] == ["3", "1"]
        assert await _cli("admin", "kick", "sip:bob@localhost", "--config", cfg) == 0
        assert "kicked sip:bob@localhost" in capsys.readouterr().out
        await asyncio.wait_for(sink.wait_for("session_ended", "sip:bob@localhost"), GUARD)
        assert await _cli("admin", "kick", "sip:nobody@localhost", "--config", cfg) == 2
        assert (
            capsys.readouterr().err.strip()
            == "mdeci admin: error: sip:nobody@localhost has no session"
        )
        monkeypatch.setenv("CAROL_PW", "carol-new-secret")
        assert (
            await _cli(
                "admin", "users", "passwd", "carol", "--config", cfg, "--password-env", "CAROL_PW"
            )
            == 0
        )
        assert (
            await _cli(
                "admin", "users", "add", "carol", "--config", cfg, "--password-env", "CAROL_PW"
            )
            == 2
        )
        assert "exists already" in capsys.readouterr().err
        # The new password works at once (the registrar reads the store at each request).
        ua = UserAgent(UaConfig(aor="sip:carol@localhost", password="carol-new-secret"))
        await ua.start("127.0.0.7", 0)
        try:
            answer = await asyncio.wait_for(ua.register(broker.sip_addr, 600), GUARD)
            assert answer.status == 200
        finally:
            await ua.close()
        assert await _cli("admin", "users", "del", "carol", "--config", cfg) == 0
        assert await _cli("admin", "users", "del", "carol", "--config", cfg) == 2
        capsys.readouterr()
        assert await _cli("admin", "users", "list", "--config", cfg) == 0
        listed = capsys.readouterr().out
        assert "sip:alice@localhost" in listed and "sip:carol@localhost" not in listed

        # --- the database goes away: /readyz says so, and the failure is logged.
        admin = sa.create_engine(
            sa.make_url(pg_database).set(database="postgres"), isolation_level="AUTOCOMMIT"
        )
        with admin.connect() as conn:
            name = sa.make_url(pg_database).database
            conn.execute(sa.text(f'DROP DATABASE "{name}" WITH (FORCE)'))
        admin.dispose()
        status, body = await scrape.get("/readyz")
        assert status == 503 and body.startswith("not ready: database:"), body
        assert (await scrape.get("/healthz"))[0] == 200
        assert (await scrape.metrics())["mdeci_db_up"] == 0
    finally:
        await http.close()
        for a in agents:
            await a.close(clean=False)
        await broker.close()

    events = [r.getMessage() for r in caplog.records if r.name.startswith("mdeci")]
    for name in (
        "session_up",
        "moved",
        "disconnected",
        "queue_overflow",
        "auth_failed",
        "session_down",
        "database_error",
    ):
        assert name in events, (name, events)
    # One line per event: as many as the broker decided (its churn events say how many).
    assert events.count("session_up") == len(sink.named("session_started")) >= 3
    assert events.count("moved") == 1
    outages = [e for e in sink.named("media_disconnected") if e.fields["reason"] != "session ended"]
    assert events.count("disconnected") == len(outages) == 1
    assert events.count("session_down") == len(sink.named("session_ended")) >= 1
    overflow = [e for e in sink.named("notify_dropped") if "overflow" in str(e.fields["reason"])]
    assert events.count("queue_overflow") == len(overflow) >= 1
    auth = [r for r in caplog.records if r.getMessage() == "auth_failed"]
    assert len(auth) == 1 and auth[0].mdeci_fields["source"].startswith("127.0.0.6:")  # type: ignore[attr-defined]
    kicked = [r for r in caplog.records if r.getMessage() == "session_down"]
    assert kicked[0].mdeci_fields["reason"] == "kicked"  # type: ignore[attr-defined]
    _no_secrets(caplog.text)


def _no_secrets(text: str) -> None:
    """No password and no HA1 of any user in any line (both algorithms)."""
    assert text
    for user, password in (
        ("alice", "alice-secret"),
        ("bob", "bob-secret"),
        ("carol", "carol-secret"),
        ("carol", "carol-new-secret"),
    ):
        assert password not in text
        for algorithm in ("MD5", "SHA-256"):
            assert ha1(algorithm, user, "localhost", password) not in text
