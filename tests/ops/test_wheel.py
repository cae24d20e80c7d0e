"""The built wheel, installed (not editable, without extras) in a fresh venv: it runs
``mdeci --version``, ``mdeci db upgrade`` and ``mdeci broker`` from an empty folder and the
broker answers a SIP OPTIONS; ``mdeci init`` writes the sample configs and units it carries;
the analytics steps, whose extra is not installed, say so in one line and exit 2."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import venv
from dataclasses import dataclass
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
            f"Padding: {'x' * 300}\r\n"  # as large as the answer: else none (security.md)
            "Content-Length: 0\r\n\r\n"
        )
        sock.sendto(request.encode(), ("127.0.0.1", port))
        data, _ = sock.recvfrom(65535)
        return data


@dataclass(frozen=True)
class Installed:
    env_dir: Path
    mdeci: Path


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """The wheel built from these sources, installed with its dependencies (no extras)."""
    tmp_path = tmp_path_factory.mktemp("wheel")
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
    return Installed(env_dir, env_dir / "bin" / "mdeci")


def test_installed_wheel_runs_from_an_empty_folder(installed: Installed, tmp_path: Path) -> None:
    mdeci = installed.mdeci
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


def _fails(cmd: list[str], cwd: Path) -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    out = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    return out.returncode, out.stdout, out.stderr


def test_analytics_without_the_extra_is_one_line_and_exit_2(
    installed: Installed, tmp_path: Path
) -> None:
    code, _, _ = _fails(
        [str(installed.env_dir / "bin" / "python"), "-c", "import pyspark"], tmp_path
    )
    assert code != 0  # the extra really is absent
    log = tmp_path / "churn.log"
    log.write_text('{"ts": 1, "event": "registered"}\n')
    tables = tmp_path / "tables"
    for name in ("summary", "per_user", "per_hour", "episodes", "transitions", "restore_latency"):
        (tables / name).mkdir(parents=True)  # the shape of churn's output, read with pyarrow
    for step, args in (
        ("churn", ["--input", str(log), "--output", str(tmp_path / "out")]),
        ("report", ["--input", str(tables), "--output", str(tmp_path / "r.html")]),
    ):
        code, out, err = _fails([str(installed.mdeci), "analytics", step, *args], tmp_path)
        assert (code, out) == (2, ""), err
        assert err.count("\n") == 1 and "Traceback" not in err, err
        assert err.startswith(f"mdeci analytics {step}: error: "), err
        assert "pip install 'mdeci[analytics]'" in err


def test_init_writes_the_samples_the_wheel_carries(installed: Installed, tmp_path: Path) -> None:
    dest = tmp_path / "etc-mdeci"
    _run([str(installed.mdeci), "init", "--dest", str(dest)], tmp_path)
    for name in (
        "broker.toml",
        "agent.toml",
        "kamailio.cfg",
        "systemd/mdeci-broker.service",
        "systemd/mdeci-agent@.service",
    ):
        assert (dest / name).read_bytes() == (ROOT / "configs" / name).read_bytes(), name
    # The written sample passes the installed check (its demo passwords are inline).
    check = _run([str(installed.mdeci), "check", "--config", str(dest / "agent.toml")], tmp_path)
    assert "ok (agent)" in check
