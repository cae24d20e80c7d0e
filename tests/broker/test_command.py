"""``python -m mdeci broker`` as a subprocess: the one-line readiness, service on the
announced address, clean shutdown on SIGTERM, and one-line errors (exit 2)."""

from __future__ import annotations

import asyncio
import gc
import signal
import socket
import sys
from pathlib import Path

from sip.aio.ua import UaConfig, UserAgent

ROOT = Path(__file__).resolve().parents[2]
GUARD = 60.0  # a cold start migrates a fresh SQLite file; this only guards against a hang

NODE = "broker-test"
CONFIG = f"""\
node = "{NODE}"
domain = "example.org"
data_dir = "data"

[[auth.users]]
user = "alice"
password = "alice-secret"
"""


async def _start(config: Path, *extra: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "mdeci", "broker", "--config", str(config), *extra,
        cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip


def _hostport(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


async def test_ready_line_serves_and_stops_on_sigterm(tmp_path: Path) -> None:
    config = tmp_path / "broker.toml"
    config.write_text(CONFIG)
    proc = await _start(config, "--listen-sip", "127.0.0.1:0", "--listen-media", "127.0.0.1:0")
    try:
        assert proc.stdout is not None and proc.stderr is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), GUARD)).decode()
        words = line.split()
        assert words[:2] == ["broker", "listening"], line
        sip = _hostport(words[2].removeprefix("sip="))
        media = _hostport(words[3].removeprefix("media="))
        assert sip[0] == "127.0.0.1" and sip[1] > 0 and media[1] > 0
        # It serves: alice (from [[auth.users]], added at start) registers with digest.
        ua = UserAgent(UaConfig(aor="sip:alice@example.org", password="alice-secret"))
        await ua.start("127.0.0.2", 0)
        try:
            response = await asyncio.wait_for(ua.register(sip, 600), GUARD)
            assert response.status == 200
        finally:
            await ua.close()
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), GUARD) == 0
        # stderr holds operator log lines only (mdeci.oplog), none of them an error.
        err = (await proc.stderr.read()).decode().splitlines()
        assert all(line.startswith("ts=") for line in err), err
        assert not [line for line in err if "level=error" in line], err
        (started,) = [line for line in err if "event=broker_started" in line]
        assert f"node={NODE}" in started.split(), started
        log = (tmp_path / "data" / "broker-churn.log").read_text()
        assert '"event":"registered"' in log.replace(" ", "")
        assert (tmp_path / "data" / "broker.db").exists()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_errors_are_one_line_and_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(CONFIG + "\n[sip]\nportt = 5060\n")
    proc = await _start(bad)
    _out, err = await asyncio.wait_for(proc.communicate(), GUARD)
    assert proc.returncode == 2
    assert err.decode().count("\n") == 1 and "unknown key 'sip.portt'" in err.decode()

    # The SIP port is taken: one line naming it, no traceback.
    good = tmp_path / "broker.toml"
    good.write_text(CONFIG)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as busy:
        busy.bind(("127.0.0.1", 0))
        port = busy.getsockname()[1]
        proc = await _start(good, "--listen-sip", f"127.0.0.1:{port}")
        _out, err = await asyncio.wait_for(proc.communicate(), GUARD)
    assert proc.returncode == 2, err
    text = err.decode()
    assert text.count("\n") == 1 and f"127.0.0.1:{port}" in text and "Traceback" not in text


def test_the_broker_process_collects_young_objects_less_often() -> None:
    """A fan-out's burst of notifications dies young instead of being promoted
    into the full collections that walk every session's objects."""
    from mdeci.commands.broker import GC_YOUNG, collect_less_often

    before = gc.get_threshold()
    try:
        collect_less_often()
        assert gc.get_threshold()[0] == GC_YOUNG >= 10 * 700
    finally:
        gc.set_threshold(*before)
