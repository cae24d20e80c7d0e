"""The agent's data channel to the broker: one interface, :class:`DataLink` (frames out,
bursts of messages in, a lost peer reported), and its RUDP implementation,
:class:`MediaLink`; the QUIC one is :class:`mdeci.agent.quic_media.QuicMediaLink`. The
glue attaches the one the session's SDP answer accepted (``AttachMedia.transport``) and
detaches the other.

:class:`MediaLink` is glue (it runs on the event loop): :meth:`MediaLink.attach` points
the peer at the broker's media address under the session's key (a new key: a new peer),
:meth:`MediaLink.send` sends a frame without a task, and the messages RUDP reads in one
loop turn are handed to ``on_burst`` together once the turn's reading is done, so that
the core records a burst's notifications with one ``fsync`` (docs/agent.md). A peer
RUDP gives up on is reported to ``on_lost`` with the reason, and a new incarnation of the
broker speaking under the key of a peer given up on, to ``on_restarted``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol

from mdeci.agent.events import AttachMedia
from rudp.aio import RudpEndpoint, RudpPeer
from rudp.errors import PeerUnreachable

Address = tuple[str, int]


class Bursts:
    """The messages a data channel reads in one loop turn, handed to ``on_burst`` together
    once the turn's reading is done (one ``fsync`` per burst, not per message); nothing
    is handed over once ``is_closed()``."""

    __slots__ = ("_is_closed", "_on_burst", "_pending", "_soon")

    def __init__(
        self, on_burst: Callable[[list[bytes]], None], is_closed: Callable[[], bool]
    ) -> None:
        self._on_burst = on_burst
        self._is_closed = is_closed
        self._pending: list[bytes] = []
        self._soon = False

    def add(self, data: bytes) -> None:
        self._pending.append(data)
        if not self._soon:
            self._soon = True
            asyncio.get_running_loop().call_soon(self._take)

    def clear(self) -> None:
        self._pending.clear()

    def _take(self) -> None:
        self._soon = False
        burst, self._pending = self._pending, []
        if burst and not self._is_closed():
            self._on_burst(burst)


class DataLink(Protocol):
    """The broker's peer on one data channel. ``on_burst`` gets the messages read in one
    loop turn together, ``on_lost`` the reason the channel gave the broker up; nothing is
    reported once :attr:`closed`."""

    closed: bool

    def send(self, data: bytes) -> None:
        """Send a frame, in order; a failure is reported to ``on_lost``."""

    def attach(self, command: AttachMedia) -> None:
        """Open (or keep, for the same key and broker) the channel ``command`` names."""

    def detach(self) -> None:
        """Drop the channel (the session went to the other transport, or ended)."""

    def stop_reader(self) -> None:
        """Read nothing more from the current peer (and drop what was read)."""

    async def rebind(self, host: str) -> None:
        """Our address is ``host`` now: follow it. Raises OSError."""


class MediaLink:
    """The broker's peer on ``endpoint``; nothing is reported once :attr:`closed`."""

    def __init__(
        self,
        endpoint: RudpEndpoint,
        on_burst: Callable[[list[bytes]], None],
        on_lost: Callable[[str], None],
        on_restarted: Callable[[], None] = lambda: None,
    ) -> None:
        self.endpoint = endpoint
        self._on_lost = on_lost
        self._on_restarted = on_restarted
        self.closed = False
        self._peer: RudpPeer | None = None
        self._peer_key: bytes | None = None
        self._burst = Bursts(on_burst, lambda: self.closed)

    def send(self, data: bytes) -> None:
        # No task per frame (a task and its steps cost the device more than the frame's
        # encoding): the acknowledgement's future reports a failure.
        peer = self._peer
        if peer is None:
            return
        try:
            future = peer.send_nowait(data)
        except PeerUnreachable as exc:
            # Not from inside the glue's loop over the core's commands: next iteration.
            asyncio.get_running_loop().call_soon(self._send_failed, peer, exc)
            return
        future.add_done_callback(lambda done: self._sent(peer, done))

    def _sent(self, peer: RudpPeer, future: asyncio.Future[None]) -> None:
        if future.cancelled():
            return
        exc = future.exception()  # retrieved even when closing: asyncio would log it
        if isinstance(exc, PeerUnreachable):
            self._send_failed(peer, exc)

    def _send_failed(self, peer: RudpPeer, exc: PeerUnreachable) -> None:
        # Closing fails what is still pending: that is no lost peer.
        if not self.closed:
            self._peer_lost(peer, exc)

    def _peer_lost(self, peer: RudpPeer, exc: PeerUnreachable) -> None:
        if peer is not self._peer:
            return
        reason = f"rudp: {exc.reason}"
        if exc.reason.startswith("0 messages"):
            reason = "rudp: the broker stopped answering keepalives"
        self._on_lost(reason)

    def attach(self, command: AttachMedia) -> None:
        """Point the broker's peer keyed by ``command.key`` at ``command.addr``
        (``fresh``: a new peer even for the same key)."""
        self.attach_peer(command.key, command.addr, fresh=command.fresh)

    def detach(self) -> None:
        self.stop_reader()
        if self._peer_key is not None:
            self.endpoint.remove_peer(self._peer_key)
        self._peer, self._peer_key = None, None

    async def rebind(self, host: str) -> None:
        """The endpoint to ``host`` (its port if free there). Raises OSError."""
        _, port = self.endpoint.local_addr
        try:
            await self.endpoint.rebind(host, port)
        except OSError:
            await self.endpoint.rebind(host, 0)

    def attach_peer(self, key: bytes, addr: Address, *, fresh: bool = False) -> None:
        """Point the broker's peer keyed by ``key`` at ``addr`` (``fresh``: a new peer
        even for the same key)."""
        if self._peer is None or self._peer_key != key or fresh:
            self.stop_reader()
            if self._peer_key is not None:
                self.endpoint.remove_peer(self._peer_key)
            peer = self.endpoint.peer(key, addr)
            self._peer, self._peer_key = peer, key
            peer.on_disconnected = lambda exc: self._peer_lost(peer, exc)
            peer.on_message = lambda data: self._on_message(peer, data)
            peer.on_restarted = lambda: self._restarted(peer)
        peer = self._peer
        peer.set_address(addr)
        if not peer.connected:
            peer.reset()

    def _restarted(self, peer: RudpPeer) -> None:
        if peer is self._peer and not self.closed:
            self._on_restarted()

    def stop_reader(self) -> None:
        """Read nothing more from the current peer (and drop what was read)."""
        if self._peer is not None:
            self._peer.on_message = None
        self._burst.clear()

    def _on_message(self, peer: RudpPeer, data: bytes) -> None:
        # Called by RUDP for each message as it reads a datagram: collected, and handed
        # over as one burst once the loop turn's reading is done.
        if peer is self._peer:
            self._burst.add(data)

    @property
    def srtt_ms(self) -> float | None:
        """RUDP's smoothed round-trip time to the broker, ms (None: not measured yet)."""
        peer = self._peer
        srtt = peer.connection.rto.srtt if peer is not None else None
        return None if srtt is None else srtt * 1000.0
