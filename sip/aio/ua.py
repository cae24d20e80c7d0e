"""The asyncio SIP user agent: UAC and UAS over UDP and TCP, IPv4 and IPv6.

Glue around the sans-IO cores (STYLE.md): datagrams go into
:class:`sip.transaction.TransactionLayer`, dialogs are :class:`sip.dialog.Dialog`,
2xx retransmission is :class:`sip.dialog.TwoXxRetransmitter`; this module owns the
sockets, one ``loop.call_at`` timer, futures for pending requests, the registration
refresh task and the ``move`` to a new local address.

Incoming requests that the UA does not handle itself (ACK, BYE, CANCEL, OPTIONS,
in-dialog checks) go to the ``handler`` coroutine, which returns a :class:`Reply`.
Malformed requests with a readable Via get 400 with a Warning; anything else
unparseable is dropped and counted in :attr:`UserAgent.stats`.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

from sip.aio.transport import Address, Transports
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
    TimerConfig,
    TransactionKey,
    TransactionLayer,
    TransactionTimedOut,
    make_branch,
)
from sip.uri import NameAddr, SipUri, format_hostport, parse_uri

ALLOW = "INVITE, ACK, CANCEL, BYE, OPTIONS, REGISTER, UPDATE, INFO, MESSAGE"
SUPPORTED_EXTENSIONS: frozenset[str] = frozenset()


@dataclass(frozen=True, kw_only=True, slots=True)
class UaConfig:
    """Settings of one user agent.

    ``aor``: our address-of-record (``sip:alice@example.org``); ``username`` and
    ``password``: digest credentials (username defaults to the AOR user);
    ``timers``: T1/T2/T4; ``tcp_threshold``: requests larger than this go over TCP
    (§18.1.1 says 1300 bytes); ``user_agent``: the User-Agent header.
    """

    aor: str
    username: str | None = None
    password: str | None = None
    display_name: str | None = None
    timers: TimerConfig = field(default_factory=TimerConfig)
    tcp_threshold: int = 1300
    user_agent: str = "mdeci-sip/0.1"
    tcp: bool = True


@dataclass(frozen=True, slots=True)
class Reply:
    """What a request handler answers: a status, optional body and extra headers."""

    status: int
    body: bytes = b""
    content_type: str = "application/sdp"
    headers: tuple[tuple[str, str], ...] = ()
    reason: str | None = None

    # What the UA writes itself from the request (and the body's length): never copied.
    _OWN_HEADERS = frozenset({"via", "from", "to", "call-id", "cseq", "content-length"})

    @classmethod
    def from_response(cls, response: Response) -> Reply:
        """The reply that re-sends a response a sans-IO core built (e.g. the registrar's):
        its status, reason and headers, less those the UA derives from the request."""
        headers = tuple((n, v) for n, v in response.headers if n.lower() not in cls._OWN_HEADERS)
        return cls(response.status, headers=headers, reason=response.reason)


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
    return Reply(405 if req.request.method != "INVITE" else 488)


class UserAgent:
    """One SIP user agent bound to one local address (UDP + TCP)."""

    def __init__(
        self,
        config: UaConfig,
        handler: Handler = _reject_all,
        *,
        authenticator: Authenticator | None = None,
        random: Callable[[int], bytes] = secrets.token_bytes,
    ) -> None:
        self.config = config
        self.handler = handler
        self.authenticator = authenticator
        self.random = random
        self.layer = TransactionLayer(config.timers)
        self.transports = Transports(self._on_datagram, self._on_parsed)
        self.dialogs: dict[DialogId, Dialog] = {}
        self.events: asyncio.Queue[DialogEvent] = asyncio.Queue()
        self.stats = UaStats()
        self._pending: dict[TransactionKey, _Pending] = {}
        self._retransmitters: dict[DialogId, TwoXxRetransmitter] = {}
        self._acks: dict[DialogId, tuple[bytes, Address, str]] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._registration: _Registration | None = None
        self._closed = False
        self._tcp_peers: set[Address] = set()
        uri = parse_uri(config.aor)
        if not isinstance(uri, SipUri) or uri.user is None:
            raise SipError(f"AOR must be sip:user@domain, not {config.aor!r}")
        self.aor_uri = uri
        if authenticator is None and config.password is not None:
            user = config.username or uri.user
            self.authenticator = DigestAuthenticator(DigestClient(user, config.password, random))

    # ------------------------------------------------------------ lifecycle

    async def start(self, host: str, port: int = 0) -> Address:
        """Bind the UDP (and TCP) transports; returns the bound address."""
        return await self.transports.open(host, port, tcp=self.config.tcp)

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
    ) -> Address:
        """Move to a new local address without losing dialogs.

        Closes the old sockets, binds the new ones, REGISTERs the new contact (if
        registered) and re-INVITEs every dialog with a new Contact and the body from
        ``reinvite_body``. Raises :class:`SipRequestFailed` if a step is refused.
        """
        await self.transports.close()
        bound = await self.transports.open(host, port, tcp=self.config.tcp)
        reg = self._registration
        if reg is not None:
            await self.register(reg.registrar, reg.expires, transport=reg.transport)
        if reinvite_body is not None:
            for dialog in list(self.dialogs.values()):
                if dialog.state is DialogState.CONFIRMED:
                    await self.reinvite(dialog, reinvite_body(dialog))
        return bound

    # ------------------------------------------------------------ building requests

    def _via(self, transport: str) -> str:
        host, port = self.local_addr
        branch = make_branch(self.random)
        return f"SIP/2.0/{transport.upper()} {format_hostport(host, port)};branch={branch};rport"

    def new_tag(self) -> str:
        """A fresh From/To tag (§19.3)."""
        return self.random(8).hex()

    def new_call_id(self) -> str:
        """A fresh Call-ID (§8.1.1.4)."""
        return f"{self.random(12).hex()}@{self.local_addr[0]}"

    def contact_header(self, transport: str = "udp") -> str:
        """The Contact header value for our current address."""
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
            self._tcp_peers.add(dest)
        txn = self.layer.send_request(request, dest, now, reliable=transport != "udp")
        future: asyncio.Future[Response] = loop.create_future()
        self._pending[txn.key] = _Pending(future, transport)
        self._pump(transport)
        try:
            return await future
        finally:
            self._pending.pop(txn.key, None)

    async def register(
        self, registrar: Address, expires: int = 600, *, transport: str = "udp"
    ) -> Response:
        """REGISTER our contact (§10.2) and keep it refreshed before it expires.

        ``expires=0`` removes it. Raises :class:`SipRequestFailed` on a final non-2xx.
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
            extra=[("Expires", str(expires))],
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
        return (uri.host.strip("[]"), uri.port or 5060)

    def _send_ack(self, dialog: Dialog, response: Response, transport: str) -> None:
        # §13.2.2.4: the ACK for a 2xx is built by the UAC core, not the transaction,
        # with the INVITE's CSeq number and a new branch.
        ack = dialog.create_request("ACK", via=self._via(transport), cseq=response.cseq.seq)
        target = self._dialog_dest(dialog)
        wire = serialize(ack)
        self._acks[dialog.id] = (wire, target, transport)
        self.transports.send_soon(wire, target, transport)

    async def in_dialog(
        self,
        dialog: Dialog,
        method: str,
        body: bytes = b"",
        *,
        transport: str = "udp",
        extra: list[tuple[str, str]] | None = None,
    ) -> Response:
        """Send a request within ``dialog`` to its remote target or first route."""
        request = dialog.create_request(
            method,
            via=self._via(transport),
            contact=self.contact_header(transport),
            body=body,
            extra=[("User-Agent", self.config.user_agent), *(extra or [])],
        )
        try:
            dest = self._dialog_dest(dialog)
        except DialogError as exc:
            raise SipRequestFailed(exc.status, exc.reason) from None
        try:
            response = await self.request(request, dest, transport)
        finally:
            if method == "INVITE":
                dialog.invite_out = False
        dialog.receive_response(request, response)
        if method == "INVITE" and 200 <= response.status < 300:
            self._send_ack(dialog, response, transport)
        return response

    async def reinvite(self, dialog: Dialog, body: bytes, *, transport: str = "udp") -> Response:
        """Re-INVITE (target refresh with a new Contact and body, §14.1).

        Raises :class:`SipRequestFailed` on a final non-2xx (491 on glare).
        """
        response = await self.in_dialog(dialog, "INVITE", body, transport=transport)
        if response.status >= 300:
            raise SipRequestFailed(response.status, response.reason)
        self.events.put_nowait(DialogRefreshed(dialog, response.body))
        return response

    async def bye(self, dialog: Dialog, *, transport: str = "udp") -> Response:
        """End the dialog with BYE (§15.1)."""
        response = await self.in_dialog(dialog, "BYE", transport=transport)
        dialog.terminate()
        self._forget(dialog, "bye sent")
        return response

    def _forget(self, dialog: Dialog, reason: str) -> None:
        self.dialogs.pop(dialog.id, None)
        self._retransmitters.pop(dialog.id, None)
        self._acks.pop(dialog.id, None)
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
        # §8.2 / §21.4.1: a request we can route a response for gets 400 saying why.
        partial = exc.message
        if not isinstance(partial, Request) or partial.method == "ACK":
            return
        try:
            partial.top_via  # noqa: B018  (raises when unreadable)
            response = make_response(partial, 400, f"Bad Request ({exc.reason})"[:120])
        except (SipParseError, ValueError):
            return
        with contextlib.suppress(ValueError):
            response.headers.add("Warning", f'399 mdeci "{exc}"'.replace("\r", " ")[:200])
        self.stats.answered_400 += 1
        with contextlib.suppress(SipParseError):
            dest = source if transport != "udp" else response.top_via.response_address()
            if transport == "udp" and response.top_via.rport is not None:
                dest = source
            self.transports.send_soon(serialize(response), dest, transport)

    def _on_parsed(self, msg: object, source: Address, transport: str) -> None:
        if not isinstance(msg, Request | Response):
            return
        now = asyncio.get_running_loop().time()
        if isinstance(msg, Request) and msg.method != "ACK":
            problem = self._check_request(msg)
            if problem is not None:
                self.stats.answered_400 += 1
                self._reply_stateless(msg, problem, source, transport)
                return
        self.layer.receive(msg, source, now, reliable=transport != "udp")
        self._pump(transport)

    def _check_request(self, msg: Request) -> tuple[int, str] | None:
        """Requests we refuse before creating a transaction."""
        try:
            msg.cseq  # noqa: B018
            msg.from_  # noqa: B018
            msg.to  # noqa: B018
            msg.top_via  # noqa: B018
        except SipParseError as exc:
            return (400, exc.reason)
        if msg.cseq.method != msg.method:
            return (400, "CSeq method does not match the request")
        return None

    def _reply_stateless(
        self, msg: Request, problem: tuple[int, str], source: Address, transport: str
    ) -> None:
        status, why = problem
        try:
            response = make_response(msg, status)
            response.headers.add("Warning", f'399 mdeci "{why}"'.replace('"', "'")[:200])
            self.transports.send_soon(serialize(response), source, transport)
        except (SipParseError, ValueError):
            self.stats.malformed += 1

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
                pending = self._pending.get(event.key)
                if pending is not None and not pending.future.done():
                    pending.future.set_result(make_response(event.request, 408))
        self._arm()

    def _transport_for(self, dest: Address, default: str) -> str:
        # A peer we talk to over TCP (a connection exists or we chose TCP for it) gets
        # the transaction's retransmissions and responses over TCP too.
        if dest in self.transports.tcp_conns or dest in self._tcp_peers:
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
        from_tag = msg.from_.tag or ""
        to_tag = msg.to.tag or ""
        return self.dialogs.get((msg.call_id, to_tag, from_tag))

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
        task = asyncio.get_running_loop().create_task(self._serve(event, transport))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve(self, event: RequestReceived, transport: str) -> None:
        msg = event.request
        try:
            await self._serve_request(msg, event.source, transport)
        except Exception as exc:
            self._respond(msg, Reply(500, reason=f"Server Internal Error ({type(exc).__name__})"))

    async def _serve_request(self, msg: Request, source: Address, transport: str) -> None:
        method = msg.method
        unsupported = [
            ext.strip()
            for value in msg.headers.get_all("Require")
            for ext in value.split(",")
            if ext.strip() and ext.strip() not in SUPPORTED_EXTENSIONS
        ]
        if unsupported:
            # §8.2.2.3: 420 listing what we do not support.
            self._respond(msg, Reply(420, headers=(("Unsupported", ", ".join(unsupported)),)))
            return
        if method == "CANCEL":
            # We answer INVITEs at once, so there is never anything left to cancel (§9.2).
            self._respond(msg, Reply(481))
            return
        to_tag = msg.to.tag
        dialog = self._find_dialog(msg) if to_tag else None
        if to_tag and dialog is None:
            self._respond(msg, Reply(481))  # §12.2.2: no such dialog
            return
        previous_target = dialog.remote_target if dialog is not None else None
        if dialog is not None:
            try:
                dialog.receive_request(msg)
            except DialogError as exc:
                extra = (("Retry-After", "1"),) if exc.status == 500 and method == "INVITE" else ()
                self._respond(msg, Reply(exc.status, headers=extra, reason=None), dialog)
                return
            if method == "BYE":
                self._respond(msg, Reply(200), dialog)
                self._forget(dialog, "bye received")
                return
        if method == "OPTIONS" and dialog is None:
            self._respond(msg, Reply(200, headers=(("Allow", ALLOW),)))
            return
        if (
            method == "INVITE"
            and msg.body
            and not ((msg.headers.get("Content-Type") or "").lower().startswith("application/sdp"))
        ):
            self._respond(msg, Reply(415, headers=(("Accept", "application/sdp"),)), dialog)
            if dialog is not None:
                dialog.answered_invite()
            return
        reply = await self.handler(IncomingRequest(msg, source, transport, dialog))
        if dialog is not None and previous_target is not None and reply.status >= 300:
            # A refused target refresh leaves the dialog where it was (§12.2.2 applies a
            # refresh only with the request that succeeds).
            dialog.remote_target = previous_target
        if method != "INVITE":
            self._respond(msg, reply, dialog)
            return
        self._answer_invite(msg, reply, dialog, source, transport)

    def _answer_invite(
        self,
        msg: Request,
        reply: Reply,
        dialog: Dialog | None,
        source: Address,
        transport: str,
    ) -> None:
        if dialog is not None:
            dialog.answered_invite()
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
        response = make_response(msg, reply.status, reply.reason, to_tag=tag)
        if contact or (msg.method in ("INVITE", "UPDATE") and 200 <= reply.status < 300):
            transport = msg.top_via.transport.lower()
            response.headers.add("Contact", self.contact_header(transport))
        if msg.method == "INVITE" and 100 < reply.status < 300:
            # §12.1.1: a dialog-creating response copies the request's Record-Route.
            for value in msg.headers.get_raw("Record-Route"):
                response.headers.add("Record-Route", value)
        if reply.status == 405:
            response.headers.add("Allow", ALLOW)
        for name, value in reply.headers:
            response.headers.add(name, value)
        response.headers.add("Server", self.config.user_agent)
        if reply.body:
            response.headers.add("Content-Type", reply.content_type)
            response.body = reply.body
        try:
            self.layer.send_response(response, asyncio.get_running_loop().time())
        except TransactionError:
            return None
        self._pump()
        return response
