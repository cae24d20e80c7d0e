"""The user agent's client half, sans-IO: the requests a UAC sends and what it does with
their answers (RFC 3261 §8.1, §9.1, §10.2, §13.2, §22.2).

:class:`UacCore` builds requests at the current local address (Via with a fresh branch
and ``rport``, tags, Call-ID, Contact), picks their transport (§18.1.1), retries once
with credentials after a 401/407 (a new Via branch: the retry is a new transaction,
§8.1.3.5), keeps the registration (its Call-ID, CSeq, refresh time and removal, §10.2)
and turns INVITE answers into dialogs and ACKs (§13.2.2.4), including the ACK sent again
for a retransmitted 2xx. Its decisions are dataclasses (:class:`Registered`,
:class:`Unregistered`, :class:`DialogCreated`, :class:`Refused`, :class:`~sip.ua.Send`);
``sip/aio/ua.py`` sends them and runs the timers. No sockets, no clock: time comes in
as ``now``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from sip.auth import DigestClient
from sip.dialog import Dialog, DialogId
from sip.errors import AuthError, DialogError, SipError, SipParseError
from sip.headers import Headers
from sip.message import Request, Response, serialize
from sip.transaction import Address, make_branch
from sip.ua import DialogTable, Send, UaConfig, transport_of
from sip.uri import NameAddr, SipUri, format_hostport, parse_uri

# The header that pads a request without credentials (UaConfig.pad_to).
PADDING = "Padding"


class Authenticator(Protocol):
    """Answers a 401/407 challenge: returns the request to retry, or None to give up;
    and gives the credentials a new request carries before any challenge, if any."""

    def authorize(self, request: Request, challenge: Response) -> Request | None: ...

    def preemptive(self, method: str, uri: str) -> tuple[str, str] | None: ...

    def refused(self, challenge: Response) -> None: ...


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

    def preemptive(self, method: str, uri: str) -> tuple[str, str] | None:
        """(header, value) from the last challenge (sip.auth.DigestClient.preemptive)."""
        return self.client.preemptive(method, uri)

    def refused(self, challenge: Response) -> None:
        """The retry got ``challenge``: see sip.auth.DigestClient.refused."""
        self.client.refused(challenge)


@dataclass(slots=True)
class Registration:
    """Our binding at one registrar: the Call-ID and CSeq its REGISTERs share (§10.2.4),
    what we asked for, what it granted and when to refresh it."""

    registrar: Address
    transport: str
    expires: int
    call_id: str
    cseq: int = 0
    granted: int = 0
    refresh_at: float | None = None


@dataclass(frozen=True, slots=True)
class Registered:
    """The registrar took our contact for ``granted`` s: REGISTER again at ``refresh_at``."""

    registration: Registration
    granted: int
    refresh_at: float


@dataclass(frozen=True, slots=True)
class Unregistered:
    """Our binding is removed (``Expires: 0`` accepted): no refresh any more."""


@dataclass(frozen=True, slots=True)
class Refused:
    """A final non-2xx (or a 2xx that cannot make a dialog): the request failed."""

    status: int
    reason: str


@dataclass(frozen=True, slots=True)
class DialogCreated:
    """A 2xx to our INVITE: the dialog (held in the table) and its ACK to send."""

    dialog: Dialog
    ack: Send


RegisterResult = Registered | Unregistered | Refused
InviteResult = DialogCreated | Refused


def refresh_delay(granted: int) -> float:
    """Seconds after a successful REGISTER to refresh it: at half the interval, at most a
    minute ahead of expiry, never sooner than a second."""
    return max(1.0, granted - min(60.0, granted / 2))


def granted_expires(response: Response, asked: int, contact_uri: str) -> int:
    """The interval the registrar granted our contact (§10.2.4): our Contact's
    ``expires`` in the 2xx, else its Expires header, else what we asked for."""
    for value in response.headers.get_all("Contact"):
        try:
            contact = NameAddr.parse(value)
        except SipParseError:
            continue
        if isinstance(contact.uri, SipUri) and str(contact.uri).split(";")[0] == contact_uri:
            with contextlib.suppress(SipParseError):
                if contact.expires is not None:
                    return contact.expires
    header = response.headers.get("Expires")
    return int(header) if header is not None and header.isdigit() else asked


def dialog_dest(dialog: Dialog) -> Address:
    """The first route's address, else the remote target's (§12.2.1.1, §8.1.2)."""
    uri = dialog.next_hop()
    default = 5061 if transport_of(uri) == "tls" else 5060
    return (uri.host.strip("[]"), uri.port or default)


def dialog_transport(dialog: Dialog) -> str:
    """The transport of the dialog's next hop (its first route, else the remote target):
    ``transport=tcp`` means TCP, ``sips:`` or ``transport=tls`` TLS."""
    try:
        return transport_of(dialog.next_hop())
    except DialogError:
        return "udp"


def build_cancel(invite: Request) -> Request:
    """The CANCEL for a pending INVITE (§9.1): its Request-URI, Call-ID, To, From and
    Route, the CSeq number with method CANCEL, and its top Via only, so that it matches
    the INVITE's transaction at the next hop."""
    headers = Headers()
    headers.add("Via", invite.headers.get("Via") or "")
    headers.add("Max-Forwards", "70")
    for name in ("From", "To", "Call-ID"):
        headers.add(name, invite.headers.get(name) or "")
    headers.add("CSeq", f"{invite.cseq.seq} CANCEL")
    for value in invite.headers.get_raw("Route"):
        headers.add("Route", value)
    return Request(method="CANCEL", uri=invite.uri, headers=headers)


class UacCore:
    """The UAC decisions of one user agent (see the module docstring).

    ``local`` and ``tls_local`` are where the UA is bound (the glue sets them on every
    bind and move); ``dialogs`` is the table shared with :class:`sip.ua.UasCore`.
    """

    def __init__(
        self,
        config: UaConfig,
        dialogs: DialogTable,
        random: Callable[[int], bytes],
        authenticator: Authenticator | None = None,
    ) -> None:
        uri = parse_uri(config.aor)
        if not isinstance(uri, SipUri) or uri.user is None:
            raise SipError(f"AOR must be sip:user@domain, not {config.aor!r}")
        self.aor_uri = uri
        self.user: str = uri.user
        self.config = config
        self.dialogs = dialogs
        self.random = random
        if authenticator is None and config.password is not None:
            client = DigestClient(config.username or uri.user, config.password, random)
            authenticator = DigestAuthenticator(client)
        self.authenticator = authenticator
        self.local: Address = ("", 0)
        self.tls_local: Address | None = None
        self.registration: Registration | None = None

    # ------------------------------------------------------------ building requests

    def local_for(self, transport: str) -> Address:
        """Our address for ``transport`` (the TLS listener's for TLS)."""
        tls = self.tls_local
        return tls if transport == "tls" and tls is not None else self.local

    def via(self, transport: str) -> str:
        """A top Via for a new client transaction: fresh branch, ``rport`` (RFC 3581)."""
        host, port = self.local_for(transport)
        branch = make_branch(self.random)
        return f"SIP/2.0/{transport.upper()} {format_hostport(host, port)};branch={branch};rport"

    def new_tag(self) -> str:
        """A fresh From/To tag (§19.3)."""
        return self.random(8).hex()

    def new_call_id(self) -> str:
        """A fresh Call-ID (§8.1.1.4)."""
        return f"{self.random(12).hex()}@{self.local[0]}"

    @property
    def contact_uri(self) -> str:
        """Our Contact URI at the current local address."""
        return f"sip:{self.user}@{format_hostport(*self.local)}"

    def contact_header(self, transport: str = "udp") -> str:
        """The Contact value for our current address, naming the transport that requests
        to us must use (§8.1.1.8; ``sips:`` at the TLS port for TLS, §26.2)."""
        if transport == "tls":
            host, port = self.local_for("tls")
            return f"<sips:{self.user}@{format_hostport(host, port)}>"
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
        headers.add("Via", self.via(transport))
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
        return self._finished(Request(method=method, uri=uri, headers=headers, body=body))

    def _finished(self, request: Request) -> Request:
        """A new ``request`` with the credentials of the last challenge, sent ahead (a
        registrar and a broker of one realm challenge every REGISTER and INVITE: this
        saves that round trip), and padded to ``pad_to`` bytes (sip.ua.UaConfig says why):
        over UDP only, where a server bounds its unauthenticated answers by the request's
        size, and credentials sent ahead may still draw a challenge."""
        if request.method in ("ACK", "CANCEL"):
            return request  # neither is challenged (§22.1)
        if self.authenticator is not None:
            ahead = self.authenticator.preemptive(request.method, request.uri)
            if ahead is not None:
                request.headers.add(*ahead)
        if request.top_via.transport.lower() != "udp":
            return request
        short = self.config.pad_to - len(serialize(request)) - len(PADDING + ": \r\n")
        if short > 0:
            request.headers.add(PADDING, "x" * short)
        return request

    def in_dialog_request(
        self,
        dialog: Dialog,
        method: str,
        transport: str,
        body: bytes = b"",
        extra: list[tuple[str, str]] | None = None,
    ) -> Request:
        """A request within ``dialog`` (§12.2.1.1), with our Contact for ``transport``."""
        return self._finished(
            dialog.create_request(
                method,
                via=self.via(transport),
                contact=self.contact_header(transport),
                body=body,
                extra=[("User-Agent", self.config.user_agent), *(extra or [])],
            )
        )

    def transport_for(self, request: Request, wanted: str) -> str:
        """The transport ``request`` goes over: TCP instead of UDP when it is larger than
        ``tcp_threshold`` (§18.1.1), with its Via rewritten to name it."""
        transport = wanted
        if (
            wanted == "udp"
            and self.config.tcp
            and len(serialize(request)) > self.config.tcp_threshold
        ):
            transport = "tcp"
        if transport != request.top_via.transport.lower():
            request.headers.remove_first("Via")
            request.headers.prepend("Via", self.via(transport))
        return transport

    def retry(self, request: Request, response: Response, transport: str) -> Request | None:
        """The request to send after a 401/407 (§22.2): credentials, CSeq + 1 and a new
        Via branch; None for any other answer, without an authenticator, or when the
        authenticator gives up."""
        if response.status not in (401, 407) or self.authenticator is None:
            return None
        retry = self.authenticator.authorize(request, response)
        if retry is not None:
            while retry.headers.remove_first(PADDING):
                pass  # credentials make it larger than any challenge already
            retry.headers.remove_first("Via")
            retry.headers.prepend("Via", self.via(transport))
        return retry

    def retry_answered(self, response: Response) -> None:
        """The final answer to the retry :meth:`retry` made: a challenge again means our
        credentials were refused, and none go ahead until the next challenge."""
        if response.status in (401, 407) and self.authenticator is not None:
            self.authenticator.refused(response)

    # ------------------------------------------------------------ registration

    def register_request(
        self, registrar: Address, expires: int, transport: str, remove: str | None = None
    ) -> tuple[Registration, Request]:
        """The next REGISTER to ``registrar`` (§10.2): the binding's Call-ID (a new one for
        a new registrar) and next CSeq, ``Expires`` (0 removes our contact), and
        ``remove`` (another contact of ours) removed in the same request."""
        reg = self.registration
        if reg is None or reg.registrar != registrar:
            reg = Registration(registrar, transport, expires, self.new_call_id())
        reg.expires, reg.transport = expires, transport
        reg.cseq += 1
        extra = [("Expires", str(expires))]
        if remove and expires:
            extra.append(("Contact", f"{remove};expires=0"))
        request = self.build_request(
            "REGISTER",
            f"sip:{self.aor_uri.host}",
            to=f"<{self.config.aor}>",
            call_id=reg.call_id,
            cseq=reg.cseq,
            extra=extra,
            transport=transport,
        )
        return reg, request

    def register_answered(
        self, reg: Registration, response: Response, now: float
    ) -> RegisterResult:
        """What the final answer to ``reg``'s REGISTER does to our registration."""
        reg.cseq = max(reg.cseq, response.cseq.seq)  # an authenticated retry used one more
        if response.status >= 300:
            return Refused(response.status, response.reason)
        if reg.expires == 0:
            self.registration = None
            return Unregistered()
        reg.granted = granted_expires(response, reg.expires, self.contact_uri)
        reg.refresh_at = now + refresh_delay(reg.granted)
        self.registration = reg
        return Registered(reg, reg.granted, reg.refresh_at)

    # ------------------------------------------------------------ INVITE

    def invite_answered(self, sent: Request, response: Response, transport: str) -> InviteResult:
        """The final answer to our INVITE ``sent``: a 2xx makes the dialog (§12.1.2) and
        its ACK, to the dialog's next hop; anything else is :class:`Refused`."""
        if response.status >= 300:
            return Refused(response.status, response.reason)
        try:
            dialog = Dialog.from_uac(sent, response)
        except DialogError as exc:
            return Refused(502, f"bad 2xx: {exc.reason}")
        self.dialogs.add(dialog)
        return DialogCreated(dialog, self.ack(dialog, response, transport, dialog_dest(dialog)))

    def in_dialog_answered(self, dialog: Dialog, sent: Request, response: Response) -> bool:
        """The final answer to our request ``sent`` within ``dialog``: the dialog follows
        it (§12.2.1.2). True when it is a 2xx to a re-INVITE, which needs its
        :meth:`ack` (to the next hop the 2xx may just have changed)."""
        # An authenticated retry used the next CSeq number: the dialog's count follows.
        dialog.local_seq = max(dialog.local_seq, sent.cseq.seq)
        dialog.receive_response(sent, response)
        return sent.method == "INVITE" and 200 <= response.status < 300

    def ack(self, dialog: Dialog, response: Response, transport: str, dest: Address) -> Send:
        """The ACK for a 2xx to INVITE (§13.2.2.4): built by the UAC core, not the
        transaction, with the INVITE's CSeq number and a new branch; the dialog's record
        keeps it for the 2xx's retransmissions."""
        ack = dialog.create_request("ACK", via=self.via(transport), cseq=response.cseq.seq)
        send = Send(serialize(ack), dest, transport)
        self.dialogs.set_ack(dialog.id, send)
        return send

    def reack(self, response: Response) -> Send | None:
        """A 2xx to INVITE outside its transaction, i.e. retransmitted (§13.2.2.4): the
        ACK sent for it, to send again; None when its dialog is unknown or has no ACK."""
        try:
            dialog_id: DialogId = (
                response.call_id,
                NameAddr.parse(response.headers.get("From") or "").tag or "",
                NameAddr.parse(response.headers.get("To") or "").tag or "",
            )
        except SipParseError:
            return None
        record = self.dialogs.record(dialog_id)
        return record.ack if record is not None else None


__all__ = [
    "Authenticator",
    "DialogCreated",
    "DigestAuthenticator",
    "InviteResult",
    "Refused",
    "RegisterResult",
    "Registered",
    "Registration",
    "UacCore",
    "Unregistered",
    "build_cancel",
    "dialog_dest",
    "dialog_transport",
    "granted_expires",
    "refresh_delay",
]
