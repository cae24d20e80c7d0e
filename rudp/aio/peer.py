"""One peer of a :class:`~rudp.aio.RudpEndpoint` on the event loop: its connection's
timer, its writes, futures for its waiters and an inbox (``rudp.endpoint.PeerCore``
decides what the connection's events do)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING

from rudp.endpoint import PeerCore
from rudp.errors import PeerUnreachable
from rudp.path import Address

if TYPE_CHECKING:
    from rudp.aio import RudpEndpoint


class RudpPeer(PeerCore[asyncio.Future[None]]):
    """One peer of an endpoint (``PeerCore``). Messages go to :meth:`receive` unless
    :attr:`on_message` is set. A broker holds one peer per session: no instance
    ``__dict__``, no inbox queue before :meth:`receive` is first used, no timer handle
    (the endpoint's one timer serves its peers)."""

    __slots__ = ("_endpoint", "_inbox")

    def __init__(self, endpoint: RudpEndpoint, key: bytes, addr: Address, sender_id: int) -> None:
        super().__init__(key, addr, endpoint.config, endpoint.protection, sender_id)
        self._endpoint = endpoint  # its loop and socket are every peer's: no slot each
        self._inbox: asyncio.Queue[bytes] | None = None

    async def send(self, message: bytes) -> None:
        """Send one message; return when the peer acknowledged all of it. Raises
        PeerUnreachable when the retries ran out (for it or one queued before it) or the
        peer is DISCONNECTED; MessageTooLarge."""
        await self.send_nowait(message)

    def send_nowait(self, message: bytes) -> asyncio.Future[None]:
        """Queue ``message`` now; the future :meth:`send` awaits (no task per message).
        Raises PeerUnreachable (closed, DISCONNECTED) and MessageTooLarge at once."""
        message_id = self._queue(message)
        future: asyncio.Future[None] = self._endpoint._loop.create_future()
        self._waiting().add(message_id, future)
        return future

    def send_many_nowait(self, messages: Sequence[bytes]) -> asyncio.Future[None]:
        """:meth:`send_nowait` for several messages in order, with one future for all:
        done once every one is acknowledged, PeerUnreachable as soon as one failed. Raises
        PeerUnreachable and MessageTooLarge before any is queued; ValueError for none."""
        # Queued without a waiter if the sequence space runs out midway, as write()'s are.
        queued = self._queue_many(messages)
        future: asyncio.Future[None] = self._endpoint._loop.create_future()
        self._waiting().add_batch(queued, future)
        return future

    async def drain(self) -> None:
        """Return once every message :meth:`write` queued so far is acknowledged. Raises
        PeerUnreachable when one of them failed or on close."""
        if not self._drain_waits():
            return
        future: asyncio.Future[None] = self._endpoint._loop.create_future()
        self._waiting().add_drain(self._written, future)
        await future

    async def receive(self) -> bytes:
        """The next message, in order."""
        if self._inbox is None:
            self._inbox = asyncio.Queue()
        return await self._inbox.get()

    def _now(self) -> float:
        return self._endpoint._loop.time()

    def _deliver(self, data: bytes) -> None:
        if self._inbox is None:
            self._inbox = asyncio.Queue()
        self._inbox.put_nowait(data)

    def _complete(
        self, futures: Sequence[asyncio.Future[None]], error: PeerUnreachable | None
    ) -> None:
        for future in futures:
            if future.done():
                continue
            if error is None:
                future.set_result(None)
            else:
                future.set_exception(error)

    def _flush_later(self) -> None:
        if not self._flush_soon:
            self._flush_soon = True
            self._endpoint._flush_later(self)

    def _transmit(self, datagrams: list[bytes], addr: Address) -> None:
        self._endpoint._socket.send_many(datagrams, addr)

    def _arm(self, when: float) -> None:
        self._endpoint._arm_peer(self, when)
