"""The probe of idle TCP/TLS connections against the broker itself (``python -m mdeci
broker`` with TLS, default limits): 3,000 idle connections to its TLS port from 30
loopback addresses and 300 per port from one address leave its descriptors and RSS
bounded, and a client from another address gets its OPTIONS answered over TCP and TLS
all along."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from tests.e2e.harness_b import BrokerProcess
from tests.sip.certs import make_certs
from tests.sip.test_admission_sockets import (
    STALLED_HELLO,
    ask_once,
    client_context,
    close_all,
    open_idle,
)


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


async def test_idle_connection_floods_leave_the_broker_bounded_and_serving(
    tmp_path: Path,
) -> None:
    certs = make_certs(tmp_path / "certs")
    broker = BrokerProcess(
        tmp_path / "broker",
        sip=(
            'transports = ["udp", "tcp", "tls"]\ntls_port = 0\n'
            f'tls_cert = "{certs.cert}"\ntls_key = "{certs.key}"\n'
        ),
    )
    tls = client_context(certs)
    socks: list[socket.socket] = []
    try:
        await broker.start()
        assert broker.proc is not None and broker.tls_addr is not None
        pid, tcp_addr, tls_addr = broker.proc.pid, broker.sip_addr, broker.tls_addr

        def served() -> None:
            # Each answer also means the broker's loop ran its accepts since the flood.
            assert ask_once("127.0.0.2", tcp_addr, None) == 200
            assert ask_once("127.0.0.2", tls_addr, tls) == 200

        served()
        rss0, fds0 = rss_kb(pid), fds(pid)
        for i in range(30):  # 30 sources, 100 connections each, to the TLS port
            socks += open_idle(f"127.0.0.{10 + i}", tls_addr, 100, STALLED_HELLO if i % 2 else b"")
            if i % 10 == 9:
                served()
        for _ in range(3):  # 300 per port from one address
            socks += open_idle("127.0.0.20", tcp_addr, 100)
            socks += open_idle("127.0.0.20", tls_addr, 100)
            served()
        rss1, fds1 = rss_kb(pid), fds(pid)
        print(f"broker under 3,600 idle connections: RSS {rss0} -> {rss1} kB, "
              f"descriptors {fds0} -> {fds1}")  # fmt: skip
        assert fds1 - fds0 <= 64 + 8  # idle connections are pending ones: 64 at most
        assert rss1 - rss0 <= 40_000
    finally:
        close_all(socks)
        await broker.stop()
