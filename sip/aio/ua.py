"""The asyncio SIP user agent: UAC and UAS over UDP, TCP and TLS, IPv4 and IPv6.

Glue around the sans-IO cores: messages go into :class:`sip.transaction.TransactionLayer`;
:class:`sip.ua.UasCore` decides what the UAS answers and :class:`sip.uac.UacCore` what
the UAC sends and does with the answers, both over one :class:`sip.ua.DialogTable`. This
module owns the sockets (:mod:`sip.aio.transport`), one ``loop.call_at`` timer, the
handler tasks and the ``move`` to a new local address; the client requests, awaited as
futures, are :class:`sip.aio.uac.Requests`'. Requests the core dispatches go to the
``handler`` coroutine, which returns a :class:`Reply`.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import socket
from collections.abc import Callable

from sip.aio.transport import Address, StreamLimits, Transports, client_context, server_context
from sip.aio.uac import Requests
from sip.aio.uas import Handler, Server
from sip.dialog import Dialog, DialogState
from sip.errors import SipError, SipParseError
from sip.events import (
    DialogConfirmed,
    DialogEnded,
    DialogEvent,
    DialogRefreshed,
    DialogStarted,
    IncomingRequest,
)
from sip.message import Request, Response, make_response, parse_message, serialize
from sip.transaction import RequestReceived, ResponseReceived, TransactionLayer
from sip.transaction import TransactionTimedOut as TimedOut
from sip.ua import (
    Guard,
    Reply,
    UaConfig,
    UasCore,
    UaStats,
    amplifies,
)
from sip.uac import Authenticator, DigestAuthenticator, UacCore, dialog_transport


async def _reject_all(req: IncomingRequest) -> Reply:
    return Reply(488)


class UserAgent:
    """One SIP user agent bound to one local address (UDP + TCP, and TLS)."""

    dialog_transport = staticmethod(dialog_transport)

    def __init__(
        self,
        config: UaConfig,
        handler: Handler = _reject_all,
        *,
        authenticator: Authenticator | None = None,
        random: Callable[[int], bytes] = secrets.token_bytes,
        guard: Guard | None = None,
    ) -> None:
        self.config = config
        self.layer = TransactionLayer(config.timers, trying_delay=config.trying_delay)
        limits = StreamLimits(
            max_connections=config.max_tcp_connections,
            idle_timeout=config.tcp_idle_timeout,
            max_body=config.max_stream_body,
        )
        self.transports = Transports(
            self._on_datagram,
            self._on_parsed,
            on_malformed=self._answer_malformed,
            limits=limits,
            tls_server=server_context(config.tls_cert, config.tls_key),
            tls_client=client_context(config.tls_ca),
        )
        self.core = UasCore(config, guard)
        self.uac = UacCore(config, self.core.dialogs, random, authenticator)
        self.dialogs, self.stats = self.core.dialogs, self.core.stats
        self.aor_uri = self.uac.aor_uri
        self.events: asyncio.Queue[DialogEvent] = asyncio.Queue()
        self.client = c = Requests(self.uac, self.layer, self.transports, self.events, self._pump)
        self.server = Server(
            self.core, self.uac, c, self.layer, self.transports, handler, self._arm
        )
        # The public requests are the client half's and the UAC core's.
        self.request, self.exchange, self.register = c.request, c.exchange, c.register
        self.unregister, self.invite, self.in_dialog = c.unregister, c.invite, c.in_dialog
        self.reinvite, self.bye = c.reinvite, c.bye
        self.build_request, self.contact_header = self.uac.build_request, self.uac.contact_header
        self.new_tag, self.new_call_id, self._via = (
            self.uac.new_tag,
            self.uac.new_call_id,
            self.uac.via,
        )
        self._timer: asyncio.TimerHandle | None = None
        self._closed = False

    async def start(self, host: str, port: int = 0) -> Address:
        """Bind UDP (and TCP, and TLS); returns the UDP/TCP address (TLS: :attr:`tls_addr`)."""
        return await self._open(host, port)

    async def start_on(self, udp: socket.socket, tcp: socket.socket | None) -> Address:
        """Serve on sockets bound beforehand (see :meth:`Transports.open_sockets`)."""
        return self._bound(await self.transports.open_sockets(udp, tcp))

    async def _open(self, host: str, port: int) -> Address:
        tls_port, tcp = self.config.tls_port, self.config.tcp
        return self._bound(await self.transports.open(host, port, tcp=tcp, tls_port=tls_port))

    def _bound(self, local: Address) -> Address:
        self.uac.local, self.uac.tls_local = local, self.transports.tls_local
        return local

    @property
    def tls_addr(self) -> Address | None:
        return self.transports.tls_local

    @property
    def local_addr(self) -> Address:
        return self.transports.local

    @property
    def contact_uri(self) -> str:
        return self.uac.contact_uri

    @property
    def registered_for(self) -> int:
        """Seconds the registrar granted (0 when not registered)."""
        reg = self.uac.registration
        return reg.granted if reg is not None else 0

    async def close(self) -> None:
        """Stop timers and tasks and close sockets (no BYE, no unREGISTER: see shutdown)."""
        self._closed = True
        self.client.close()
        self.server.close()
        if self._timer is not None:
            self._timer.cancel()
        await self.transports.close()

    async def shutdown(self) -> None:
        """Clean shutdown: BYE every dialog, unREGISTER, close."""
        for dialog in list(self.dialogs.values()):
            if dialog.state is DialogState.CONFIRMED:
                with contextlib.suppress(SipError, asyncio.TimeoutError):
                    await asyncio.wait_for(self.bye(dialog), 5)
        if self.uac.registration is not None:
            with contextlib.suppress(SipError, asyncio.TimeoutError):
                await asyncio.wait_for(self.unregister(), 5)
        await self.close()

    async def move(
        self,
        host: str,
        port: int = 0,
        reinvite_body: Callable[[Dialog], bytes] | None = None,
        *,
        unregister_old: bool = False,
    ) -> Address:
        """Move to a new local address without losing dialogs: rebind, REGISTER the new
        contact, re-INVITE every dialog with a new Contact and the body from
        ``reinvite_body``; with ``unregister_old``, last (not to delay the session's
        restore), remove the old contact (§10.2.2: the registrar keeps one per device).
        Raises :class:`SipRequestFailed` if a step is refused."""
        reg = self.uac.registration
        old = self.contact_header(reg.transport) if reg is not None else None
        await self.transports.close()
        bound = await self._open(host, port)
        if reg is not None:
            await self.register(reg.registrar, reg.expires, transport=reg.transport)
        for dialog in list(self.dialogs.values()):
            if reinvite_body is not None and dialog.state is DialogState.CONFIRMED:
                await self.reinvite(dialog, reinvite_body(dialog))
        if unregister_old and reg is not None and old != self.contact_header(reg.transport):
            await self.register(reg.registrar, reg.expires, transport=reg.transport, remove=old)
        return bound

    # ------------------------------------------------------------ input and timers

    def _on_datagram(self, data: bytes, source: Address, transport: str) -> None:
        if data.strip(b"\r\n") == b"":
            return  # keep-alive (RFC 5626 CRLF)
        try:
            msg = parse_message(data)
        except SipParseError as exc:
            self.stats.malformed += 1
            if isinstance(exc.message, Request) and transport == "udp":
                exc.message.udp_size = self._bounded_size(data, source)
            self._answer_malformed(exc, source, transport)
            return
        if isinstance(msg, Request) and transport == "udp":
            msg.udp_size = self._bounded_size(data, source)
        self._on_parsed(msg, source, transport)

    def _bounded_size(self, data: bytes, source: Address) -> int:
        """The size that bounds unproven answers to ``data`` (0: none, for the sources
        :attr:`UaConfig.unbounded_sources` names)."""
        return 0 if source in self.config.unbounded_sources else len(data)

    def _answer_malformed(self, exc: SipParseError, source: Address, transport: str) -> None:
        response = self.core.malformed(exc, self.new_tag())
        if response is not None and isinstance(exc.message, Request):
            self._send_unproven(exc.message, response, source, transport)

    def _send_unproven(
        self, msg: Request, response: Response, source: Address, transport: str
    ) -> None:
        """Send a stateless refusal unless it is larger than ``max_answer_ratio`` allows."""
        wire = serialize(response)
        if amplifies(wire, msg, self.config.max_answer_ratio):
            self.stats.too_large += 1
            return
        self.transports.send_soon(wire, source, transport)

    def _on_parsed(self, msg: object, source: Address, transport: str) -> None:
        if not isinstance(msg, Request | Response):
            return
        self.stats.received[transport] = self.stats.received.get(transport, 0) + 1
        if isinstance(msg, Request) and msg.method != "ACK":
            refusal = self.core.screen(
                msg,
                transport,
                self.new_tag,
                busy=self.server.busy[source[0]],
                retransmission=self.layer.is_retransmission,
            )
            if refusal is not None:
                if refusal.response is not None:
                    self._send_unproven(msg, refusal.response, source, transport)
                return
        now = asyncio.get_running_loop().time()
        self.layer.receive(msg, source, now, reliable=transport != "udp")
        self._pump(transport)

    def _pump(self, transport: str = "udp") -> None:
        """Move the layer's outputs to the wire and its events to their owners."""
        for data, dest in self.layer.datagrams_to_send():
            # A peer we talk to over a stream gets the transaction's messages over it.
            stream = self.transports.stream_to(dest)
            to = stream or ("tcp" if dest in self.client.tcp_peers else transport)
            self.transports.send_soon(data, dest, to)
        while (event := self.layer.next_event()) is not None:
            if isinstance(event, ResponseReceived):
                self._on_response(event)
            elif isinstance(event, RequestReceived):
                self.server.on_request(event, transport)
            elif isinstance(event, TimedOut) and event.request is not None:
                self.client.resolve(event.key, make_response(event.request, 408))
        self._arm()

    def _arm(self) -> None:
        if self._closed:
            return
        timers = [r.get_timer() for r in self.dialogs.retransmitting()]
        deadlines = [t for t in (*timers, self.layer.get_timer()) if t is not None]
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if deadlines:
            self._timer = asyncio.get_running_loop().call_at(min(deadlines), self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        now = asyncio.get_running_loop().time()
        self.layer.handle_timer(now)
        for retransmitter in self.dialogs.retransmitting():
            retransmitter.handle_timer(now)
        self._pump()

    def _on_response(self, event: ResponseReceived) -> None:
        response = event.response
        if self.client.resolve(event.key, response):
            return
        if response.cseq.method == "INVITE" and 200 <= response.status < 300:
            if (ack := self.uac.reack(response)) is not None:  # a retransmitted 2xx
                self.transports.send_soon(ack.wire, ack.dest, ack.transport)
        elif event.key is None:
            self.stats.stray += 1


__all__ = [
    "Authenticator",
    "DialogConfirmed",
    "DialogEnded",
    "DialogEvent",
    "DialogRefreshed",
    "DialogStarted",
    "DigestAuthenticator",
    "Guard",
    "Handler",
    "IncomingRequest",
    "Reply",
    "UaConfig",
    "UaStats",
    "UserAgent",
]
