"""The user agent's client requests as coroutines: a client transaction awaited as a
future, the registration's refresh task, and the in-dialog requests.

What each request is and what its answer does is :class:`sip.uac.UacCore`'s; this module
starts the transactions in the shared :class:`sip.transaction.TransactionLayer`, waits
for their final responses (which :class:`sip.aio.ua.UserAgent` delivers through
:meth:`Requests.resolve`) and sends the ACKs the core builds.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Callable

from sip.aio.transport import Address, Transports
from sip.dialog import Dialog
from sip.errors import DialogError, SipError, SipRequestFailed
from sip.events import DialogEnded, DialogEvent, DialogRefreshed, DialogStarted
from sip.message import Request, Response
from sip.transaction import TransactionKey, TransactionLayer
from sip.ua import Send
from sip.uac import Refused, Registered, UacCore, dialog_dest, dialog_transport


class Requests:
    """The client half of one :class:`~sip.aio.ua.UserAgent` (its public request methods
    are this object's). ``pump`` flushes the layer's output to the wire."""

    def __init__(
        self,
        uac: UacCore,
        layer: TransactionLayer,
        transports: Transports,
        events: asyncio.Queue[DialogEvent],
        pump: Callable[[str], None],
    ) -> None:
        self.uac, self.layer, self.transports = uac, layer, transports
        self.events, self.pump = events, pump
        self.pending: dict[TransactionKey, asyncio.Future[Response]] = {}
        self.refresh: asyncio.Task[None] | None = None
        self.closed = False
        # Client transactions in flight over TCP, by destination: their retransmissions
        # and ACK go over TCP even if the connection closed (a count, not a set: a peer
        # once asked over TCP gets its later UDP requests over UDP, and a broker meeting
        # many devices keeps no address it is done with).
        self.tcp_peers: Counter[Address] = Counter()

    def resolve(self, key: TransactionKey | None, response: Response) -> bool:
        """Hand a final response to the request waiting for it; False when none is."""
        future = self.pending.get(key) if key is not None else None
        if future is None or future.done() or response.status < 200:
            return False
        future.set_result(response)
        return True

    def close(self) -> None:
        self.closed = True
        for handle in (self.refresh, *self.pending.values()):
            if handle is not None:
                handle.cancel()

    async def request(self, request: Request, dest: Address, transport: str = "udp") -> Response:
        """Send a request in a client transaction; its final response (retried once with
        credentials on 401/407; a timeout comes back as 408, §8.1.3.1)."""
        return (await self.exchange(request, dest, transport))[1]

    async def exchange(
        self, request: Request, dest: Address, transport: str = "udp"
    ) -> tuple[Request, Response]:
        """Like :meth:`request`, also returning the request that got the final answer
        (the authenticated retry, when there was a challenge)."""
        response = await self._send_once(request, dest, transport)
        retry = self.uac.retry(request, response, transport)
        if retry is not None:
            request, response = retry, await self._send_once(retry, dest, transport)
            self.uac.retry_answered(response)
        return request, response

    async def _send_once(self, request: Request, dest: Address, transport: str) -> Response:
        transport = self.uac.transport_for(request, transport)
        loop = asyncio.get_running_loop()
        if transport == "tcp":
            self.tcp_peers[dest] += 1
        try:
            txn = self.layer.send_request(request, dest, loop.time(), reliable=transport != "udp")
            future: asyncio.Future[Response] = loop.create_future()
            self.pending[txn.key] = future
            self.pump(transport)
            try:
                return await future
            finally:
                self.pending.pop(txn.key, None)
        finally:
            # A reliable transaction sends nothing after its final response: the count
            # drops as soon as it has one.
            if transport == "tcp":
                self.tcp_peers[dest] -= 1
                if self.tcp_peers[dest] <= 0:
                    del self.tcp_peers[dest]

    async def register(
        self,
        registrar: Address,
        expires: int = 600,
        *,
        transport: str = "udp",
        remove: str | None = None,
    ) -> Response:
        """REGISTER our contact (§10.2) and keep it refreshed before it expires.

        ``expires=0`` removes it; ``remove`` (a Contact value, e.g. our address before a
        move) is removed in the same request. Raises :class:`SipRequestFailed` on a
        final non-2xx.
        """
        reg, request = self.uac.register_request(registrar, expires, transport, remove)
        response = await self.request(request, registrar, transport)
        loop = asyncio.get_running_loop()
        result = self.uac.register_answered(reg, response, loop.time())
        if isinstance(result, Refused):
            raise SipRequestFailed(result.status, result.reason)
        if self.refresh is not None and self.refresh is not asyncio.current_task():
            self.refresh.cancel()
        self.refresh = None
        if isinstance(result, Registered):
            self.refresh = loop.create_task(self._refresh_at(result.refresh_at))
        return response

    async def _refresh_at(self, when: float) -> None:
        await asyncio.sleep(when - asyncio.get_running_loop().time())
        reg = self.uac.registration
        if reg is not None and not self.closed:
            with contextlib.suppress(SipError):
                await self.register(reg.registrar, reg.expires, transport=reg.transport)

    async def unregister(self) -> Response:
        """Remove our binding (``Expires: 0``)."""
        reg = self.uac.registration
        if reg is None:
            raise SipError("not registered")
        return await self.register(reg.registrar, 0, transport=reg.transport)

    async def invite(
        self,
        target: str,
        dest: Address,
        body: bytes,
        *,
        transport: str = "udp",
        extra: list[tuple[str, str]] | None = None,
    ) -> tuple[Dialog, Response]:
        """INVITE ``target`` via ``dest``; on 2xx send the ACK and return the dialog.

        Raises :class:`SipRequestFailed` on a final non-2xx (408 on timeout).
        """
        request = self.uac.build_request(
            "INVITE", target, to=f"<{target}>", body=body, extra=extra, transport=transport
        )
        sent, response = await self.exchange(request, dest, transport)
        result = self.uac.invite_answered(sent, response, transport)
        if isinstance(result, Refused):
            raise SipRequestFailed(result.status, result.reason)
        self._send(result.ack)
        self.events.put_nowait(DialogStarted(result.dialog))
        return result.dialog, response

    def next_hop(self, dialog: Dialog, transport: str | None = None) -> tuple[str, Address]:
        """Where a request within ``dialog`` goes: unless ``transport`` is given, the
        connection the peer reached us over while it is open, for a dialog without a
        route set (with one, the first route is a proxy we can connect to); else the
        first route or remote target (§12.2.1.1) over the transport it names."""
        record = self.uac.dialogs.record(dialog.id)
        flow = record.flow if record is not None and not dialog.route_set else None
        if transport is None and flow and self.transports.stream_to(flow[1]) == flow[0]:
            return flow
        try:
            return (transport or dialog_transport(dialog), dialog_dest(dialog))
        except DialogError as exc:
            raise SipRequestFailed(exc.status, exc.reason) from None

    async def in_dialog(
        self,
        dialog: Dialog,
        method: str,
        body: bytes = b"",
        *,
        transport: str | None = None,
        extra: list[tuple[str, str]] | None = None,
    ) -> Response:
        """Send a request within ``dialog`` to its :meth:`next_hop`."""
        transport, dest = self.next_hop(dialog, transport)
        request = self.uac.in_dialog_request(dialog, method, transport, body, extra)
        try:
            sent, response = await self.exchange(request, dest, transport)
        finally:
            if method == "INVITE":
                dialog.invite_out = False
        if self.uac.in_dialog_answered(dialog, sent, response):
            self._send(self.uac.ack(dialog, response, transport, self.next_hop(dialog)[1]))
        return response

    async def reinvite(
        self, dialog: Dialog, body: bytes, *, transport: str | None = None
    ) -> Response:
        """Re-INVITE (target refresh with a new Contact and body, §14.1).

        Raises :class:`SipRequestFailed` on a final non-2xx (491 on glare).
        """
        response = await self.in_dialog(dialog, "INVITE", body, transport=transport)
        if response.status >= 300:
            raise SipRequestFailed(response.status, response.reason)
        self.events.put_nowait(DialogRefreshed(dialog, response.body))
        return response

    async def bye(self, dialog: Dialog, *, transport: str | None = None) -> Response:
        """End the dialog with BYE (§15.1)."""
        response = await self.in_dialog(dialog, "BYE", transport=transport)
        dialog.terminate()
        self.forget(dialog, "bye sent")
        return response

    def forget(self, dialog: Dialog, reason: str) -> None:
        """Drop the dialog and what is kept beside it; tell the application why."""
        self.uac.dialogs.pop(dialog.id, None)
        self.events.put_nowait(DialogEnded(dialog, reason))

    def _send(self, send: Send) -> None:
        self.transports.send_soon(send.wire, send.dest, send.transport)


__all__ = ["Requests"]
