"""``python -m mdeci agent`` as a subprocess: ready line, status over the socket, SIGTERM."""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

from mdeci.agent import ApiClient
from tests.agent.farend import GUARD

ROOT = Path(__file__).resolve().parents[2]


async def spawn_agent(tmp_path: Path) -> asyncio.subprocess.Process:
    """``python -m mdeci agent`` on a config in ``tmp_path`` whose registrar and broker
    never answer (port 9): the daemon starts, binds and keeps trying."""
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
