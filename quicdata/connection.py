"""One QUIC connection carrying our messages, sans-IO: datagrams and the clock in,
datagrams and events out (``quicdata.events``), around aioquic's ``QuicConnection``.

One bidirectional stream (the client's first, id 0) carries messages length-prefixed
(``quicdata.framing``). The first message each way is the key proof
(``quicdata.binding``): the client's, then the server's. Before both are checked no
message is delivered and none of ours is sent (they wait), so a party in the middle
learns nothing; a proof that fails closes the connection and logs one line. The client
also checks the server certificate's SHA-256 fingerprint against the SDP answer's, at
the end of the handshake.

Keepalives: an open connection sends a PING every ``keepalive`` seconds, so that QUIC's
idle timeout (``idle_timeout``) means the peer is gone, and the connection reports
:class:`PeerDisconnected` (QUIC has no other end for a path whose losses never recover:
its probes go on until the idle timeout).

aioquic 1.x gives three things only through private attributes, read in
:func:`_peer_certificate`, :func:`_current_path` and :func:`_unacked`: the server's
certificate at the client, the path datagrams currently go to (a migration's new
address), and how much of the stream the peer has not acknowledged yet (what a peer that
reads nothing makes us hold).
"""

from __future__ import annotations

import logging
import ssl
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TextIO, cast

from aioquic.quic import events as quic_events
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection

from quicdata import framing
from quicdata.binding import (
    ALPN,
    PROOF_BYTES,
    SESSION_ID_BYTES,
    ProofKeys,
    ServerCertificate,
    binding_value,
    fingerprint,
    format_fingerprint,
)
from quicdata.congestion import FLOORED_RENO
from quicdata.events import (
    Address,
    Connected,
    MessageReceived,
    PathValidated,
    PeerDisconnected,
    QuicDataEvent,
)
from quicdata.migration import MigrationWatch

log = logging.getLogger("quicdata")

# The application error code of a close we decide (a proof, a fingerprint, the framing).
CLOSE_REFUSED = 0x1
STREAM_ID = 0  # the client's first bidirectional stream


class QuicDataClosed(Exception):
    """The connection is closed: nothing more can be sent on it."""


@dataclass(frozen=True, slots=True)
class QuicDataConfig:
    idle_timeout: float = 30.0
    keepalive: float = 10.0
    # No key proof within this long after the connection began: closed.
    proof_timeout: float = 10.0
    max_message_size: int = framing.MAX_MESSAGE_BYTES
    # QUIC flow-control windows (per connection and per stream).
    window: int = 4 << 20
    # After a client's move: a PING whenever the server is silent this long, for at most
    # migration_watch seconds (quicdata/migration.py).
    migration_probe: float = 0.1
    migration_watch: float = 3.0
    # aioquic's congestion-control algorithm: FLOORED_RENO (quicdata/congestion.py),
    # "reno" or "cubic".
    congestion: str = FLOORED_RENO


DEFAULT_CONFIG = QuicDataConfig()


class _KeyLog:
    """aioquic's key log hook (``secrets_log_file``), kept in memory: the client's 1-RTT
    traffic secret is the binding's input."""

    __slots__ = ("client_secret",)

    def __init__(self) -> None:
        self.client_secret: bytes | None = None

    def write(self, line: str) -> int:
        parts = line.split()
        if len(parts) == 3 and parts[0] == "CLIENT_TRAFFIC_SECRET_0":
            self.client_secret = bytes.fromhex(parts[2])
        return len(line)

    def flush(self) -> None:
        return None


def _peer_certificate(quic: QuicConnection) -> Any:
    return quic.tls._peer_certificate


def _current_path(quic: QuicConnection) -> tuple[Address, bool] | None:
    paths = quic._network_paths
    if not paths:
        return None
    return (str(paths[0].addr[0]), int(paths[0].addr[1])), bool(paths[0].is_validated)


def _unacked(quic: QuicConnection) -> int:
    stream = quic._streams.get(STREAM_ID)
    if stream is None:
        return 0
    return int(stream.sender._buffer_stop - stream.sender._buffer_start)


def _configuration(config: QuicDataConfig, is_client: bool, key_log: _KeyLog) -> QuicConfiguration:
    return QuicConfiguration(
        alpn_protocols=[ALPN],
        is_client=is_client,
        idle_timeout=config.idle_timeout,
        congestion_control_algorithm=config.congestion,
        max_data=config.window,
        max_stream_data=config.window,
        # Only write() and flush() are called on it.
        secrets_log_file=cast(TextIO, key_log),
        # The certificate is self-signed: the client checks its fingerprint instead.
        verify_mode=ssl.CERT_NONE,
    )


class QuicDataConnection:
    """Use :func:`client` or :func:`server` to make one."""

    def __init__(
        self,
        quic: QuicConnection,
        key_log: _KeyLog,
        config: QuicDataConfig,
        now: float,
        *,
        keys: ProofKeys | None = None,
        expected_fingerprint: bytes | None = None,
        lookup: Callable[[bytes], bytes | None] | None = None,
    ) -> None:
        self.config = config
        self.is_client = keys is not None
        self._quic = quic
        self._key_log = key_log
        self._keys = keys
        self._expected_fingerprint = expected_fingerprint
        self._lookup = lookup
        self._decoder = framing.StreamDecoder(config.max_message_size)
        self._events: deque[QuicDataEvent] = deque()
        self._binding: bytes | None = None
        self._early: list[bytes] = []  # messages before the handshake completed here
        self._outbox: list[bytes] = []  # ours, until both proofs are checked
        self._open = False
        self._closed = False
        self._proof_deadline = now + config.proof_timeout
        self._next_ping: float | None = None
        self._ping_uid = 0
        self._path: Address | None = None
        self._watch = MigrationWatch(config.migration_probe, config.migration_watch)
        #: Connection ids issued (True) and retired (False), for a server's routing.
        self.cid_changes: list[tuple[bool, bytes]] = []

    # ------------------------------------------------------------------ state

    @property
    def connected(self) -> bool:
        return self._open and not self._closed

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def session_id(self) -> bytes | None:
        return self._keys.session_id if self._keys is not None else None

    @property
    def peer_address(self) -> Address | None:
        current = _current_path(self._quic)
        return current[0] if current is not None else None

    @property
    def unacked_bytes(self) -> int:
        """Bytes of our messages not yet acknowledged by the peer (waiting for the proofs,
        or sent and not acknowledged): the memory a peer that reads nothing holds here."""
        return sum(map(len, self._outbox)) + _unacked(self._quic)

    @property
    def host_cids(self) -> list[bytes]:
        """The connection ids that name this connection at our end now."""
        return [self._quic.host_cid, self._quic.original_destination_connection_id]

    # ------------------------------------------------------------------ inputs

    def receive_datagram(self, data: bytes, addr: Address, now: float) -> None:
        if self._watch.active:
            self._watch.heard(len(data), now)
        self._quic.receive_datagram(data, addr, now)
        self._process(now)

    def handle_timer(self, now: float) -> None:
        due = self._quic.get_timer()
        if due is not None and now >= due:
            self._quic.handle_timer(now)
        if self._watch.active and self._watch.fire(now) and not self._closed:
            self._ping_uid += 1
            self._quic.send_ping(self._ping_uid)
        if not self._closed:
            if self._open and self._next_ping is not None and now >= self._next_ping:
                self._ping_uid += 1
                self._quic.send_ping(self._ping_uid)
                self._next_ping = now + self.config.keepalive
            elif not self._open and now >= self._proof_deadline:
                self._refuse(f"no key proof within {self.config.proof_timeout:g} s")
        self._process(now)

    def send_message(self, data: bytes) -> None:
        """Queue one message. Raises QuicDataClosed, StreamFramingError (empty, too large)."""
        if self._closed:
            raise QuicDataClosed("the QUIC connection is closed")
        frame = framing.encode(data, self.config.max_message_size)
        if self._open:
            self._quic.send_stream_data(STREAM_ID, frame)
        else:
            self._outbox.append(frame)

    def migrate(self, now: float) -> None:
        """Our address changed (client): a new connection id and a PING from there, so the
        server sees the new path at once and validates it; more while it stays silent
        (:class:`~quicdata.migration.MigrationWatch`)."""
        self._quic.change_connection_id()
        self._ping_uid += 1
        self._quic.send_ping(self._ping_uid)
        self._watch.start(now)

    def close(self, reason: str = "closed") -> None:
        """Close now (CONNECTION_CLOSE goes out with the next datagrams); no event."""
        if not self._closed:
            self._closed = True
            self._quic.close(reason_phrase=reason)

    # ------------------------------------------------------------------ outputs

    def datagrams_to_send(self, now: float) -> list[tuple[bytes, Address]]:
        out = [(d, (str(a[0]), int(a[1]))) for d, a in self._quic.datagrams_to_send(now)]
        if self._watch.active:
            for data, _ in out:
                self._watch.sent(len(data))
        return out

    def get_timer(self) -> float | None:
        times = [self._quic.get_timer(), self._watch.due]
        if not self._closed:
            times.append(self._next_ping if self._open else self._proof_deadline)
        due = [t for t in times if t is not None]
        return min(due) if due else None

    def next_event(self) -> QuicDataEvent | None:
        return self._events.popleft() if self._events else None

    # ------------------------------------------------------------------ the work

    def _process(self, now: float) -> None:
        while (event := self._quic.next_event()) is not None:
            if isinstance(event, quic_events.HandshakeCompleted):
                self._handshake_done(event, now)
            elif isinstance(event, quic_events.StreamDataReceived):
                self._stream_data(event, now)
            elif isinstance(event, quic_events.ConnectionTerminated):
                self._terminated(event)
            elif isinstance(event, quic_events.ConnectionIdIssued):
                self.cid_changes.append((True, event.connection_id))
            elif isinstance(event, quic_events.ConnectionIdRetired):
                self.cid_changes.append((False, event.connection_id))
        if not self.is_client and self._open and not self._closed:
            self._check_path()

    def _handshake_done(self, event: quic_events.HandshakeCompleted, now: float) -> None:
        if self._closed:
            return
        secret = self._key_log.client_secret
        if secret is None or event.alpn_protocol != ALPN:
            self._refuse(f"handshake without the {ALPN!r} protocol or its secrets")
            return
        self._binding = binding_value(secret)
        self._key_log.client_secret = None  # the binding is all that is needed of it
        if self._keys is not None:  # the client
            got = fingerprint(_peer_certificate(self._quic))
            if got != self._expected_fingerprint:
                self._refuse(
                    f"the broker's certificate {format_fingerprint(got)} is not the one "
                    "the SDP answer names"
                )
                return
            self._quic.send_stream_data(
                STREAM_ID, framing.encode(self._keys.client_proof(self._binding))
            )
        early, self._early = self._early, []
        for message in early:
            self._message(message, now)

    def _stream_data(self, event: quic_events.StreamDataReceived, now: float) -> None:
        if self._closed:
            return
        if event.stream_id != STREAM_ID:
            self._refuse(f"data on stream {event.stream_id}, not {STREAM_ID}")
            return
        try:
            messages = self._decoder.feed(event.data)
        except framing.StreamFramingError as exc:
            self._refuse(f"stream framing: {exc}")
            return
        for message in messages:
            if self.closed:  # a proof that failed closed it: nothing after it counts
                return
            if self._binding is None:
                self._early.append(message)
            else:
                self._message(message, now)

    def _message(self, message: bytes, now: float) -> None:
        if self._open:
            self._events.append(MessageReceived(message))
        elif self._keys is None:
            self._check_client_proof(message, now)
        else:
            assert self._binding is not None
            if not self._keys.check_server(message, self._binding):
                self._refuse("the broker's key proof failed (it does not hold the session key)")
                return
            self._opened(now)

    def _check_client_proof(self, message: bytes, now: float) -> None:
        assert self._binding is not None
        if len(message) != SESSION_ID_BYTES + PROOF_BYTES:
            self._refuse("the agent's key proof is malformed")
            return
        secret = self._lookup(message[:SESSION_ID_BYTES]) if self._lookup is not None else None
        if secret is None:
            self._refuse("the agent's key proof names no session of ours")
            return
        keys = ProofKeys(secret)
        if not keys.check_client(message, self._binding):
            self._refuse("the agent's key proof failed (it does not hold the session key)")
            return
        self._keys = keys
        self._quic.send_stream_data(STREAM_ID, framing.encode(keys.server_proof(self._binding)))
        self._opened(now)

    def _opened(self, now: float) -> None:
        assert self._keys is not None
        self._open = True
        self._next_ping = now + self.config.keepalive
        current = _current_path(self._quic)
        self._path = current[0] if current is not None else None
        self._events.append(Connected(self._keys.session_id))
        outbox, self._outbox = self._outbox, []
        for frame in outbox:
            self._quic.send_stream_data(STREAM_ID, frame)

    def _check_path(self) -> None:
        current = _current_path(self._quic)
        if current is None:
            return
        addr, validated = current
        if validated and addr != self._path:
            previous, self._path = self._path, addr
            self._events.append(PathValidated(addr, previous))

    def _refuse(self, reason: str) -> None:
        log.warning("quic %s: %s: connection closed", self._who(), reason)
        self._closed = True
        self._quic.close(error_code=CLOSE_REFUSED, reason_phrase=reason[:200])
        self._events.append(PeerDisconnected(reason))

    def _terminated(self, event: quic_events.ConnectionTerminated) -> None:
        if self._closed:
            return
        self._closed = True
        if event.reason_phrase == "Idle timeout":
            reason = "idle timeout"
        else:
            reason = f"closed by the peer ({event.error_code}): {event.reason_phrase}"
        if not self._open:
            log.warning("quic %s: closed before the key proofs: %s", self._who(), reason)
        self._events.append(PeerDisconnected(reason))

    def _who(self) -> str:
        role = "client" if self.is_client else "server"
        return f"{role}, peer {self.peer_address}"


def client(
    session_secret: bytes,
    expected_fingerprint: bytes,
    server: Address,
    now: float,
    config: QuicDataConfig = DEFAULT_CONFIG,
) -> QuicDataConnection:
    """The agent's connection to ``server``; its first datagrams are ready at once."""
    key_log = _KeyLog()
    quic = QuicConnection(configuration=_configuration(config, True, key_log))
    connection = QuicDataConnection(
        quic, key_log, config, now,
        keys=ProofKeys(session_secret), expected_fingerprint=expected_fingerprint,
    )  # fmt: skip
    quic.connect(server, now)
    return connection


def server(
    certificate: ServerCertificate,
    lookup: Callable[[bytes], bytes | None],
    original_destination_cid: bytes,
    now: float,
    config: QuicDataConfig = DEFAULT_CONFIG,
) -> QuicDataConnection:
    """A broker's connection for a client's first Initial (whose destination connection
    id is ``original_destination_cid``); ``lookup`` gives the session secret of a session
    id, or None."""
    key_log = _KeyLog()
    configuration = _configuration(config, False, key_log)
    configuration.certificate = certificate.certificate
    configuration.private_key = certificate.private_key
    quic = QuicConnection(
        configuration=configuration, original_destination_connection_id=original_destination_cid
    )
    return QuicDataConnection(quic, key_log, config, now, lookup=lookup)
