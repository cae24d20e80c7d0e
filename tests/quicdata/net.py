"""An in-memory network for sans-IO QUIC tests: a client connection and a server core
exchange datagrams under a fake clock, with the client's source address settable (a
move) and either direction cut (an outage)."""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field

from quicdata.binding import ServerCertificate
from quicdata.connection import DEFAULT_CONFIG, QuicDataConfig, QuicDataConnection, client
from quicdata.endpoint import ServerCore
from quicdata.events import Address, QuicDataEvent

SERVER: Address = ("192.0.2.1", 4433)
CLIENT: Address = ("198.51.100.7", 50000)
SECRET = bytes(range(32))
_CERTIFICATE: ServerCertificate | None = None


def certificate() -> ServerCertificate:
    """One certificate for the whole run (making a key costs more than a test)."""
    global _CERTIFICATE
    if _CERTIFICATE is None:
        _CERTIFICATE = ServerCertificate.generate(
            datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
        )
    return _CERTIFICATE


@dataclass
class Net:
    client: QuicDataConnection
    server: ServerCore
    now: float = 1000.0
    client_addr: Address = CLIENT
    cut_up: bool = False  # client -> server datagrams lost
    cut_down: bool = False  # server -> client datagrams lost
    client_events: list[QuicDataEvent] = field(default_factory=list)
    server_events: list[QuicDataEvent] = field(default_factory=list)
    accepted: list[QuicDataConnection] = field(default_factory=list)
    wire: list[bytes] = field(default_factory=list)  # every datagram, both ways
    delivered_up: int = 0  # client -> server datagrams that arrived

    @property
    def peer(self) -> QuicDataConnection:
        assert self.accepted, "the server has no connection"
        return self.accepted[-1]

    def pump(self, rounds: int = 50) -> None:
        """Exchange datagrams until neither side has any to send."""
        for _ in range(rounds):
            moved = False
            for data, dest in self.client.datagrams_to_send(self.now):
                assert dest == SERVER
                moved = True
                self.wire.append(data)
                if not self.cut_up:
                    self.delivered_up += 1
                    conn, new = self.server.receive(data, self.client_addr, self.now)
                    if new and conn is not None:
                        self.accepted.append(conn)
            for conn in list(self.server.connections):
                for data, dest in conn.datagrams_to_send(self.now):
                    moved = True
                    self.wire.append(data)
                    if not self.cut_down and dest == self.client_addr:
                        self.client.receive_datagram(data, SERVER, self.now)
            self._collect()
            if not moved:
                return
        raise AssertionError("the datagrams never stopped")

    def advance(self, seconds: float, step: float = 0.05) -> None:
        """Let ``seconds`` pass, firing every timer on the way and exchanging datagrams."""
        end = self.now + seconds
        while self.now < end:
            timers = [
                t
                for t in [self.client.get_timer()]
                + [c.get_timer() for c in self.server.connections]
                if t is not None
            ]
            self.now = min([end, self.now + step, *[t for t in timers if t > self.now]])
            self.client.handle_timer(self.now)
            for conn in list(self.server.connections):
                conn.handle_timer(self.now)
                self.server.track(conn)
            self.pump()

    def _collect(self) -> None:
        while (event := self.client.next_event()) is not None:
            self.client_events.append(event)
        for conn in self.accepted:
            while (event := conn.next_event()) is not None:
                self.server_events.append(event)


def pair(
    *,
    secret: bytes = SECRET,
    server_secret: bytes | None = SECRET,
    fingerprint: bytes | None = None,
    config: QuicDataConfig = DEFAULT_CONFIG,
) -> Net:
    """A client and a server core that knows ``server_secret`` for the client's session."""
    cert = certificate()
    conn = client(secret, fingerprint or cert.fingerprint, SERVER, 1000.0, config)
    expected = conn.session_id

    def lookup(session_id: bytes) -> bytes | None:
        return server_secret if session_id == expected else None

    return Net(conn, ServerCore(cert, lookup, config))
