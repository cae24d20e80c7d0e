"""docs/operations.md §9.3 (SIP over TLS behind Kamailio) run as written, on addresses
that are not loopback.

The page's code blocks are read from the page and run in order: the ``sh`` blocks with
bash (the certificates, Kamailio's tls.cfg, Kamailio itself, the copies of the sample
configs, the ``mdeci`` commands) and the ``toml`` blocks applied key by key to those
copies, as an operator edits them. Only two things are changed on the way: every absolute
path (``/etc``, ``/var``, ``/tmp``) gets a temporary folder as its root, and the page's
example addresses become the test's. Kamailio and the broker run in one network
namespace (the server host), the agent in another (the device), joined by a veth pair on
10.x addresses: REGISTER and INVITE go over TLS through Kamailio, the certificates are
verified on every hop, and a notification reaches the agent.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mdeci.agent.api import ApiClient
from tests.e2e.harness_a import (
    GUARD,
    Child,
    Tail,
    is_connected,
    run_ip,
    spawn,
    stop,
    wait_status,
)
from tests.e2e.harness_b import eventually
from tests.peers import missing, require_binary, require_netns
from tests.sip.interop.kamailio import TLS_MODULES

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "operations.md"
SECTION = "### 9.3 TLS"
# The page's example addresses: the server host (Kamailio, broker) and the device.
DOC_SERVER = "192.0.2.10"
DOC_DEVICE = "192.0.2.20"
ABSOLUTE = re.compile(r"(?<![\w./-])/(etc|var|tmp)/")
MDECI = ".venv/bin/mdeci"  # how the page runs the installed program (§1: make demo)


# ------------------------------------------------------------------ reading the page


def section(text: str, title: str) -> str:
    """The text of the section headed ``title``, up to the next heading of any level."""
    start = text.index(title + "\n") + len(title) + 1
    end = re.compile(r"^#{1,3} ", re.M).search(text, start)
    return text[start : end.start() if end else len(text)]


def code_blocks(text: str) -> list[tuple[str, str]]:
    """The fenced code blocks of ``text`` in order: (language, dedented body)."""
    found = re.findall(r"^( *)```(\w*)\n(.*?)^\1```$", text, re.M | re.S)
    return [(lang, textwrap.dedent(body)) for _, lang, body in found]


def substitute(text: str, root: Path, server: str, device: str) -> str:
    """The page's text with ``root`` under every absolute path and the test's addresses."""
    text = ABSOLUTE.sub(lambda m: f"{root}/{m.group(1)}/", text)
    return text.replace(DOC_SERVER, server).replace(DOC_DEVICE, device)


# ------------------------------------------------------------------ editing a config


def _header(line: str) -> str | None:
    bare = line.split("#", 1)[0].strip()
    return bare if bare.startswith("[") else None


def set_keys(config: str, fragment: str) -> str:
    """``config`` with the keys of ``fragment`` set as an operator sets them in an editor:
    a key already in its table is replaced, a missing one is added under the table's
    header, an ``[[array]]`` entry is added at the end."""
    lines = config.splitlines()
    appended: list[str] = []
    table: str | None = None
    for raw in fragment.splitlines():
        line = raw.split(" #", 1)[0].rstrip()
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        header = _header(line)
        if header is not None:
            table = header
            if header.startswith("[["):
                appended += ["", header]
            continue
        if table is not None and table.startswith("[["):
            appended.append(line)
            continue
        key = line.split("=", 1)[0].strip()
        start = 0 if table is None else _find_header(lines, table) + 1
        end = next((i for i in range(start, len(lines)) if _header(lines[i])), len(lines))
        at = next(
            (i for i in range(start, end) if re.match(rf"{re.escape(key)}\s*=", lines[i])), None
        )
        if at is not None:
            lines[at] = line
        else:
            lines.insert(start, line)
    return "\n".join(lines + appended) + "\n"


def _find_header(lines: list[str], table: str) -> int:
    for i, line in enumerate(lines):
        if _header(line) == table:
            return i
    raise AssertionError(f"the sample config has no {table} table")


def check_applied(config: dict[str, Any], fragment: dict[str, Any]) -> None:
    """Every table key of ``fragment`` has its value in the edited ``config``."""
    for key, value in fragment.items():
        if isinstance(value, dict):
            check_applied(config[key], value)
        elif isinstance(value, list) and value and isinstance(value[0], dict):
            assert all(entry in config[key] for entry in value), (key, config[key])
        else:
            assert config[key] == value, (key, config[key], value)


# ------------------------------------------------------------------ the test bed


def bash(script: str, *, netns: str | None = None) -> str:
    """Run ``script`` with bash (-e: the first failing command fails it), from the
    checkout, inside ``netns`` when given; its stdout and stderr."""
    prefix = ["ip", "netns", "exec", netns] if netns else []
    done = subprocess.run(
        [*prefix, "bash", "-euo", "pipefail", "-c", script], cwd=ROOT, capture_output=True,
        text=True, timeout=GUARD, check=False,
    )  # fmt: skip
    assert done.returncode == 0, f"{script}\n{done.stdout}{done.stderr}"
    return done.stdout + done.stderr


def mdeci_argv(line: str) -> tuple[dict[str, str], list[str]]:
    """A page's ``[VAR=value ...] .venv/bin/mdeci ARGS  # comment`` line: its environment
    and the arguments after the program (run here as ``python -m mdeci``)."""
    words = shlex.split(line, comments=True)
    env: dict[str, str] = {}
    while "=" in words[0] and not words[0].startswith(MDECI):
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    assert words[0] == MDECI, line
    return env, words[1:]


@pytest.fixture
def root() -> Iterator[Path]:
    """The root of the recipe's absolute paths; short, for the agent's socket path."""
    path = Path(tempfile.mkdtemp(prefix="mdeci-tls-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def hosts() -> Iterator[tuple[str, str, str, str]]:
    """Two network namespaces, the server host and the device, joined by a veth pair:
    (server namespace, its address, device namespace, its address). Removed afterwards,
    whatever happened."""
    require_netns()
    tag = os.getpid() % 10000
    net = f"10.78.{20 + os.getpid() % 200}"
    server_ns, device_ns = f"mdeci-tlss-{tag}", f"mdeci-tlsd-{tag}"
    server_if, device_if = f"mtl{tag}s", f"mtl{tag}d"
    try:
        run_ip("netns", "add", server_ns)
        run_ip("netns", "add", device_ns)
        run_ip("link", "add", server_if, "type", "veth", "peer", "name", device_if)
        for ns, link, address in ((server_ns, server_if, 1), (device_ns, device_if, 2)):
            run_ip("link", "set", link, "netns", ns)
            run_ip("-n", ns, "addr", "add", f"{net}.{address}/24", "dev", link)
            run_ip("-n", ns, "link", "set", link, "up")
            run_ip("-n", ns, "link", "set", "lo", "up")
        yield server_ns, f"{net}.1", device_ns, f"{net}.2"
    finally:
        for ns in (server_ns, device_ns):
            with contextlib.suppress(RuntimeError, OSError, subprocess.SubprocessError):
                run_ip("netns", "del", ns)
        for link in (server_if, device_if):  # normally gone with the namespaces
            with contextlib.suppress(RuntimeError, OSError, subprocess.SubprocessError):
                run_ip("link", "del", link)


class Foreground:
    """A page's foreground command (Kamailio with ``-DD``) run by bash in its own session;
    stopped by signalling that session (ours)."""

    def __init__(self, script: str, netns: str, log: Path, program: str) -> None:
        self.log = log
        # The page calls the program by name: its folder (/usr/sbin) on PATH.
        path = f"{Path(program).parent}{os.pathsep}{os.environ.get('PATH', '')}"
        with log.open("wb") as out:
            self.process = subprocess.Popen(
                ["ip", "netns", "exec", netns, "bash", "-euc", script], cwd=ROOT,
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True, env={**os.environ, "PATH": path},
            )  # fmt: skip

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(5)


async def listening(netns: str, port: int, process: Foreground) -> bool:
    """Whether something in ``netns`` listens on TCP ``port`` (fails if ``process`` died)."""
    if process.process.poll() is not None:
        raise AssertionError(f"exited: {process.log.read_text()[-2000:]}")
    done = await asyncio.to_thread(
        subprocess.run, ["ip", "netns", "exec", netns, "ss", "-Hltn", f"sport = :{port}"],
        capture_output=True, text=True, timeout=GUARD, check=False,
    )  # fmt: skip
    return bool(done.stdout.strip())


# ------------------------------------------------------------------ the recipe


async def test_the_tls_recipe_works_as_written_on_non_loopback_addresses(
    root: Path, hosts: tuple[str, str, str, str]
) -> None:
    """§9.3 word for word: the certificates the page makes (a trial CA, the server's for
    its address and DNS name, the device's) land where the configs and Kamailio's tls.cfg
    read them; Kamailio (WITH_TLS), the broker and the agent start with the page's
    commands on the server's and device's addresses; the agent registers and INVITEs the
    broker over TLS through Kamailio (every hop verified against the trial CA), ``mdeci
    status`` shows it, the broker's ready line and ``broker_started`` log line carry
    ``tls=``, and a notification published reaches the agent."""
    require_binary("openssl", "apt-get install openssl")
    program = require_binary("kamailio", "apt-get install kamailio")
    if not any(Path("/usr/lib").glob(TLS_MODULES)):
        missing("kamailio TLS module", "apt-get install kamailio-tls-modules")
    server_ns, server, device_ns, device = hosts
    blocks = [
        (lang, substitute(body, root, server, device))
        for lang, body in code_blocks(section(DOC.read_text(), SECTION))
    ]
    shells = [body for lang, body in blocks if lang == "sh"]
    tomls = [body for lang, body in blocks if lang == "toml"]
    certs, tls_cfg, start_kamailio, copy_broker, start_broker, copy_agent, start_agent = shells
    broker_keys, agent_keys = tomls

    # 1. Certificates, where the configs read them.
    assert bash(certs).count(": OK") == 2
    tls_dir = root / "etc" / "mdeci" / "tls"
    for name in ("ca.pem", "sip.pem", "sip.key", "device.pem", "device.key"):
        assert (tls_dir / name).is_file(), name
    san = bash(f"openssl x509 -noout -ext subjectAltName -in {tls_dir / 'sip.pem'}")
    assert f"IP Address:{server}" in san and "DNS:sip.example.org" in san, san
    san = bash(f"openssl x509 -noout -ext subjectAltName -in {tls_dir / 'device.pem'}")
    assert f"IP Address:{device}" in san, san

    # 2. Kamailio's tls.cfg names them; Kamailio with TLS on the server's address.
    bash(tls_cfg)
    kamailio_tls = (tls_dir / "kamailio-tls.cfg").read_text()
    for name in ("sip.key", "sip.pem", "ca.pem"):
        assert str(tls_dir / name) in kamailio_tls
    assert f"tls:{server}:5061" in start_kamailio and str(tls_dir) in start_kamailio
    kamailio = Foreground(start_kamailio, server_ns, root / "kamailio.log", program)
    children: list[Child] = []
    tail: Tail | None = None
    try:
        await eventually(lambda: listening(server_ns, 5061, kamailio))

        # 3. The broker: the sample config copied and edited as the page says.
        bash(copy_broker)
        broker_toml = root / "etc" / "mdeci" / "broker.toml"
        broker_toml.write_text(set_keys(broker_toml.read_text(), broker_keys))
        check_applied(tomllib.loads(broker_toml.read_text()), tomllib.loads(broker_keys))
        command, expected_ready = start_broker.splitlines()
        env, args = mdeci_argv(command)
        broker = await spawn(
            "broker", args, root / "logs",
            prefix=("ip", "netns", "exec", server_ns, "env", *(f"{k}={v}" for k, v in env.items())),
        )  # fmt: skip
        children.append(broker)
        expected = expected_ready.lstrip("# ").split()
        ready = broker.ready.split()
        assert [w for w in ready if not w.startswith("media=")] == [
            w for w in expected if not w.startswith("media=")
        ], broker.ready
        assert broker.words["tls"] == f"{server}:5062"

        async def started_logged() -> bool:
            return any("event=broker_started" in x for x in broker.stderr().splitlines())

        await eventually(started_logged)
        (started,) = [x for x in broker.stderr().splitlines() if "event=broker_started" in x]
        assert f"tls={server}:5062" in started.split(), started

        # 4. The agent on the device, its config copied and edited as the page says.
        bash(copy_agent, netns=device_ns)
        agent_toml = root / "etc" / "mdeci" / "agent.toml"
        agent_toml.write_text(set_keys(agent_toml.read_text(), agent_keys))
        check_applied(tomllib.loads(agent_toml.read_text()), tomllib.loads(agent_keys))
        run_agent, run_status = start_agent.splitlines()
        _, args = mdeci_argv(run_agent)
        agent = await spawn("agent", args, root / "logs", prefix=("ip", "netns", "exec", device_ns))
        children.append(agent)
        socket = Path(agent.words["api"])
        status = await wait_status(socket, is_connected)
        # REGISTER and INVITE went over TLS, through Kamailio, from the device's address.
        assert status["sip_transport"] == "tls", status
        assert status["sip_contact"].startswith("sips:"), status
        assert status["sip_addr"].startswith(f"{device}:"), status
        assert set(status["sip_received"]) == {"tls"}, status
        # The page's status command (bash -e: it exits 0, as it does when CONNECTED).
        shown = bash(run_status.replace(MDECI, f"{sys.executable} -m mdeci"), netns=device_ns)
        assert "CONNECTED" in shown and re.search(r"sip_transport\s+tls", shown), shown
        # Kamailio's location table: the broker's and the agent's contacts are sips:.
        table = bash(
            f"{sys.executable} -m sip bindings --registrar {server}:5071 "
            "--aor sip:broker@localhost --aor sip:alice@localhost",
            netns=server_ns,
        ).splitlines()
        assert table == [
            f"sip:broker@localhost 1 sips:broker@{server}:5062",
            f"sip:alice@localhost 1 {status['sip_contact']}",
        ], table

        # A notification reaches the agent over the session set up through Kamailio.
        tail = await Tail(socket).start()
        async with ApiClient(socket) as client:
            await asyncio.wait_for(
                client.call({"op": "sub", "subject": "tls.tick", "ttl": 600}), GUARD
            )
            answer = await asyncio.wait_for(
                client.call({"op": "pub", "subject": "tls.tick", "attrs": {}, "text": "over tls"}),
                GUARD,
            )
        assert answer.get("ok", True), answer
        (record,) = await asyncio.wait_for(tail.wait_count(1), GUARD)
        assert record["text"] == "over tls", record
        churn = (root / "var" / "lib" / "mdeci" / "broker-churn.log").read_text()
        assert '"event":"session_started"' in churn.replace(" ", ""), churn
    finally:
        if tail is not None:
            await tail.close()
        for child in reversed(children):
            await stop(child)
        kamailio.stop()
