"""Our own bearerbox + smsbox on loopback ports, from a generated config; stopped by PID."""

from __future__ import annotations

import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

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


def _wait_tcp(port: int, deadline: float, host: str = "127.0.0.1") -> None:
    while True:
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


@contextmanager
def running_kannel(workdir: Path, callback_url: str) -> Iterator[Kannel]:
    bearerbox = require_binary("bearerbox", HOW)
    smsbox = require_binary("smsbox", HOW)
    fakesmsc = fakesmsc_binary()
    tcp = socket.SOCK_STREAM
    ports = {k: free_port(tcp) for k in ("admin", "smsbox", "fake", "sendsms")}
    conf = workdir / "kannel.conf"
    conf.write_text(render_config(callback_url=callback_url, workdir=workdir, **ports))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        out = (workdir / "bearerbox.out").open("wb")
        procs.append(subprocess.Popen([bearerbox, str(conf)], stdout=out, stderr=out))
        deadline = time.monotonic() + 15
        _wait_tcp(ports["admin"], deadline)
        out = (workdir / "smsbox.out").open("wb")
        procs.append(subprocess.Popen([smsbox, str(conf)], stdout=out, stderr=out))
        _wait_tcp(ports["sendsms"], deadline)
        _wait_smsbox_connected(ports["admin"], deadline)
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
