"""bearerbox + smsbox from a temp copy of ``configs/kannel.conf`` with free loopback ports."""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.peers import free_port
from tests.sms.kannel_harness import Ports, _stop, start_boxes

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
    def choose() -> Ports:
        names = ("admin", "smsbox", "fake", "sendsms", "callback")
        return {k: free_port(socket.SOCK_STREAM) for k in names}

    def render(ports: Ports) -> str:
        return adapt_sample(SAMPLE.read_text(), ports, workdir)

    procs, ports = start_boxes(workdir, choose, render)
    try:
        yield SampleKannel(
            sendsms_url=f"http://127.0.0.1:{ports['sendsms']}/cgi-bin/sendsms",
            fake_port=ports["fake"],
            callback_port=ports["callback"],
        )
    finally:
        for proc in reversed(procs):
            _stop(proc)
