"""The agent's QUIC data channel to the broker: :class:`QuicMediaLink`, the
:class:`~mdeci.agent.media.DataLink` over one ``quicdata`` client connection.

Glue (it runs on the event loop). :meth:`QuicMediaLink.attach` opens a connection to the
QUIC address of the SDP answer, checking the broker certificate's fingerprint and
proving the session secret (docs/security.md "QUIC"); the same key, address and
fingerprint keep the connection (a re-INVITE after a move: the connection migrates in
:meth:`rebind`). Frames sent before the connection exists wait, in order. Messages read
in one loop turn go to ``on_burst`` together (one ``fsync`` for a burst, as over RUDP);
a connection that ends (QUIC's idle timeout, which is also how it ends a path whose
losses never recover, or a close by the broker) goes to ``on_lost`` with the reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from mdeci.agent.events import AttachMedia
from mdeci.agent.media import Bursts
from mdeci.tasks import spawn
from quicdata.aio import QuicDataClient, QuicDataPeer, connect
from quicdata.connection import DEFAULT_CONFIG, QuicDataClosed, QuicDataConfig

log = logging.getLogger("mdeci.agent")
Address = tuple[str, int]
_Target = tuple[bytes, Address, bytes]


class QuicMediaLink:
    """The broker's QUIC connection; nothing is reported once :attr:`closed`."""

    def __init__(
        self,
        host: str,
        on_burst: Callable[[list[bytes]], None],
        on_lost: Callable[[str], None],
        config: QuicDataConfig = DEFAULT_CONFIG,
    ) -> None:
        self.host = host  # where the connection's socket is bound
        self._on_lost = on_lost
        self.config = config
        self.closed = False
        self.client: QuicDataClient | None = None
        self._target: _Target | None = None
        self._opening: asyncio.Task[None] | None = None
        self._waiting: list[bytes] = []  # frames sent while the connection is opening
        self._burst = Bursts(on_burst, lambda: self.closed)

    @property
    def peer(self) -> QuicDataPeer | None:
        return None if self.client is None else self.client.peer

    def attach(self, command: AttachMedia) -> None:
        if command.fingerprint is None:
            self._lost_soon("quic: the answer has no certificate fingerprint")
            return
        target = (command.key, command.addr, command.fingerprint)
        peer = self.peer
        alive = peer is not None and peer.disconnected is None
        if target == self._target and not command.fresh and (alive or self._opening):
            return  # the same session: the connection goes on (it migrates in rebind)
        self.detach()
        self._target = target
        self._opening = spawn(self._open(target), log, "QUIC connection")

    async def _open(self, target: _Target) -> None:
        key, addr, fingerprint = target
        try:
            client = await connect(addr, key, fingerprint, local_host=self.host, config=self.config)
        except OSError as exc:
            if self._target is target:
                self._opening = None
                self._lost(f"quic: cannot bind: {exc}")
            return
        if self.closed or self._target is not target:
            client.close()
            return
        self._opening = None
        self.client = client
        peer = client.peer
        assert peer is not None
        peer.on_message = lambda data: self._on_message(peer, data)
        peer.on_disconnected = lambda reason: self._ended(peer, reason)
        waiting, self._waiting = self._waiting, []
        for data in waiting:
            self.send(data)

    def send(self, data: bytes) -> None:
        peer = self.peer
        if peer is None:
            if self._opening is not None:
                self._waiting.append(data)
            return
        # A closed connection's end is on its way as PeerDisconnected: reported there.
        with contextlib.suppress(QuicDataClosed):
            peer.send(data)

    def detach(self) -> None:
        self.stop_reader()
        self._target = None
        self._waiting = []
        if self._opening is not None:
            self._opening.cancel()
            self._opening = None
        client, self.client = self.client, None
        if client is not None:
            client.close()

    def stop_reader(self) -> None:
        peer = self.peer
        if peer is not None:
            peer.on_message = None
        self._burst.clear()

    async def rebind(self, host: str) -> None:
        """Migrate the connection to a socket on ``host`` (QUIC's client migration: the
        broker validates the new path). Raises OSError (the old socket stays)."""
        self.host = host
        if self.client is not None:
            await self.client.rebind(host)

    def close(self) -> None:
        self.closed = True
        self.detach()

    def _on_message(self, peer: QuicDataPeer, data: bytes) -> None:
        if peer is self.peer:
            self._burst.add(data)

    def _ended(self, peer: QuicDataPeer, reason: str) -> None:
        if peer is self.peer:
            self._lost(f"quic: {reason}")

    def _lost_soon(self, reason: str) -> None:
        # Not from inside the glue's loop over the core's commands: next iteration.
        asyncio.get_running_loop().call_soon(self._lost, reason)

    def _lost(self, reason: str) -> None:
        if not self.closed:
            self._on_lost(reason)
