"""The server half of one socket, sans-IO: which connection a datagram is for, by its
destination connection id (never by its address: a client that moves keeps its
connection), and a new connection for a client's first Initial.

The adapter (``quicdata.aio``) feeds datagrams with their source and the time, then asks
the connections for what to send and for their timers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from aioquic.buffer import Buffer  # type: ignore[attr-defined]  # re-exported, untyped
from aioquic.quic.packet import QuicPacketType, QuicProtocolVersion, pull_quic_header

from quicdata.binding import ServerCertificate
from quicdata.connection import DEFAULT_CONFIG, QuicDataConfig, QuicDataConnection, server
from quicdata.events import Address

# RFC 9000 §14.1: a client's Initial datagram is at least 1200 bytes.
MIN_INITIAL_BYTES = 1200
CID_LENGTH = 8  # aioquic's default host connection id length


@dataclass(slots=True)
class ServerStats:
    datagrams_received: int = 0
    malformed: int = 0
    unknown_cid: int = 0
    connections: int = 0
    refused: int = 0  # Initials dropped while max_unproved connections wait for a proof


class ServerCore:
    """Connections by connection id; ``lookup`` gives a session id's secret (or None)."""

    def __init__(
        self,
        certificate: ServerCertificate,
        lookup: Callable[[bytes], bytes | None],
        config: QuicDataConfig = DEFAULT_CONFIG,
        max_unproved: int = 1024,
    ) -> None:
        self.certificate = certificate
        # A connection costs a TLS handshake and its state until its proof comes (at most
        # ``config.proof_timeout``): strangers get no more than this many at once.
        self.max_unproved = max_unproved
        self.lookup = lookup
        self.config = config
        self.stats = ServerStats()
        self._by_cid: dict[bytes, QuicDataConnection] = {}
        self._unproved: set[QuicDataConnection] = set()  # neither connected nor closed

    @property
    def connections(self) -> set[QuicDataConnection]:
        return set(self._by_cid.values())

    def receive(
        self, data: bytes, addr: Address, now: float
    ) -> tuple[QuicDataConnection | None, bool]:
        """Feed ``data`` to its connection: that connection (None: dropped, counted) and
        whether it is new."""
        self.stats.datagrams_received += 1
        try:
            header = pull_quic_header(Buffer(data=data), host_cid_length=CID_LENGTH)
        except ValueError:
            self.stats.malformed += 1
            return None, False
        connection = self._by_cid.get(header.destination_cid)
        new = False
        if connection is None:
            if (
                header.packet_type != QuicPacketType.INITIAL
                or header.version != QuicProtocolVersion.VERSION_1
                or len(data) < MIN_INITIAL_BYTES
            ):
                self.stats.unknown_cid += 1
                return None, False
            if len(self._unproved) >= self.max_unproved:
                self.stats.refused += 1
                return None, False
            connection = server(
                self.certificate, self.lookup, header.destination_cid, now, self.config
            )
            self.stats.connections += 1
            self._unproved.add(connection)
            new = True
        connection.receive_datagram(data, addr, now)
        self.track(connection)
        return connection, new

    def track(self, connection: QuicDataConnection) -> None:
        """Route the connection ids it issued to it (call after each input it took)."""
        if connection.connected or connection.closed:
            self._unproved.discard(connection)
        if connection.closed:
            return
        for cid in connection.host_cids:
            self._by_cid.setdefault(cid, connection)
        for issued, cid in connection.cid_changes:
            if issued:
                self._by_cid[cid] = connection
            elif self._by_cid.get(cid) is connection:
                del self._by_cid[cid]
        connection.cid_changes.clear()

    def forget(self, connection: QuicDataConnection) -> None:
        """Route nothing more to ``connection``."""
        self._unproved.discard(connection)
        for cid in [c for c, conn in self._by_cid.items() if conn is connection]:
            del self._by_cid[cid]
