"""``python -m mdeci agent`` as a subprocess: ready line, status over the socket, SIGTERM."""

from __future__ import annotations

import asyncio
import os
import signal
import stat
import sys
from pathlib import Path

from mdeci.agent import ApiClient
from tests.agent.farend import GUARD

ROOT = Path(__file__).resolve().parents[2]


async def spawn_agent(tmp_path: Path, umask: int = -1) -> asyncio.subprocess.Process:
    """``python -m mdeci agent`` on a config in ``tmp_path`` whose registrar and broker
    never answer (port 9): the daemon starts, binds and keeps trying. ``umask``: the
    child's (-1: this process's)."""
    config = tmp_path / "agent.toml"
    config.write_text(
        'aor = "sip:alice@localhost"\npassword = "x"\nstate_dir = "state"\n'
        '[registrar]\naddress = "127.0.0.1:9"\n[broker]\naddress = "127.0.0.1:9"\n'
        '[sip]\nhost = "127.0.0.2"\nport = 0\n[media]\nhost = "127.0.0.2"\n'
        '[ip_monitor]\nmode = "poll"\npoll_interval = 600.0\n'
    )
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "mdeci",
        "agent",
        "--config",
        str(config),
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        umask=umask,
    )


async def test_agent_command_runs_until_sigterm(tmp_path: Path) -> None:
    proc = await spawn_agent(tmp_path)
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), GUARD)).decode()
        sock = tmp_path / "state" / "agent.sock"
        assert line.startswith(f"agent sip:alice@localhost api={sock} sip=127.0.0.2:"), line
        async with ApiClient(sock) as client:
            status = (await client.call({"op": "status"}))["status"]
        assert status["status"] == "DISCONNECTED" and status["sip_addr"].startswith("127.0.0.2:")
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), GUARD) == 0
        assert not sock.exists()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def _modes(state: Path) -> dict[str, int]:
    """The permission bits of ``state`` (key ".") and of each regular file in it."""
    modes = {".": stat.S_IMODE(state.stat().st_mode)}
    for path in state.iterdir():
        if path.is_file():
            modes[path.name] = stat.S_IMODE(path.stat().st_mode)
    return modes


async def test_the_state_files_are_the_users_alone_whatever_the_umask(tmp_path: Path) -> None:
    """Run by hand with a permissive umask, in a folder an earlier run left 0755 with a
    0644 inbox: the folder becomes 0700 and every file 0600, rewritten ones included."""
    state = tmp_path / "state"
    state.mkdir(mode=0o755)
    os.chmod(state, 0o755)
    (state / "inbox.jsonl").write_bytes(b"")
    os.chmod(state / "inbox.jsonl", 0o644)
    proc = await spawn_agent(tmp_path, umask=0)
    try:
        assert proc.stdout is not None
        await asyncio.wait_for(proc.stdout.readline(), GUARD)
        async with ApiClient(state / "agent.sock") as client:
            answer = await client.call({"op": "pub", "subject": "news.a", "text": "x"})
        assert answer["state"] == "buffered", answer  # in outbox.jsonl
        running = _modes(state)
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), GUARD) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    stopped = _modes(state)  # nseq.json is written on the way out
    assert {"inbox.jsonl", "outbox.jsonl", "lock"} <= set(running), running
    assert "nseq.json" in stopped, stopped
    for modes in (running, stopped):
        assert modes.pop(".") == 0o700, modes
        assert set(modes.values()) == {0o600}, modes
