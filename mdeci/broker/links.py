"""The broker's data channels: one small interface, :class:`DataPeer` (a session's peer:
frames out, events in), and its two implementations, RUDP (:class:`RudpDataPeer`) and
QUIC (:class:`QuicDataPeerLink`, on the one :class:`QuicLinks` server). Glue only: the
transports' cores (``rudp``, ``quicdata``) decide; :class:`~mdeci.broker.service.BrokerService`
delivers over whichever one the session's answer accepted (docs/sip.md), the same way.

What the service needs of a peer, whatever the transport:

- ``send_nowait`` / ``send_many_nowait``: queue messages in order; the future is done
  when the transport took responsibility for them (RUDP: acknowledged by the agent;
  QUIC: written to the connection's stream, whose delivery QUIC makes reliable and in
  order) and fails with :class:`~rudp.errors.PeerUnreachable` when it gives up;
- a :class:`PeerListener` (the session's :class:`UserLink`) told of each message, in
  order (``on_message``), of an authentic packet (``on_heard``: RUDP's first datagram,
  QUIC's checked key proof), of a validated move (``on_path``) and of the end of the
  association (``on_gone``: QUIC's connection ended, an idle timeout included; RUDP's
  retries ran out for messages written without a future);
- ``set_address`` and ``reset`` at each (re-)INVITE: RUDP sends to the SDP address with a
  fresh retry budget; QUIC's client comes to us, so both are nothing there.

Exactly once across connections (moves, outages, restarts) stays the application's
``nseq`` and ``ack`` over either transport.
"""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from mdeci.broker.addresses import addr_text
from mdeci.broker.errors import SessionKeyError
from mdeci.broker.sessions import Status, UserSession
from mdeci.oplog import event as oplog_event
from quicdata.aio import QuicDataPeer, QuicDataServer
from quicdata.binding import ProofKeys, ServerCertificate
from quicdata.connection import DEFAULT_CONFIG, QuicDataClosed, QuicDataConfig
from rudp.aio import PeerUnreachable, RudpEndpoint, RudpPeer
from rudp.sparse import Sparse

MIN_KEY_BYTES = 16  # what RudpConnection accepts
Address = tuple[str, int]


class PeerListener(Protocol):
    """What a session's data channel reports to (module docstring). The peers keep its
    bound methods as their callbacks: a broker holds one listener per session, where a
    closure per callback would cost ~1 kB per session."""

    def on_message(self, data: bytes) -> None: ...

    def on_heard(self) -> None: ...

    def on_path(self, addr: Address, prev: Address | None) -> None: ...

    def on_gone(self, reason: str) -> None: ...


class LinkOwner(Protocol):
    """Who acts on what a :class:`UserLink`'s peer reports (the broker's service)."""

    def link_received(self, link: UserLink, data: bytes) -> None: ...

    def link_heard(self, link: UserLink) -> None: ...

    def link_gone(self, link: UserLink, reason: str) -> None: ...


class DataPeer(Protocol):
    """One session's peer on a data channel (module docstring)."""

    transport: str

    @property
    def key(self) -> bytes:
        """The session key it was made with."""
        ...

    @property
    def connected(self) -> bool:
        """The association exists and has not given up."""
        ...

    @property
    def heard(self) -> bool:
        """An authentic packet came over the current association."""
        ...

    @property
    def addr(self) -> Address | None: ...

    @property
    def path_changes(self) -> int: ...

    @property
    def backlog(self) -> int:
        """Bytes the transport holds for the agent beyond what the futures tell (QUIC:
        written and not acknowledged; RUDP: 0, its futures wait for the agent's acks).
        The service's cap on unacknowledged replies counts them (``_admit``)."""
        ...

    def bind(self, listener: PeerListener) -> None:
        """Report to ``listener`` (once, before the first send)."""

    def set_address(self, addr: Address) -> None: ...

    def reset(self) -> None: ...

    def send_nowait(self, data: bytes) -> asyncio.Future[None]: ...

    def send_many_nowait(self, data: Sequence[bytes]) -> asyncio.Future[None]: ...

    def write_many(self, data: Sequence[bytes]) -> None:
        """Queue ``data`` in order with no future (a proved path's notifies): a failure
        comes by the ``on_gone`` of :meth:`bind`."""

    def observe(self) -> tuple[float | None, int, int]:
        """(smoothed RTT in ms or None, messages sent, retransmissions): the SMS side's
        view of the IP link."""
        ...

    def close(self) -> None:
        """Drop the association; pending futures are cancelled or failed."""


class RudpDataPeer(RudpPeer):
    """:class:`DataPeer` over RUDP: a peer of the broker's endpoint that reports to its
    listener through ``PeerCore``'s hooks (no callback objects: the broker holds one per
    session). Made by :meth:`open`."""

    __slots__ = ("_listener",)
    transport = "rudp"

    def __init__(self, endpoint: RudpEndpoint, key: bytes, addr: Address, sender_id: int) -> None:
        super().__init__(endpoint, key, addr, sender_id)
        self._listener: PeerListener | None = None

    @classmethod
    def open(cls, endpoint: RudpEndpoint, key: bytes, addr: Address) -> RudpDataPeer:
        """The endpoint's peer for ``key`` (made on first use)."""
        return endpoint.peer_of(cls, key, addr)

    @property
    def heard(self) -> bool:
        return self.connection.stats.packets_received > 0

    @property
    def backlog(self) -> int:
        return 0

    def bind(self, listener: PeerListener) -> None:
        self._listener = listener

    def observe(self) -> tuple[float | None, int, int]:
        conn = self.connection
        srtt = conn.rto.srtt
        return (None if srtt is None else srtt * 1000.0, conn.stats.data_sent,
                conn.stats.retransmissions)  # fmt: skip

    def close(self) -> None:
        self._endpoint.remove_peer(self.key)

    def _report_message(self, data: bytes) -> None:
        if self._listener is not None:
            self._listener.on_message(data)
        else:
            self._deliver(data)

    def _report_heard(self) -> None:
        if self._listener is not None:
            self._listener.on_heard()

    def _report_path(self, addr: Address, previous: Address | None) -> None:
        if self._listener is not None:
            self._listener.on_path(addr, previous)

    def _report_failed(self, error: PeerUnreachable) -> None:
        # Messages written without a future (write_many) fail here, with the association.
        if self._listener is not None:
            self._listener.on_gone(error.reason)


class QuicDataPeerLink:
    """:class:`DataPeer` over the QUIC connection the agent opens to :class:`QuicLinks`
    under the session's key. Until it arrives, messages wait here; a connection that
    ends fails what waits and reports ``on_unreachable``; the agent's next connection
    under the same key (after a move QUIC could not follow) takes over."""

    transport = "quic"

    def __init__(self, links: QuicLinks, key: bytes) -> None:
        self._links = links
        self.key = key
        self.session_id = ProofKeys(key).session_id
        self.peer: QuicDataPeer | None = None
        self._waiting: list[bytes] = []
        self._futures: list[asyncio.Future[None]] = []
        self._path_changes = 0
        self._heard = False
        self._gone = False  # the last connection ended; nothing new came yet
        self._listener: PeerListener = _UNBOUND
        self.sent = 0
        links.register(self)

    @property
    def connected(self) -> bool:
        return not self._gone

    @property
    def heard(self) -> bool:
        return self._heard

    @property
    def addr(self) -> Address | None:
        return None if self.peer is None else self.peer.connection.peer_address

    @property
    def path_changes(self) -> int:
        return self._path_changes

    @property
    def backlog(self) -> int:
        peer = self.peer
        held = sum(map(len, self._waiting))
        return held if peer is None else held + peer.connection.unacked_bytes

    def bind(self, listener: PeerListener) -> None:
        self._listener = listener

    def set_address(self, addr: Address) -> None:
        pass  # the client comes to us; QUIC validates the paths it moves to

    def reset(self) -> None:
        pass  # QUIC's own timers decide; a dead connection is reported as it ends

    def send_nowait(self, data: bytes) -> asyncio.Future[None]:
        return self.send_many_nowait([data])

    def write_many(self, data: Sequence[bytes]) -> None:
        # The connection's end reports on_gone itself: the future's failure is only read.
        self.send_many_nowait(data).add_done_callback(_read_outcome)

    def send_many_nowait(self, data: Sequence[bytes]) -> asyncio.Future[None]:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self._gone:
            raise PeerUnreachable("the connection ended")
        peer = self.peer
        if peer is None or peer.disconnected is not None:
            self._waiting.extend(data)
            self._futures.append(future)
            return future
        try:
            for message in data:
                peer.send(message)
        except QuicDataClosed:
            raise PeerUnreachable("the connection ended") from None
        self.sent += len(data)
        future.set_result(None)
        return future

    def observe(self) -> tuple[float | None, int, int]:
        # aioquic keeps its RTT estimate and retransmissions to itself.
        return (None, self.sent, 0)

    def close(self) -> None:
        self._links.unregister(self)
        self._fail("closed", cancel=True)
        if self.peer is not None and self.peer.disconnected is None:
            self.peer.close("session over")
        self.peer = None

    # ---------------------------------------------------------------- from QuicLinks

    def take(self, peer: QuicDataPeer) -> None:
        """``peer`` proved it holds the session's key: it carries the session now."""
        old, self.peer = self.peer, peer
        if old is not None and old is not peer and old.disconnected is None:
            old.close("replaced by a new connection")
        self._gone = False
        self._heard = True
        peer.on_message = self._listener.on_message
        peer.on_disconnected = lambda reason: self._ended(peer, reason)
        peer.on_path_changed = self._path
        waiting, self._waiting = self._waiting, []
        futures, self._futures = self._futures, []
        for message in waiting:
            peer.send(message)
        self.sent += len(waiting)
        for future in futures:
            if not future.done():
                future.set_result(None)
        self._listener.on_heard()

    def _path(self, addr: Address, prev: Address | None) -> None:
        self._path_changes += 1
        self._listener.on_path(addr, prev)

    def _ended(self, peer: QuicDataPeer, reason: str) -> None:
        if peer is not self.peer:
            return
        self._gone = True
        self._fail(reason, cancel=False)
        self._listener.on_gone(reason)

    def _fail(self, reason: str, *, cancel: bool) -> None:
        futures, self._futures = self._futures, []
        self._waiting = []
        for future in futures:
            if future.done():
                continue
            if cancel:
                future.cancel()
            else:
                future.set_exception(PeerUnreachable(reason))


@dataclass(eq=False)
class QuicLinks:
    """The broker's QUIC server and the sessions it serves, by the session id of their
    key proof (``quicdata.binding``)."""

    certificate: ServerCertificate
    server: QuicDataServer | None = None
    _by_id: dict[bytes, QuicDataPeerLink] = field(default_factory=dict)

    @classmethod
    async def open(cls, host: str, port: int, config: QuicDataConfig = DEFAULT_CONFIG) -> QuicLinks:
        """Bind the server on host:port (0: any free port). Raises OSError."""
        now = datetime.datetime.now(datetime.UTC)
        links = cls(ServerCertificate.generate(now))
        links.server = await QuicDataServer.open(
            host, port, links.certificate, links._lookup, links._connection, config
        )
        return links

    @property
    def local_addr(self) -> Address:
        assert self.server is not None
        return self.server.local_addr

    @property
    def fingerprint(self) -> bytes:
        return self.certificate.fingerprint

    def register(self, link: QuicDataPeerLink) -> None:
        self._by_id[link.session_id] = link

    def unregister(self, link: QuicDataPeerLink) -> None:
        if self._by_id.get(link.session_id) is link:
            del self._by_id[link.session_id]

    def _lookup(self, session_id: bytes) -> bytes | None:
        link = self._by_id.get(session_id)
        return None if link is None else link.key

    def _connection(self, peer: QuicDataPeer) -> None:
        def proved() -> None:
            sid = peer.session_id
            link = None if sid is None else self._by_id.get(sid)
            if link is None:
                peer.close("no such session")
            else:
                link.take(peer)

        peer.on_connected = proved

    async def close(self) -> None:
        if self.server is not None:
            await self.server.close()
            self.server = None


@dataclass(slots=True, eq=False)
class UserLink:
    """The transport side of ``uri``'s session: its data channel's peer and what is in
    flight on it. Whether it is delivered to, and its epoch, are the Session Manager's
    (``session``, read here, changed only there). Its user and key are its session's
    and its peer's (a broker holds one link per session: no copies)."""

    peer: DataPeer
    session: UserSession
    owner: LinkOwner
    sends: set[asyncio.Future[None]] | None = None  # only while sends are in flight
    # Bytes of replies sent and not yet acknowledged by the user's RUDP (see _admit).
    reply_bytes: int = 0
    sparse: dict[str, Any] | None = None  # the two below, once set (rudp.sparse)
    # Rarely set (a user who lists, a user over the cap), so not a slot of every link.
    listing_bytes = Sparse(16384)  # the size of this user's last `subs` (see _admit)
    refusing = Sparse(False)  # over the cap: its requests are answered 503, logged once

    @property
    def uri(self) -> str:
        return self.session.uri

    @property
    def key(self) -> bytes:
        """The key the peer was made with (a re-key makes another link)."""
        return self.peer.key

    @property
    def delivering(self) -> bool:
        """The session is CONNECTED: notifications are sent."""
        return self.session.status is Status.CONNECTED

    @property
    def epoch(self) -> int:
        """The session's epoch: a send of another one belongs to no current connection."""
        return self.session.epoch

    # ---------------------------------------------------------------- PeerListener

    def on_message(self, data: bytes) -> None:
        self.owner.link_received(self, data)

    def on_heard(self) -> None:
        self.owner.link_heard(self)

    def on_path(self, addr: Address, prev: Address | None) -> None:
        # RUDP follows a NAT rebinding by itself; the operator sees it only here.
        prev_text = None if prev is None else addr_text(prev)
        oplog_event("path_changed", uri=self.uri, addr=addr_text(addr), prev_addr=prev_text)

    def on_gone(self, reason: str) -> None:
        self.owner.link_gone(self, reason)


class _Unbound:
    """The listener of a peer not bound yet: what it reports goes nowhere."""

    __slots__ = ()

    def on_message(self, data: bytes) -> None:
        pass

    def on_heard(self) -> None:
        pass

    def on_path(self, addr: Address, prev: Address | None) -> None:
        pass

    def on_gone(self, reason: str) -> None:
        pass


_UNBOUND = _Unbound()


def check_key(key: bytes) -> None:
    """Raises :class:`SessionKeyError` for a key RUDP cannot use (under 16 bytes)."""
    if len(key) < MIN_KEY_BYTES:
        raise SessionKeyError(f"session key of {len(key)} bytes; need {MIN_KEY_BYTES}")


def _read_outcome(future: asyncio.Future[None]) -> None:
    """Retrieve a future's outcome that another path reports (asyncio logs one unread)."""
    if not future.cancelled():
        future.exception()
