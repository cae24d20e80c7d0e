"""``mdeci admin`` without the service's secrets (on a store, and against a running
broker), ``admin queue`` (no payload bytes unless asked), and the hint for a
``postgres://`` URL."""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from mdeci.agent import Agent
from mdeci.broker.app import run_broker
from mdeci.cli import main
from mdeci.config import load_broker_config
from sip.aio.ua import UaConfig, UserAgent
from sip.message import Response
from sip.transaction import TimerConfig
from tests.agent.farend import FAST_RUDP, GUARD, agent_config, lo_only
from tests.broker.conftest import WaitingSink
from tests.client.conftest import Deployment


def broker_toml(folder: Path, url: str) -> Path:
    """A broker config whose users' passwords come from variables nobody set."""
    path = folder / "broker.toml"
    path.write_text(
        'domain = "localhost"\n'
        f"[store]\nurl = {json.dumps(url)}\n"
        '[[auth.users]]\nuser = "alice"\npassword_env = "MDECI_TEST_UNSET_ALICE_PW"\n'
        '[[auth.users]]\nuser = "bob"\npassword_env = "MDECI_TEST_UNSET_BOB_PW"\n'
    )
    return path


async def options(addr: tuple[str, int]) -> Response:
    """One out-of-dialog OPTIONS to ``addr``, as Kamailio's dispatcher probes a broker."""
    ua = UserAgent(UaConfig(aor="sip:dispatcher@localhost", timers=TimerConfig(t1=0.05)))
    await ua.start("127.0.0.1")
    try:
        target = f"sip:{addr[0]}:{addr[1]}"
        request = ua.build_request("OPTIONS", target, to=f"<{target}>")
        return await asyncio.wait_for(ua.request(request, addr), GUARD)
    finally:
        await ua.close()


def test_drain_without_a_running_broker_is_one_line_and_exit_2(
    short_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = str(broker_toml(short_dir, f"sqlite:///{short_dir / 'broker.db'}"))
    assert main(["admin", "drain", "--config", cfg]) == 2
    err = capsys.readouterr().err
    assert (
        err.startswith("mdeci admin: error: cannot reach the broker at ") and err.count("\n") == 1
    ), err
    with pytest.raises(SystemExit) as exc:
        main(["admin", "drain", "sip:alice@localhost", "--config", cfg])
    assert exc.value.code == 2


async def cli(*argv: str) -> int:
    return await asyncio.wait_for(asyncio.to_thread(main, list(argv)), GUARD)


async def test_admin_queue_lists_what_waits_without_payloads_unless_asked(
    deployment: Deployment, sqlite_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    await deployment.alice.agent.subscribe("stocks.*")
    await deployment.alice.close(clean=False)  # alice is away: her notifications wait
    for text in (b"secret-one", b"secret-two"):
        result = await deployment.bob.publish("stocks.a", {"Price": 24.5}, text)
        assert result.state == "published"
    cfg = str(broker_toml(deployment.tmp, f"sqlite:///{sqlite_path}"))

    assert await cli("admin", "queue", "alice", "--config", cfg) == 0
    out = capsys.readouterr().out
    assert out.startswith("sip:alice@localhost: 2 waiting, last nseq 2")
    assert "stocks.a" in out and "Price=24.5" in out and " 10 " in out
    assert "secret" not in out

    assert await cli("admin", "queue", "alice", "--json", "--limit", "1", "--config", cfg) == 0
    (line,) = capsys.readouterr().out.splitlines()
    item = json.loads(line)
    assert (item["nseq"], item["size"], item["attrs"]) == (1, 10, {"Price": 24.5})
    assert "payload" not in item

    assert await cli("admin", "queue", "alice", "--payload", "--config", cfg) == 0
    assert "secret-two" in capsys.readouterr().out

    # The other admin commands run without the users' secrets too.
    assert await cli("admin", "sessions", "--config", cfg) == 0
    assert "sip:bob@localhost" in capsys.readouterr().out
    assert await cli("admin", "users", "list", "--config", cfg) == 0


def test_a_postgres_url_gets_the_spelling_to_use(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for url in ("postgres://u@127.0.0.1/db", "postgresql://u@127.0.0.1/db"):
        cfg = str(broker_toml(tmp_path, url))
        assert main(["admin", "sessions", "--config", cfg]) == 2
        assert main(["db", "upgrade", "--url", url]) == 2
        # check verifies what the broker will run with: its secrets too.
        assert main(["check", "--config", cfg]) == 2
        err = capsys.readouterr().err.splitlines()
        assert len(err) == 3
        assert "MDECI_TEST_UNSET_ALICE_PW" in err.pop()
        monkeypatch.setenv("MDECI_TEST_UNSET_ALICE_PW", "a")
        monkeypatch.setenv("MDECI_TEST_UNSET_BOB_PW", "b")
        assert main(["check", "--config", cfg]) == 2
        err.append(capsys.readouterr().err.strip())
        monkeypatch.delenv("MDECI_TEST_UNSET_ALICE_PW")
        monkeypatch.delenv("MDECI_TEST_UNSET_BOB_PW")
        assert all("postgresql+psycopg://USER:PASSWORD@HOST:PORT/DATABASE" in e for e in err)


def test_admin_commands_run_without_the_services_secrets(
    sqlite_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = str(broker_toml(tmp_path, f"sqlite:///{sqlite_path}"))
    assert main(["admin", "users", "list", "--config", cfg]) == 0
    assert main(["admin", "sessions", "--config", cfg]) == 0
    assert main(["admin", "queue", "alice", "--config", cfg]) == 0
    out = capsys.readouterr()
    assert out.err == ""
    assert out.out.splitlines()[-1] == "sip:alice@localhost: 0 waiting, last nseq 0, missed 0"


def test_db_upgrade_and_sms_spend_run_without_the_services_secrets(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = str(broker_toml(tmp_path, f"sqlite:///{tmp_path / 'broker.db'}"))
    assert main(["db", "upgrade", "--config", cfg]) == 0
    assert main(["sms", "spend", "--config", cfg, "--month", "2026-11"]) == 0
    out = capsys.readouterr()
    assert out.err == ""
    assert out.out.startswith("database at revision ")


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A short folder: the admin socket's path must fit in sun_path (108 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="mdeci-adm-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


async def test_kick_and_sessions_reach_the_running_broker_without_the_services_secrets(
    short_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The broker reads its users' passwords from the environment at start; the operator's
    # shell running `mdeci admin` on the same file has none of them.
    path = short_dir / "broker.toml"
    path.write_text(
        f'node = "b-1"\ndomain = "localhost"\ndata_dir = "data"\n'
        f'[sip]\nhost = "127.0.0.1"\nport = 0\nt1 = 0.02\nt2 = 0.16\nt4 = 0.2\n'
        f"[rudp]\nrto_initial = {FAST_RUDP.rto_initial}\nrto_min = {FAST_RUDP.rto_min}\n"
        f"rto_max = {FAST_RUDP.rto_max}\nmax_retries = {FAST_RUDP.max_retries}\n"
        f'[store]\nurl = "sqlite:///{short_dir / "broker.db"}"\n'
        '[[auth.users]]\nuser = "alice"\npassword_env = "MDECI_TEST_KICK_ALICE_PW"\n'
        '[[auth.users]]\nuser = "bob"\npassword_env = "MDECI_TEST_KICK_BOB_PW"\n'
    )
    monkeypatch.setenv("MDECI_TEST_KICK_ALICE_PW", "alice-secret")
    monkeypatch.setenv("MDECI_TEST_KICK_BOB_PW", "bob-secret")
    sink = WaitingSink()
    broker = await run_broker(load_broker_config(path), log=sink, expire_interval=3600.0)
    monkeypatch.delenv("MDECI_TEST_KICK_ALICE_PW")
    monkeypatch.delenv("MDECI_TEST_KICK_BOB_PW")
    alice = Agent(
        agent_config(short_dir / "alice", "alice", "127.0.0.2", broker.sip_addr[1]),
        address_source=lo_only,
    )
    cfg = str(path)
    try:
        await alice.start()
        await asyncio.wait_for(alice.wait_connected(), GUARD)
        capsys.readouterr()
        assert await cli("admin", "sessions", "--config", cfg) == 0
        out = capsys.readouterr()
        (row,) = [line for line in out.out.splitlines() if line.startswith("sip:alice@")]
        # The broker that owns her, and her state; the broker answered (no line on stderr).
        assert row.split()[1:3] == ["b-1", "CONNECTED"] and out.err == "", row
        assert await cli("admin", "sessions", "--json", "--config", cfg) == 0
        (line,) = [x for x in capsys.readouterr().out.splitlines() if "sip:alice@" in x]
        assert json.loads(line)["owner"] == "b-1" and json.loads(line)["epoch"] >= 1
        assert await cli("admin", "users", "list", "--config", cfg) == 0
        assert "sip:bob@localhost" in capsys.readouterr().out
        assert await cli("admin", "kick", "alice", "--config", cfg) == 0
        out = capsys.readouterr()
        assert (out.out, out.err) == ("kicked sip:alice@localhost\n", "")
        await asyncio.wait_for(sink.wait_for("session_ended", "sip:alice@localhost"), GUARD)
        # She comes back (the kick is no ban); a drain ends her session again, and from
        # then on new INVITEs and OPTIONS get 503 with Retry-After.
        await asyncio.wait_for(sink.wait_for("session_started", "sip:alice@localhost", 2), GUARD)
        assert await cli("admin", "drain", "--config", cfg) == 0
        out = capsys.readouterr()
        assert (out.out, out.err) == ("draining b-1: ended 1 session\n", "")
        ended = await asyncio.wait_for(
            sink.wait_for("session_ended", "sip:alice@localhost", 2), GUARD
        )
        assert ended.fields["reason"] == "drained"
        probe = await options(broker.sip_addr)
        assert probe.status == 503 and probe.headers.get("Retry-After") == "30"
        assert await cli("admin", "drain", "--config", cfg) == 0
        assert capsys.readouterr().out == "draining b-1: ended 0 sessions\n"
    finally:
        await alice.close(clean=False)
        await broker.close()
