"""Issue 15, acceptance 1: the built wheel, installed (not editable) in a fresh venv, runs
``mdeci --version``, ``mdeci db upgrade`` and ``mdeci broker`` from an empty folder, and the
broker answers a SIP OPTIONS."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def _run(cmd: list[str], cwd: Path, timeout: float = 600) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    out = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, f"{cmd}: {out.stdout}\n{out.stderr}"
    return out.stdout + out.stderr


def _options(port: int) -> bytes:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.settimeout(10)
        me = sock.getsockname()[1]
        request = (
            "OPTIONS sip:broker@localhost SIP/2.0\r\n"
            f"Via: SIP/2.0/UDP 127.0.0.1:{me};branch=z9hG4bKwheel1;rport\r\n"
            "Max-Forwards: 70\r\n"
            "From: <sip:probe@localhost>;tag=probe1\r\n"
            "To: <sip:broker@localhost>\r\n"
            "Call-ID: wheel-options-1\r\n"
            "CSeq: 1 OPTIONS\r\n"
            "Content-Length: 0\r\n\r\n"
        )
        sock.sendto(request.encode(), ("127.0.0.1", port))
        data, _ = sock.recvfrom(65535)
        return data


def test_installed_wheel_runs_from_an_empty_folder(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    # Build from a copy of the sources: setuptools writes build/ and *.egg-info beside them.
    src = tmp_path / "src"
    shutil.copytree(
        ROOT,
        src,
        ignore=shutil.ignore_patterns(".venv", ".git", "out", "var", "build", "*.egg-info"),
    )
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", str(src), "-w", str(dist)], src)
    (wheel,) = dist.glob("mdeci-*.whl")
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    py = env_dir / "bin" / "python"
    log = _run([str(py), "-m", "pip", "install", "-q", str(wheel)], tmp_path)
    assert "deprecated" not in log.lower(), log
    mdeci = env_dir / "bin" / "mdeci"
    empty = tmp_path / "empty"
    empty.mkdir()

    version = _run([str(mdeci), "--version"], empty).strip()
    assert re.fullmatch(r"mdeci \d+\.\d+\.\d+\S*", version), version

    url = f"sqlite:///{empty / 'broker.db'}"
    assert "database at revision" in _run([str(mdeci), "db", "upgrade", "--url", url], empty)

    config = empty / "broker.toml"
    config.write_text(f'[store]\nurl = "{url}"\n[sip]\ntransports = ["udp"]\n')
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    proc = subprocess.Popen(
        [str(mdeci), "broker", "--config", str(config), "--listen-sip", "127.0.0.1:0"],
        cwd=empty,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # blocks until the ready line (or EOF on failure)
        match = re.search(r"sip=127\.0\.0\.1:(\d+)", line)
        assert match, (
            f"no ready line: {line!r} {proc.stderr.read() if proc.stderr and proc.poll() else ''}"
        )
        answer = _options(int(match.group(1)))
        assert answer.startswith(b"SIP/2.0 200"), answer[:80]
        assert b"Call-ID: wheel-options-1" in answer
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert proc.returncode == 0
    assert not (empty / "migrations").exists()  # nothing was looked up beside the cwd
