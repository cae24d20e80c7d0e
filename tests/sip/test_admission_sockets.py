"""TCP and TLS admission with real sockets on loopback (sip/admission.py through
sip/aio/listener.py): an endpoint in its own process (tests/sip/admission_peer.py, whose
RSS and descriptors are read from /proc) and clients bound to distinct 127.0.0.x
addresses, each a distinct source.

- 3,000 idle connections to the TLS port, half of them silent and half stalled after
  the first bytes of a TLS record: the counts stay at the caps, so do the endpoint's
  descriptors and RSS, and every connection is closed at the handshake deadline.
- 300 idle connections per port from one address: a client from another address gets
  its OPTIONS answered over TCP and TLS throughout, and connections that sent a request
  outlive the first-request deadline.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.sip.certs import Certs, make_certs

Address = tuple[str, int]
GUARD = 10.0
ROOT = Path(__file__).resolve().parents[2]
# A TLS handshake record header announcing 512 bytes that never come: the endpoint then
# holds TLS state for the connection until its handshake deadline.
STALLED_HELLO = b"\x16\x03\x01\x02\x00"


@dataclass
class Peer:
    proc: subprocess.Popen[str]
    tcp: Address
    tls: Address

    def stats(self) -> dict[str, Any]:
        """The endpoint's admission counts (admission_peer.stats)."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("stats\n")
        self.proc.stdin.flush()
        line = _readline(self.proc, GUARD)
        result = json.loads(line)
        assert isinstance(result, dict)
        return result

    def count(self, key: str) -> int:
        return int(self.stats()[key])

    def source(self, host: str) -> int:
        return int(self.stats()["sources"].get(host, 0))

    def rss_kb(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise AssertionError("no VmRSS")

    def fds(self) -> int:
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))


def _readline(proc: subprocess.Popen[str], timeout: float) -> str:
    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout):
            raise AssertionError("the endpoint did not answer")
    line = proc.stdout.readline()
    assert line, "the endpoint exited"
    return line


@contextlib.contextmanager
def running_peer(certs: Certs, **limits: float) -> Iterator[Peer]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.sip.admission_peer", str(certs.cert), str(certs.key),
         json.dumps(limits)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT, env=env,
    )  # fmt: skip
    try:
        ports = json.loads(_readline(proc, 30.0))
        yield Peer(proc, ("127.0.0.1", ports["tcp"]), ("127.0.0.1", ports["tls"]))
    finally:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.close()
        try:
            proc.wait(GUARD)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(GUARD)
        proc.stdout.close()


def until(check: Callable[[], bool], timeout: float) -> None:
    """Poll the endpoint's counts (another process: nothing to await) up to ``timeout``."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)


def open_idle(src: str, dest: Address, count: int, first: bytes = b"") -> list[socket.socket]:
    """``count`` connections from ``src`` to ``dest`` that send ``first`` (maybe
    nothing) and then nothing more."""
    socks: list[socket.socket] = []
    try:
        with selectors.DefaultSelector() as sel:
            for _ in range(count):
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                socks.append(sock)
                sock.setblocking(False)
                sock.bind((src, 0))
                sock.connect_ex(dest)
                sel.register(sock, selectors.EVENT_WRITE)
            deadline = time.monotonic() + GUARD
            waiting = count
            while waiting:
                assert time.monotonic() < deadline, "connections not established"
                for key, _ in sel.select(0.5):
                    sel.unregister(key.fileobj)
                    waiting -= 1
        for sock in socks:
            if first:
                with contextlib.suppress(OSError):  # closed already: refused
                    sock.send(first)
    except BaseException:
        close_all(socks)
        raise
    return socks


def close_all(socks: list[socket.socket]) -> None:
    for sock in socks:
        sock.close()


def all_closed_by_peer(socks: list[socket.socket], timeout: float) -> bool:
    """Whether every socket reads end of stream (or a reset) within ``timeout``."""
    left = set(socks)
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as sel:
        for sock in socks:
            sel.register(sock, selectors.EVENT_READ)
        while left and time.monotonic() < deadline:
            for key, _ in sel.select(0.5):
                ready = key.fileobj
                assert isinstance(ready, socket.socket)
                try:
                    data = ready.recv(4096)
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:
                    data = b""  # reset: closed too
                if not data:
                    sel.unregister(ready)
                    left.discard(ready)
    return not left


class SipClient:
    """A legitimate client: one connection (TLS when ``tls`` is given) from ``src``."""

    def __init__(self, src: str, dest: Address, tls: ssl.SSLContext | None) -> None:
        raw = socket.create_connection(dest, timeout=GUARD, source_address=(src, 0))
        self.sock: socket.socket = raw
        self.src = src
        self.cseq = 0
        if tls is not None:
            try:
                self.sock = tls.wrap_socket(raw, server_hostname=dest[0])
            except BaseException:
                raw.close()
                raise
        self.buffer = b""

    def options(self) -> int:
        """The status of an OPTIONS sent on this connection."""
        self.cseq += 1
        port = self.sock.getsockname()[1]
        self.sock.sendall(
            (
                "OPTIONS sip:peer@127.0.0.1 SIP/2.0\r\n"
                f"Via: SIP/2.0/TCP {self.src}:{port};branch=z9hG4bK-{self.src}-{self.cseq}\r\n"
                f"From: <sip:client@example.org>;tag={self.cseq}\r\n"
                "To: <sip:peer@example.org>\r\n"
                f"Call-ID: admission-{self.src}-{port}\r\nCSeq: {self.cseq} OPTIONS\r\n"
                "Content-Length: 0\r\n\r\n"
            ).encode()
        )
        for _ in range(1000):
            if b"\r\n\r\n" in self.buffer:
                break
            data = self.sock.recv(4096)
            assert data, "connection closed before the answer"
            self.buffer += data
        head, _, self.buffer = self.buffer.partition(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() in (b"content-length", b"l"):
                length = int(value)
        for _ in range(1000):
            if len(self.buffer) >= length:
                break
            data = self.sock.recv(4096)
            assert data, "connection closed in the answer's body"
            self.buffer += data
        self.buffer = self.buffer[length:]
        return int(head.split(b" ", 2)[1])

    def close(self) -> None:
        self.sock.close()


def ask_once(src: str, dest: Address, tls: ssl.SSLContext | None) -> int:
    client = SipClient(src, dest, tls)
    try:
        return client.options()
    finally:
        client.close()


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


def client_context(certs: Certs) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(certs.ca))
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


def test_idle_connections_to_the_tls_port_stay_within_the_caps_and_expire(
    certs: Certs,
) -> None:
    caps = {"max_connections": 256, "max_per_source": 32, "max_pending": 64}
    with running_peer(certs, **caps, handshake_timeout=3.0, request_timeout=3.0) as peer:
        # One real exchange first, so the baseline has TLS and the reply path loaded.
        assert ask_once("127.0.0.2", peer.tls, client_context(certs)) == 200
        rss0, fds0 = peer.rss_kb(), peer.fds()
        socks: list[socket.socket] = []
        try:
            for i in range(30):  # 30 sources, 100 connections each
                first = STALLED_HELLO if i % 2 else b""
                socks += open_idle(f"127.0.0.{10 + i}", peer.tls, 100, first)

            def accounted(counts: dict[str, Any]) -> int:
                """Refused at the accept, displaced, past a deadline, failed the
                handshake, or still held: the kernel's backlog may hold the rest."""
                closed = sum(counts[k] for k in ("refused", "evicted", "handshake_failures"))
                return int(closed + sum(counts["expired"].values()) + counts["total"])

            until(lambda: accounted(peer.stats()) == 3000, GUARD)
            rss1, fds1 = peer.rss_kb(), peer.fds()
            held = peer.stats()
            print(f"3,000 idle TLS connections: endpoint RSS {rss0} -> {rss1} kB, "
                  f"descriptors {fds0} -> {fds1}, counts {held}")  # fmt: skip
            assert held["peak_total"] <= 256
            assert held["peak_pending"] == 64  # pending connections fill their cap only
            assert held["peak_source"] <= 32
            assert held["total"] > 0  # held until their deadline, not dropped at once
            assert fds1 - fds0 <= 64 + 4
            # At most 64 connections hold TLS state (asyncio gives each 256 KiB).
            assert rss1 - rss0 <= 40_000
            # A client from a fresh address displaces a pending connection and is served.
            assert ask_once("127.0.0.2", peer.tls, client_context(certs)) == 200
            # Every connection is closed by the handshake deadline, none left behind.
            until(lambda: peer.count("total") == 0, 3.0 + GUARD)
            assert all_closed_by_peer(socks, GUARD)
            done = peer.stats()
            assert done["expired"].get("handshake", 0) > 0
            assert done["scheduled"] <= 64 + 1
            assert peer.fds() <= fds0 + 2
            rss2 = peer.rss_kb()
            print(f"after: RSS {rss2} kB")
            assert rss2 - rss0 <= 40_000
        finally:
            close_all(socks)


def test_one_address_cannot_keep_other_clients_out(certs: Certs) -> None:
    tls = client_context(certs)
    timeouts = {"handshake_timeout": 1.0, "request_timeout": 1.0, "idle_timeout": 60.0}
    with running_peer(certs, max_connections=256, max_per_source=32, **timeouts) as peer:
        kept = [SipClient("127.0.0.2", peer.tcp, None)]
        try:
            kept.append(SipClient("127.0.0.2", peer.tls, tls))
            assert [c.options() for c in kept] == [200, 200]
            for _wave in range(3):
                held: list[socket.socket] = []
                try:
                    for _part in range(3):  # 300 per port from one address, in thirds
                        held += open_idle("127.0.0.20", peer.tcp, 100)
                        held += open_idle("127.0.0.20", peer.tls, 100)
                        assert ask_once("127.0.0.3", peer.tcp, None) == 200
                        assert ask_once("127.0.0.3", peer.tls, tls) == 200
                    # The flood fills its share and no more (what it holds at this
                    # moment depends on how many already met their deadline).
                    assert peer.source("127.0.0.20") <= 32
                    assert peer.count("peak_source") == 32
                    # The idle ones are closed at their deadline, by the endpoint.
                    assert all_closed_by_peer(held, 1.0 + GUARD)
                    assert peer.source("127.0.0.20") == 0
                finally:
                    close_all(held)
            # Connections that sent a request are established: they outlived the
            # first-request deadline three times and keep being served.
            assert [c.options() for c in kept] == [200, 200]
            assert peer.source("127.0.0.2") == 2
        finally:
            close_all([c.sock for c in kept])
