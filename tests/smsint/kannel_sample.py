"""bearerbox + smsbox from a temp copy of ``configs/kannel.conf`` with free loopback ports."""

from __future__ import annotations

import re
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.peers import free_port, require_binary
from tests.sms.kannel_harness import HOW, _stop, _wait_smsbox_connected, _wait_tcp

SAMPLE = Path(__file__).resolve().parents[2] / "configs" / "kannel.conf"
ADMIN_PASSWORD = "mdeci-test"
SENDSMS_PASSWORD = "test-pw"


@dataclass(frozen=True)
class SampleKannel:
    sendsms_url: str
    fake_port: int
    callback_port: int


def adapt_sample(text: str, ports: dict[str, int], workdir: Path) -> str:
    """The sample config with our ports, passwords and log files (nothing else changed)."""

    def setting(name: str, value: str, src: str, count: int = 0) -> str:
        return re.sub(rf"(?m)^{name} = .*$", f"{name} = {value}", src, count=count)

    text = setting("admin-port", str(ports["admin"]), text)
    text = setting("admin-password", ADMIN_PASSWORD, text)
    text = setting("smsbox-port", str(ports["smsbox"]), text)
    text = setting("port", str(ports["fake"]), text)
    text = setting("sendsms-port", str(ports["sendsms"]), text)
    text = setting("password", SENDSMS_PASSWORD, text)
    text = text.replace('"/var/log/kannel/', f'"{workdir}/')
    return text.replace("127.0.0.1:13080/", f"127.0.0.1:{ports['callback']}/")


@contextmanager
def running_sample_kannel(workdir: Path) -> Iterator[SampleKannel]:
    bearerbox = require_binary("bearerbox", HOW)
    smsbox = require_binary("smsbox", HOW)
    tcp = socket.SOCK_STREAM
    ports = {k: free_port(tcp) for k in ("admin", "smsbox", "fake", "sendsms", "callback")}
    conf = workdir / "kannel.conf"
    conf.write_text(adapt_sample(SAMPLE.read_text(), ports, workdir))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        with (workdir / "bearerbox.out").open("wb") as out:
            procs.append(subprocess.Popen([bearerbox, str(conf)], stdout=out, stderr=out))
        deadline = time.monotonic() + 15
        _wait_tcp(ports["admin"], deadline)
        with (workdir / "smsbox.out").open("wb") as out:
            procs.append(subprocess.Popen([smsbox, str(conf)], stdout=out, stderr=out))
        _wait_tcp(ports["sendsms"], deadline)
        _wait_smsbox_connected(ports["admin"], deadline)
        yield SampleKannel(
            sendsms_url=f"http://127.0.0.1:{ports['sendsms']}/cgi-bin/sendsms",
            fake_port=ports["fake"],
            callback_port=ports["callback"],
        )
    finally:
        for proc in reversed(procs):
            _stop(proc)
