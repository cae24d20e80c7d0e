"""Our own bearerbox + smsbox on loopback ports, from a generated config; stopped by PID."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from mdeci.sms.codec import Sms
from mdeci.sms.fakesmsc import mo_argument
from tests.peers import free_port, require_binary

HOW = "apt-get install kannel kannel-extras"
FAKESMSC_PATHS = ("/usr/lib/kannel/test/fakesmsc", "/usr/libexec/kannel/test/fakesmsc")


@dataclass(frozen=True)
class Kannel:
    sendsms_url: str
    username: str
    password: str
    fake_port: int
    fakesmsc: str
    workdir: Path


def fakesmsc_binary() -> str:
    for path in FAKESMSC_PATHS:
        if Path(path).exists():
            return path
    return require_binary("fakesmsc", HOW)


async def fakesmsc_phone(fakesmsc: str, port: int, mo: Sms) -> asyncio.subprocess.Process:
    """Kannel's test phone, sending ``mo`` once and printing the MT it gets."""
    return await asyncio.create_subprocess_exec(
        fakesmsc,
        "-H",
        "127.0.0.1",
        "-r",
        str(port),
        "-m",
        "1",
        "-i",
        "0.2",
        mo_argument(mo),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )


def render_config(
    *, admin: int, smsbox: int, fake: int, sendsms: int, callback_url: str, workdir: Path
) -> str:
    """A bearerbox + smsbox config with one fake SMSC and one catch-all get-url service."""
    return f"""
group = core
admin-port = {admin}
admin-password = mdeci-test
admin-interface = 127.0.0.1
smsbox-port = {smsbox}
box-allow-ip = 127.0.0.1
# mdeci reassembles and acknowledges its own buffers: bearerbox must pass every segment
# with its concatenation element instead of combining them (and stripping it).
sms-combine-concatenated-mo = false
log-file = "{workdir}/bearerbox.log"
log-level = 1

group = smsc
smsc = fake
smsc-id = fake
port = {fake}
connect-allow-ip = 127.0.0.1

group = smsbox
bearerbox-host = 127.0.0.1
sendsms-port = {sendsms}
sendsms-interface = 127.0.0.1
log-file = "{workdir}/smsbox.log"
log-level = 1

group = sendsms-user
username = mdeci
password = test-pw
max-messages = 1

group = sms-service
keyword = default
get-url = "{callback_url}?from=%p&to=%P&udh=%u&text=%b"
max-messages = 0
catch-all = true
omit-empty = true
"""


class BoxExited(RuntimeError):
    """bearerbox or smsbox stopped while starting (a port taken between choice and bind)."""


def _wait_tcp(
    port: int,
    deadline: float,
    host: str = "127.0.0.1",
    proc: subprocess.Popen[bytes] | None = None,
) -> None:
    while True:
        if proc is not None and proc.poll() is not None:
            raise BoxExited(f"{proc.args!r} exited with {proc.returncode}")
        try:
            with socket.create_connection((host, port), timeout=0.2):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _wait_smsbox_connected(admin: int, deadline: float) -> None:
    """MO reaching bearerbox before smsbox connects waits for a resend; wait for smsbox."""
    url = f"http://127.0.0.1:{admin}/status.txt?password=mdeci-test"
    while True:
        with urllib.request.urlopen(url, timeout=2) as resp:
            if "smsbox:" in resp.read().decode("utf-8", "replace"):
                return
        if time.monotonic() > deadline:
            raise TimeoutError("smsbox did not connect to bearerbox")
        time.sleep(0.05)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()  # our own child, by its PID
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


Ports = dict[str, int]


def start_boxes(
    workdir: Path,
    choose_ports: Callable[[], Ports],
    render: Callable[[Ports], str],
    sendsms_host: str = "127.0.0.1",
    attempts: int = 3,
) -> tuple[list[subprocess.Popen[bytes]], Ports]:
    """bearerbox, then smsbox, from ``render(ports)``; both up and connected.

    A port the kernel hands out is free only until someone binds it: a client socket of
    another test can take it before bearerbox does, and bearerbox then exits. Such a
    start is stopped and made again on newly chosen ports.
    """
    bearerbox = require_binary("bearerbox", HOW)
    smsbox = require_binary("smsbox", HOW)
    conf = workdir / "kannel.conf"
    for attempt in range(attempts):
        ports = choose_ports()
        conf.write_text(render(ports))
        procs: list[subprocess.Popen[bytes]] = []
        try:
            deadline = time.monotonic() + 15
            with (workdir / "bearerbox.out").open("wb") as out:
                procs.append(subprocess.Popen([bearerbox, str(conf)], stdout=out, stderr=out))
            _wait_tcp(ports["admin"], deadline, proc=procs[0])
            with (workdir / "smsbox.out").open("wb") as out:
                procs.append(subprocess.Popen([smsbox, str(conf)], stdout=out, stderr=out))
            _wait_tcp(ports["sendsms"], deadline, sendsms_host, proc=procs[1])
            _wait_smsbox_connected(ports["admin"], deadline)
            return procs, ports
        except BoxExited:
            for proc in reversed(procs):
                _stop(proc)
            if attempt + 1 == attempts:
                raise
        except BaseException:
            for proc in reversed(procs):
                _stop(proc)
            raise
    raise AssertionError("unreachable: the last attempt raises")


@contextmanager
def running_kannel(workdir: Path, callback_url: str) -> Iterator[Kannel]:
    fakesmsc = fakesmsc_binary()

    def choose() -> Ports:
        return {k: free_port(socket.SOCK_STREAM) for k in ("admin", "smsbox", "fake", "sendsms")}

    def render(ports: Ports) -> str:
        return render_config(callback_url=callback_url, workdir=workdir, **ports)

    procs, ports = start_boxes(workdir, choose, render)
    try:
        yield Kannel(
            sendsms_url=f"http://127.0.0.1:{ports['sendsms']}/cgi-bin/sendsms",
            username="mdeci",
            password="test-pw",
            fake_port=ports["fake"],
            fakesmsc=fakesmsc,
            workdir=workdir,
        )
    finally:
        for proc in reversed(procs):
            _stop(proc)
