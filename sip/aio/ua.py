"""The asyncio SIP user agent: UAC and UAS over UDP, TCP and TLS, IPv4 and IPv6.

Glue around the sans-IO cores: datagrams go into
:class:`sip.transaction.TransactionLayer`; what the UAS answers is decided by
:class:`sip.ua.UasCore` (request checks, Allow, 501/405/481, OPTIONS, CANCEL, the
in-dialog guard, response building); dialogs are :class:`sip.dialog.Dialog`, 2xx
retransmission is :class:`sip.dialog.TwoXxRetransmitter`. This module owns the sockets
(:mod:`sip.aio.transport`), one ``loop.call_at`` timer, futures for pending requests,
the handler tasks, the registration refresh task and the ``move`` to a new local address.

Requests the core dispatches go to the ``handler`` coroutine, which returns a
:class:`Reply`; a 401/407 reply is sent once, statelessly. Malformed requests with
readable headers get 400 with a Warning, sent to the packet's source; anything else
unparseable is dropped and counted in :attr:`UserAgent.stats`.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import socket
import ssl
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

from sip.aio.transport import Address, StreamLimits, Transports
from sip.auth import DigestClient
from sip.dialog import Dialog, DialogId, DialogState, TwoXxRetransmitter
from sip.errors import (
    AuthError,
    DialogError,
    SipError,
    SipParseError,
    SipRequestFailed,
    TransactionError,
)
from sip.headers import Headers
from sip.message import Request, Response, make_response, parse_message, serialize
from sip.transaction import (
    RequestReceived,
    ResponseReceived,
    TransactionKey,
    TransactionLayer,
    TransactionTimedOut,
    make_branch,
)
from sip.ua import (
    Answer,
    Cancelled,
    Dispatch,
    Guard,
    Reply,
    UaConfig,
    UasCore,
    check_request,
    is_challenge,
    malformed_response,
    stateless_response,
    transport_of,
)
from sip.uri import NameAddr, SipUri, format_hostport, parse_uri


@dataclass(frozen=True, slots=True)
class IncomingRequest:
    """A request for the application, with the dialog it belongs to (if any)."""

    request: Request
    source: Address
    transport: str
    dialog: Dialog | None


# Dialog events, for applications and tools that print what happens.
@dataclass(frozen=True, slots=True)
class DialogStarted:
    dialog: Dialog


@dataclass(frozen=True, slots=True)
class DialogConfirmed:
    """The ACK for our 2xx arrived."""

    dialog: Dialog


@dataclass(frozen=True, slots=True)
class DialogRefreshed:
    """A re-INVITE was accepted (either direction): new target and/or SDP."""

    dialog: Dialog
    body: bytes


@dataclass(frozen=True, slots=True)
class DialogEnded:
    dialog: Dialog
    reason: str


DialogEvent = DialogStarted | DialogConfirmed | DialogRefreshed | DialogEnded
Handler = Callable[[IncomingRequest], Awaitable[Reply]]


class Authenticator(Protocol):
    """Answers a 401/407 challenge: returns the request to retry, or None to give up."""

    def authorize(self, request: Request, challenge: Response) -> Request | None: ...


class DigestAuthenticator:
    """:class:`Authenticator` backed by :class:`sip.auth.DigestClient` (§22.2).

    The retry is a copy of the request with CSeq + 1 and our credentials; a challenge
    we cannot answer, or one that refuses the credentials we sent, gives up (None).
    """

    def __init__(self, client: DigestClient) -> None:
        self.client = client

    def authorize(self, request: Request, challenge: Response) -> Request | None:
        try:
            name, value = self.client.respond(challenge, request)
        except AuthError:
            return None
        headers = request.headers.copy()
        headers.remove(name)
        headers.add(name, value)
        headers.set("CSeq", f"{request.cseq.seq + 1} {request.method}")
        return Request(method=request.method, uri=request.uri, headers=headers, body=request.body)


@dataclass(slots=True)
class UaStats:
    """Counters for what the UA dropped or refused."""

    malformed: int = 0
    answered_400: int = 0
    stray: int = 0
    over_cap: int = 0
    received: dict[str, int] = field(default_factory=dict)  # messages per transport


@dataclass(slots=True)
class _Registration:
    registrar: Address
    transport: str
    expires: int
    call_id: str
    cseq: int = 0
    refresh: asyncio.Task[None] | None = None
    granted: int = 0


@dataclass(slots=True)
class _Pending:
    future: asyncio.Future[Response]
    transport: str
    provisional: list[Response] = field(default_factory=list)


async def _reject_all(req: IncomingRequest) -> Reply:
    return Reply(488)


class UserAgent:
    """One SIP user agent bound to one local address (UDP + TCP)."""

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
        self.handler = handler
        self.authenticator = authenticator
        self.random = random
        self.layer = TransactionLayer(config.timers)
        self.transports = Transports(
            self._on_datagram,
            self._on_parsed,
            on_malformed=self._answer_malformed,
            limits=StreamLimits(
                max_connections=config.max_tcp_connections,
                idle_timeout=config.tcp_idle_timeout,
                max_body=config.max_stream_body,
            ),
            tls_server=_server_context(config),
            tls_client=_client_context(config),
        )
        self.core = UasCore(config, guard)
        self._busy: dict[str, int] = {}  # requests from a source host the handler still has
        self.dialogs: dict[DialogId, Dialog] = self.core.dialogs
        self.events: asyncio.Queue[DialogEvent] = asyncio.Queue()
        self.stats = UaStats()
        self._pending: dict[TransactionKey, _Pending] = {}
        self._retransmitters: dict[DialogId, TwoXxRetransmitter] = {}
        self._acks: dict[DialogId, tuple[bytes, Address, str]] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._registration: _Registration | None = None
        self._closed = False
        # Client transactions in flight over TCP, by destination: their retransmissions
        # and ACK go over TCP even if the connection closed (a count, not a set: a peer
        # once asked over TCP must get its later UDP requests over UDP, and a broker
        # meeting many devices must not keep every address it ever sent to).
        self._tcp_peers: Counter[Address] = Counter()
        self._flows: dict[DialogId, tuple[str, Address]] = {}
        uri = parse_uri(config.aor)
        if not isinstance(uri, SipUri) or uri.user is None:
            raise SipError(f"AOR must be sip:user@domain, not {config.aor!r}")
        self.aor_uri = uri
        if authenticator is None and config.password is not None:
            user = config.username or uri.user
            self.authenticator = DigestAuthenticator(DigestClient(user, config.password, random))

    # ------------------------------------------------------------ lifecycle

    async def start(self, host: str, port: int = 0) -> Address:
        """Bind the UDP (and TCP, and TLS) transports; returns the bound UDP/TCP address
        (the TLS one is :attr:`tls_addr`)."""
        return await self._open(host, port)

    async def start_on(self, udp: socket.socket, tcp: socket.socket | None) -> Address:
        """Serve on sockets bound beforehand (see :meth:`Transports.open_sockets`)."""
        return await self.transports.open_sockets(udp, tcp)

    async def _open(self, host: str, port: int) -> Address:
        return await self.transports.open(
            host, port, tcp=self.config.tcp, tls_port=self.config.tls_port
        )

    @property
    def tls_addr(self) -> Address | None:
        """The bound TLS (host, port), or None without TLS."""
        return self.transports.tls_local

    @property
    def local_addr(self) -> Address:
        """The bound (host, port)."""
        return self.transports.local

    @property
    def contact_uri(self) -> str:
        """Our Contact URI at the current local address."""
        host, port = self.local_addr
        return f"sip:{self.aor_uri.user}@{format_hostport(host, port)}"

    async def close(self) -> None:
        """Stop timers and tasks and close sockets (no BYE, no unREGISTER: see shutdown)."""
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
        reg = self._registration
        if reg is not None and reg.refresh is not None:
            reg.refresh.cancel()
        for task in list(self._tasks):
            task.cancel()
        for pending in self._pending.values():
            if not pending.future.done():
                pending.future.cancel()
        await self.transports.close()

    async def shutdown(self) -> None:
        """Clean shutdown: BYE every dialog, unREGISTER, close."""
        for dialog in list(self.dialogs.values()):
            if dialog.state is DialogState.CONFIRMED:
                with contextlib.suppress(SipError, asyncio.TimeoutError):
                    await asyncio.wait_for(self.bye(dialog), 5)
        if self._registration is not None:
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
        """Move to a new local address without losing dialogs.

        Closes the old sockets, binds the new ones, REGISTERs the new contact (if
        registered) and re-INVITEs every dialog with a new Contact and the body from
        ``reinvite_body``. With ``unregister_old`` it then removes the old contact
        (``;expires=0``, §10.2.2: the registrar keeps one contact per device, not one
        per address it ever had); last, so that it does not delay the session's restore.
        Raises :class:`SipRequestFailed` if a step is refused.
        """
        reg = self._registration
        old_contact = self.contact_header(reg.transport) if reg is not None else None
        await self.transports.close()
        bound = await self._open(host, port)
        if reg is not None:
            await self.register(reg.registrar, reg.expires, transport=reg.transport)
        if reinvite_body is not None:
            for dialog in list(self.dialogs.values()):
                if dialog.state is DialogState.CONFIRMED:
                    await self.reinvite(dialog, reinvite_body(dialog))
        if (
            unregister_old
            and reg is not None
            and old_contact is not None
            and old_contact != self.contact_header(reg.transport)
        ):
            await self.register(
                reg.registrar, reg.expires, transport=reg.transport, remove=old_contact
            )
        return bound

    # ------------------------------------------------------------ building requests

    def _local_for(self, transport: str) -> Address:
        tls = self.transports.tls_local
        return tls if transport == "tls" and tls is not None else self.local_addr

    def _via(self, transport: str) -> str:
        host, port = self._local_for(transport)
        branch = make_branch(self.random)
        return f"SIP/2.0/{transport.upper()} {format_hostport(host, port)};branch={branch};rport"

    def new_tag(self) -> str:
        """A fresh From/To tag (§19.3)."""
        return self.random(8).hex()

    def new_call_id(self) -> str:
        """A fresh Call-ID (§8.1.1.4)."""
        return f"{self.random(12).hex()}@{self.local_addr[0]}"

    def contact_header(self, transport: str = "udp") -> str:
        """The Contact header value for our current address, naming the transport that
        requests to us must use (§8.1.1.8; ``sips:`` at the TLS port for TLS, §26.2)."""
        if transport == "tls":
            host, port = self._local_for("tls")
            return f"<sips:{self.aor_uri.user}@{format_hostport(host, port)}>"
        suffix = ";transport=tcp" if transport == "tcp" else ""
        return f"<{self.contact_uri}{suffix}>"

    def build_request(
        self,
        method: str,
        uri: str,
        *,
        to: str,
        call_id: str | None = None,
        cseq: int = 1,
        from_tag: str | None = None,
        body: bytes = b"",
        content_type: str = "application/sdp",
        extra: list[tuple[str, str]] | None = None,
        transport: str = "udp",
    ) -> Request:
        """A request outside any dialog (§8.1.1)."""
        headers = Headers()
        headers.add("Via", self._via(transport))
        headers.add("Max-Forwards", "70")
        display = f'"{self.config.display_name}" ' if self.config.display_name else ""
        headers.add("From", f"{display}<{self.config.aor}>;tag={from_tag or self.new_tag()}")
        headers.add("To", to)
        headers.add("Call-ID", call_id or self.new_call_id())
        headers.add("CSeq", f"{cseq} {method}")
        if method in ("INVITE", "REGISTER", "SUBSCRIBE", "UPDATE"):
            headers.add("Contact", self.contact_header(transport))
        headers.add("User-Agent", self.config.user_agent)
        for name, value in extra or []:
            headers.add(name, value)
        if body:
            headers.add("Content-Type", content_type)
        return Request(method=method, uri=uri, headers=headers, body=body)

    def _pick_transport(self, request: Request, wanted: str) -> str:
        if (
            wanted == "udp"
            and self.config.tcp
            and len(serialize(request)) > self.config.tcp_threshold
        ):
            return "tcp"  # §18.1.1: large requests go over a congestion-controlled transport
        return wanted

    # ------------------------------------------------------------ sending requests

    async def request(self, request: Request, dest: Address, transport: str = "udp") -> Response:
        """Send a request in a client transaction; return its final response.

        Retries once with credentials on 401/407 when an authenticator is set. A
        transaction timeout comes back as a 408 response (§8.1.3.1).
        """
        return (await self.exchange(request, dest, transport))[1]

    async def exchange(
        self, request: Request, dest: Address, transport: str = "udp"
    ) -> tuple[Request, Response]:
        """Like :meth:`request`, also returning the request that got the final answer
        (the authenticated retry, when there was a challenge)."""
        response = await self._send_once(request, dest, transport)
        if response.status in (401, 407) and self.authenticator is not None:
            retry = self.authenticator.authorize(request, response)
            if retry is not None:
                retry.headers.remove_first("Via")
                retry.headers.prepend("Via", self._via(transport))
                request = retry
                response = await self._send_once(retry, dest, transport)
        return request, response

    async def _send_once(self, request: Request, dest: Address, transport: str) -> Response:
        transport = self._pick_transport(request, transport)
        if transport != request.top_via.transport.lower():
            request.headers.remove_first("Via")
            request.headers.prepend("Via", self._via(transport))
        loop = asyncio.get_running_loop()
        now = loop.time()
        if transport == "tcp":
            self._tcp_peers[dest] += 1
        try:
            txn = self.layer.send_request(request, dest, now, reliable=transport != "udp")
            future: asyncio.Future[Response] = loop.create_future()
            self._pending[txn.key] = _Pending(future, transport)
            self._pump(transport)
            try:
                return await future
            finally:
                self._pending.pop(txn.key, None)
        finally:
            # A reliable transaction sends nothing after its final response (no timer
            # A, K or D): the count can drop as soon as it has one.
            if transport == "tcp":
                self._tcp_peers[dest] -= 1
                if self._tcp_peers[dest] <= 0:
                    del self._tcp_peers[dest]

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
        reg = self._registration
        if reg is None or reg.registrar != registrar:
            reg = _Registration(registrar, transport, expires, self.new_call_id())
        reg.expires, reg.transport = expires, transport
        reg.cseq += 1
        domain = self.aor_uri.host
        request = self.build_request(
            "REGISTER",
            f"sip:{domain}",
            to=f"<{self.config.aor}>",
            call_id=reg.call_id,
            cseq=reg.cseq,
            extra=[("Expires", str(expires))]
            + ([("Contact", f"{remove};expires=0")] if remove and expires else []),
            transport=transport,
        )
        response = await self.request(request, registrar, transport)
        # The authenticated retry used one more CSeq number.
        reg.cseq = max(reg.cseq, response.cseq.seq)
        if response.status >= 300:
            raise SipRequestFailed(response.status, response.reason)
        if reg.refresh is not None and reg.refresh is not asyncio.current_task():
            reg.refresh.cancel()
            reg.refresh = None
        if expires == 0:
            self._registration = None
            return response
        granted = self._granted_expires(response, expires)
        reg.granted = granted
        self._registration = reg
        # Refresh ahead of expiry: at half the interval, at most a minute early.
        delay = max(1.0, granted - min(60.0, granted / 2))
        reg.refresh = asyncio.get_running_loop().create_task(self._refresh_later(delay))
        return response

    def _granted_expires(self, response: Response, asked: int) -> int:
        for value in response.headers.get_all("Contact"):
            try:
                contact = NameAddr.parse(value)
            except SipParseError:
                continue
            if isinstance(contact.uri, SipUri) and str(contact.uri).split(";")[0] == (
                self.contact_uri
            ):
                with contextlib.suppress(SipParseError):
                    if contact.expires is not None:
                        return contact.expires
        header = response.headers.get("Expires")
        return int(header) if header is not None and header.isdigit() else asked

    async def _refresh_later(self, delay: float) -> None:
        await asyncio.sleep(delay)
        reg = self._registration
        if reg is not None and not self._closed:
            with contextlib.suppress(SipError):
                await self.register(reg.registrar, reg.expires, transport=reg.transport)

    async def unregister(self) -> Response:
        """Remove our binding (``Expires: 0``)."""
        reg = self._registration
        if reg is None:
            raise SipError("not registered")
        return await self.register(reg.registrar, 0, transport=reg.transport)

    @property
    def registered_for(self) -> int:
        """Seconds the registrar granted (0 when not registered)."""
        return self._registration.granted if self._registration is not None else 0

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
        request = self.build_request(
            "INVITE", target, to=f"<{target}>", body=body, extra=extra, transport=transport
        )
        sent, response = await self.exchange(request, dest, transport)
        if response.status >= 300:
            raise SipRequestFailed(response.status, response.reason)
        try:
            dialog = Dialog.from_uac(sent, response)
        except DialogError as exc:
            raise SipRequestFailed(502, f"bad 2xx: {exc.reason}") from None
        self.dialogs[dialog.id] = dialog
        self._send_ack(dialog, response, transport)
        self.events.put_nowait(DialogStarted(dialog))
        return dialog, response

    @staticmethod
    def _dialog_dest(dialog: Dialog) -> Address:
        """The first route's address, else the remote target's (§12.2.1.1, §8.1.2)."""
        uri = dialog.next_hop()
        default = 5061 if transport_of(uri) == "tls" else 5060
        return (uri.host.strip("[]"), uri.port or default)

    def _flow(self, dialog: Dialog) -> tuple[str, Address] | None:
        """The open connection the peer reached us over, for a dialog without a route
        set (with one, the first route is a proxy we can connect to)."""
        flow = self._flows.get(dialog.id)
        if flow is None or dialog.route_set:
            return None
        return flow if self.transports.stream_to(flow[1]) == flow[0] else None

    @staticmethod
    def dialog_transport(dialog: Dialog) -> str:
        """The transport of the dialog's next hop (its first route, else the remote
        target): ``transport=tcp`` means TCP, ``sips:`` or ``transport=tls`` TLS."""
        try:
            return transport_of(dialog.next_hop())
        except DialogError:
            return "udp"

    def _send_ack(self, dialog: Dialog, response: Response, transport: str) -> None:
        # §13.2.2.4: the ACK for a 2xx is built by the UAC core, not the transaction,
        # with the INVITE's CSeq number and a new branch.
        ack = dialog.create_request("ACK", via=self._via(transport), cseq=response.cseq.seq)
        flow = self._flow(dialog)
        target = flow[1] if flow is not None else self._dialog_dest(dialog)
        wire = serialize(ack)
        self._acks[dialog.id] = (wire, target, transport)
        self.transports.send_soon(wire, target, transport)

    async def in_dialog(
        self,
        dialog: Dialog,
        method: str,
        body: bytes = b"",
        *,
        transport: str | None = None,
        extra: list[tuple[str, str]] | None = None,
    ) -> Response:
        """Send a request within ``dialog`` to its remote target or first route, over
        the transport that URI names (:meth:`dialog_transport`) unless ``transport``."""
        flow = self._flow(dialog) if transport is None else None
        transport = transport or (flow[0] if flow else self.dialog_transport(dialog))
        request = dialog.create_request(
            method,
            via=self._via(transport),
            contact=self.contact_header(transport),
            body=body,
            extra=[("User-Agent", self.config.user_agent), *(extra or [])],
        )
        try:
            dest = flow[1] if flow else self._dialog_dest(dialog)
        except DialogError as exc:
            raise SipRequestFailed(exc.status, exc.reason) from None
        try:
            sent, response = await self.exchange(request, dest, transport)
        finally:
            if method == "INVITE":
                dialog.invite_out = False
        # An authenticated retry used the next CSeq number: the dialog's count follows.
        dialog.local_seq = max(dialog.local_seq, sent.cseq.seq)
        dialog.receive_response(sent, response)
        if method == "INVITE" and 200 <= response.status < 300:
            self._send_ack(dialog, response, transport)
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
        self._forget(dialog, "bye sent")
        return response

    def _forget(self, dialog: Dialog, reason: str) -> None:
        self.dialogs.pop(dialog.id, None)
        self._retransmitters.pop(dialog.id, None)
        self._acks.pop(dialog.id, None)
        self._flows.pop(dialog.id, None)
        self.events.put_nowait(DialogEnded(dialog, reason))

    # ------------------------------------------------------------ input

    def _on_datagram(self, data: bytes, source: Address, transport: str) -> None:
        if data.strip(b"\r\n") == b"":
            return  # keep-alive (RFC 5626 CRLF)
        try:
            msg = parse_message(data)
        except SipParseError as exc:
            self.stats.malformed += 1
            self._answer_malformed(exc, source, transport)
            return
        self._on_parsed(msg, source, transport)

    def _answer_malformed(self, exc: SipParseError, source: Address, transport: str) -> None:
        # §8.2 / §21.4.1: a request we can build a response for gets 400 saying why. It
        # goes to the packet's source, never to its Via (issue 12: no reflection).
        response = malformed_response(exc, self.new_tag())
        if response is None:
            return
        self.stats.answered_400 += 1
        self.transports.send_soon(serialize(response), source, transport)

    def _on_parsed(self, msg: object, source: Address, transport: str) -> None:
        if not isinstance(msg, Request | Response):
            return
        self.stats.received[transport] = self.stats.received.get(transport, 0) + 1
        now = asyncio.get_running_loop().time()
        if isinstance(msg, Request) and msg.method != "ACK":
            problem = check_request(msg, transport)
            if problem is not None:
                if problem[0] == 400:
                    self.stats.answered_400 += 1
                self._reply_stateless(msg, problem, source, transport)
                return
            if self._busy.get(
                source[0], 0
            ) >= self.config.max_open_per_source and not self.layer.is_retransmission(msg):
                # Issue 12: a cap on what one source can make us hold.
                self.stats.over_cap += 1
                self._reply_stateless(msg, (503, "too many open requests"), source, transport)
                return
        self.layer.receive(msg, source, now, reliable=transport != "udp")
        self._pump(transport)

    def _reply_stateless(
        self, msg: Request, problem: tuple[int, str], source: Address, transport: str
    ) -> None:
        status, why = problem
        response = stateless_response(msg, status, why, self.new_tag())
        if response is None:
            self.stats.malformed += 1
            return
        if status == 503:
            response.headers.add("Retry-After", "5")
        self.transports.send_soon(serialize(response), source, transport)

    def _pump(self, transport: str = "udp") -> None:
        """Move the core's outputs to the wire and its events to their owners."""
        for data, dest in self.layer.datagrams_to_send():
            self.transports.send_soon(data, dest, self._transport_for(dest, transport))
        while (event := self.layer.next_event()) is not None:
            if isinstance(event, ResponseReceived):
                self._on_response(event)
            elif isinstance(event, RequestReceived):
                self._on_request(event, transport)
            elif isinstance(event, TransactionTimedOut):
                pending = self._pending.get(event.key)  # ours: a client transaction's
                if pending is not None and not pending.future.done() and event.request is not None:
                    pending.future.set_result(make_response(event.request, 408))
        self._arm()

    def _transport_for(self, dest: Address, default: str) -> str:
        # A peer we talk to over a stream (a connection exists or we chose TCP for it)
        # gets the transaction's retransmissions and responses over that stream too.
        stream = self.transports.stream_to(dest)
        if stream is not None:
            return stream
        if dest in self._tcp_peers:
            return "tcp"
        return default

    def _arm(self) -> None:
        if self._closed:
            return
        deadlines = [t for r in self._retransmitters.values() if (t := r.get_timer()) is not None]
        if (t := self.layer.get_timer()) is not None:
            deadlines.append(t)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if deadlines:
            self._timer = asyncio.get_running_loop().call_at(min(deadlines), self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        now = asyncio.get_running_loop().time()
        self.layer.handle_timer(now)
        for retransmitter in list(self._retransmitters.values()):
            retransmitter.handle_timer(now)
        self._pump()

    def _on_response(self, event: ResponseReceived) -> None:
        response = event.response
        if event.key is not None and event.key in self._pending:
            pending = self._pending[event.key]
            if response.status < 200:
                pending.provisional.append(response)
            elif not pending.future.done():
                pending.future.set_result(response)
                return
        if response.cseq.method == "INVITE" and 200 <= response.status < 300:
            # A retransmitted 2xx (§13.2.2.4): the ACK is sent again by the core.
            to_tag = NameAddr.parse(response.headers.get("To") or "").tag or ""
            from_tag = NameAddr.parse(response.headers.get("From") or "").tag or ""
            ack = self._acks.get((response.call_id, from_tag, to_tag))
            if ack is not None:
                self.transports.send_soon(*ack)
            return
        if event.key is None:
            self.stats.stray += 1

    def _find_dialog(self, msg: Request) -> Dialog | None:
        return self.core.find_dialog(msg)

    def _on_request(self, event: RequestReceived, transport: str) -> None:
        msg = event.request
        if msg.method == "ACK":
            dialog = self._find_dialog(msg)
            if dialog is not None:
                retransmitter = self._retransmitters.pop(dialog.id, None)
                if retransmitter is not None:
                    retransmitter.ack_received()
                    self.events.put_nowait(DialogConfirmed(dialog))
            return
        invite_exists = False
        if msg.method == "CANCEL":
            branch, sent_by, _ = event.key or ("", "", "")
            invite_exists = (branch, sent_by, "INVITE") in self.layer.servers
        try:
            decision = self.core.decide(msg, invite_exists)
        except SipParseError as exc:
            self._respond(msg, Reply(400, reason=f"Bad Request ({exc.reason})"[:120]))
            return
        if isinstance(decision, Answer):
            if is_challenge(decision.reply):
                self._challenge(msg, decision.reply, event.source, transport)
                return
            self._respond(msg, decision.reply, decision.dialog)
            if decision.end is not None and decision.dialog is not None:
                self._forget(decision.dialog, decision.end)
            return
        if isinstance(decision, Cancelled):
            # §9.2: 200 for the CANCEL, then 487 for the INVITE it cancels.
            self._respond(msg, Reply(200))
            self._respond(decision.invite, Reply(487), decision.dialog)
            if decision.dialog is not None:
                decision.dialog.answered_invite()
            return
        task = asyncio.get_running_loop().create_task(
            self._serve(msg, decision, event.source, transport)
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve(
        self, msg: Request, dispatch: Dispatch, source: Address, transport: str
    ) -> None:
        host = source[0]
        self._busy[host] = self._busy.get(host, 0) + 1
        try:
            reply: Reply | None = await self.handler(
                IncomingRequest(msg, source, transport, dispatch.dialog)
            )
        except Exception as exc:
            reply = Reply(500, reason=f"Server Internal Error ({type(exc).__name__})")
        finally:
            left = self._busy.pop(host, 1) - 1
            if left > 0:
                self._busy[host] = left
        assert reply is not None
        reply = self.core.after_handler(msg, reply, dispatch)
        if reply is None:
            return  # a CANCEL answered it already
        if is_challenge(reply):
            self._challenge(msg, reply, source, transport)
            return
        if msg.method != "INVITE":
            self._respond(msg, reply, dispatch.dialog)
            return
        self._answer_invite(msg, reply, dispatch.dialog, source, transport)

    def _challenge(self, msg: Request, reply: Reply, source: Address, transport: str) -> None:
        response = self.core.build_response(msg, reply, tag=self.new_tag())
        dest = source if transport != "udp" else response.top_via.response_address()
        if transport == "udp" and response.top_via.rport is not None:
            dest = source
        with contextlib.suppress(TransactionError):
            self.layer.respond_statelessly(response, dest)
        self._pump(transport)

    def _answer_invite(
        self,
        msg: Request,
        reply: Reply,
        dialog: Dialog | None,
        source: Address,
        transport: str,
    ) -> None:
        if reply.status >= 300 or reply.status < 200:
            self._respond(msg, reply, dialog)
            return
        new = dialog is None
        if dialog is None:
            try:
                dialog = Dialog.from_uas(msg, self.new_tag())
            except DialogError as exc:
                self._respond(msg, Reply(exc.status, reason=f"Bad Request ({exc.reason})"))
                return
            self.dialogs[dialog.id] = dialog
        response = self._respond(msg, reply, dialog, contact=True)
        if response is None:
            return
        if transport != "udp":
            # The peer's connection is the dialog's flow: our in-dialog requests go back
            # over it (a device behind NAT or without a listener cannot be reached at its
            # Contact's port; RFC 5626 §5.3 / RFC 3261 §18.2.2 reuse).
            self._flows[dialog.id] = (transport, source)
        else:
            self._flows.pop(dialog.id, None)
        now = asyncio.get_running_loop().time()
        # §13.3.1.4: the UAS core re-sends the 2xx until the ACK (UDP only).
        if transport == "udp":
            dest = response.top_via.response_address()
            if response.top_via.rport is not None:
                dest = source
            dlg = dialog

            def give_up() -> None:
                self._retransmitters.pop(dlg.id, None)
                task = asyncio.get_running_loop().create_task(self._bye_quietly(dlg))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)

            self._retransmitters[dialog.id] = TwoXxRetransmitter(
                wire=serialize(response),
                start=now,
                config=self.config.timers,
                on_resend=lambda wire: self.transports.send_soon(wire, dest, "udp"),
                on_give_up=give_up,
            )
            self._arm()
        self.events.put_nowait(DialogStarted(dialog) if new else DialogRefreshed(dialog, msg.body))

    async def _bye_quietly(self, dialog: Dialog) -> None:
        # §13.3.1.4: no ACK within 64*T1 -> the UAS ends the dialog with BYE.
        with contextlib.suppress(SipError, OSError):
            await self.bye(dialog)

    def _respond(
        self, msg: Request, reply: Reply, dialog: Dialog | None = None, *, contact: bool = False
    ) -> Response | None:
        tag = dialog.local_tag if dialog is not None else self.new_tag()
        try:
            via_transport = msg.top_via.transport.lower()
        except SipParseError:
            return None
        response = self.core.build_response(
            msg, reply, tag=tag, contact=self.contact_header(via_transport)
        )
        try:
            self.layer.send_response(response, asyncio.get_running_loop().time())
        except TransactionError:
            return None
        self._pump()
        return response


def _server_context(config: UaConfig) -> ssl.SSLContext | None:
    """The TLS server context from ``tls_cert``/``tls_key`` (None: no TLS listener)."""
    if config.tls_cert is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(config.tls_cert, config.tls_key)
    return context


def _client_context(config: UaConfig) -> ssl.SSLContext:
    """The TLS client context: verifies the peer's certificate and name (§26.2.1)."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=config.tls_ca)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


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
