"""The user agent's protocol logic, sans-IO: what a UAS answers, before and after its
application handler, and how the answer is built.

:class:`UasCore` holds the dialogs and the INVITEs still waiting for the application,
and decides, for each request the transaction layer delivers, one of:

- :class:`Answer`: the UA core answers itself (OPTIONS, BYE, 400/416/420/481/405/501,
  CANCEL), optionally ending a dialog;
- :class:`Dispatch`: the request goes to the application handler; its :class:`Reply`
  comes back through :meth:`UasCore.after_handler`;
- :class:`Cancelled`: a CANCEL matched an INVITE still waiting for the application: the
  CANCEL gets 200 and the INVITE 487 (§9.2); the handler's late answer is discarded.

It also owns the dialog table (:class:`DialogTable`: one :class:`DialogRecord` per
dialog, with what the UA keeps beside the dialog) and screens requests before a
transaction exists (:meth:`UasCore.screen`). The client half is :mod:`sip.uac`.

No sockets, no clock, no asyncio (``tests/test_layering.py``): ``sip/aio/ua.py`` feeds it
and sends what it builds. The RFC answers it gives are listed in docs/sip.md.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, MutableMapping
from dataclasses import dataclass, field

from sip.dialog import Dialog, DialogId, TwoXxRetransmitter
from sip.errors import DialogError, SipParseError
from sip.message import Request, Response, make_response
from sip.transaction import Address, TimerConfig, TransactionKey, transaction_key
from sip.uri import NameAddr, SipUri

# Methods the UA core always handles itself (§8.2, §9.2, §11, §15, §17).
CORE_METHODS: frozenset[str] = frozenset({"ACK", "BYE", "CANCEL", "OPTIONS"})
# Methods we recognise (RFC 3261 and the common extensions): a known method we do not
# serve gets 405 with Allow (§8.2.1); anything else is unknown and gets 501 (§21.5.2).
KNOWN_METHODS: frozenset[str] = frozenset(
    {
        "ACK",
        "BYE",
        "CANCEL",
        "INFO",
        "INVITE",
        "MESSAGE",
        "NOTIFY",
        "OPTIONS",
        "PRACK",
        "PUBLISH",
        "REFER",
        "REGISTER",
        "SUBSCRIBE",
        "UPDATE",
    }
)
SUPPORTED_EXTENSIONS: frozenset[str] = frozenset()
_ALLOW_ORDER = ("INVITE", "ACK", "CANCEL", "BYE", "OPTIONS", "REGISTER")


@dataclass(frozen=True, kw_only=True, slots=True)
class UaConfig:
    """Settings of one user agent.

    ``aor``: our address-of-record (``sip:alice@example.org``); ``username`` and
    ``password``: digest credentials (username defaults to the AOR user);
    ``timers``: T1/T2/T4; ``tcp_threshold``: requests larger than this go over TCP
    (§18.1.1 says 1300 bytes); ``user_agent``: the User-Agent header; ``methods``: the
    methods the application handler serves besides the core's own (ACK, BYE, CANCEL,
    OPTIONS): ``Allow`` is derived from them; ``max_open_per_source``: requests from
    one source host the application may be answering at once (more get 503);
    ``max_tcp_connections``, ``tcp_idle_timeout`` (s), ``max_stream_body`` (bytes):
    bounds on accepted TCP/TLS connections; ``tls_cert`` / ``tls_key`` (PEM paths):
    listen for SIP over TLS on ``tls_port`` (0: any free port; 5061 by convention);
    ``tls_ca``: the CA file that outgoing TLS connections verify peers against (None:
    the system's). ``trying_delay``: seconds an INVITE waits for the application before
    its 100 Trying (None: at once); ``max_answer_ratio``: an answer over UDP that does
    not prove the request was accepted (a challenge, a refusal, OPTIONS's 200) is sent
    only if it is at most this times the request's datagram, else dropped and counted
    (None: no bound). Both keep a spoofed source from being sent more than it sent.
    ``unbounded_sources``: (host, port) sources exempt from that bound: the proxy in
    front of this UA, which relays its requests and probes it with OPTIONS smaller than
    the 200 (a source we talk to already, not a third party a spoofer could aim at).
    ``pad_to``: a new request we send over UDP (not ACK or CANCEL), with or without
    credentials sent ahead, is padded to this many bytes with a ``Padding`` header
    (unknown to SIP elements, hence ignored), so that such a server's challenge or
    refusal fits (0: no padding); the retry answering a challenge, and TCP and TLS, go
    without it.
    """

    aor: str
    username: str | None = None
    password: str | None = None
    display_name: str | None = None
    timers: TimerConfig = field(default_factory=TimerConfig)
    tcp_threshold: int = 1300
    user_agent: str = "mdeci-sip/0.1"
    tcp: bool = True
    methods: frozenset[str] = frozenset({"INVITE"})
    max_open_per_source: int = 64
    max_tcp_connections: int = 256
    tcp_idle_timeout: float = 300.0
    max_stream_body: int = 65536
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_ca: str | None = None
    tls_port: int = 0
    trying_delay: float | None = None
    max_answer_ratio: float | None = None
    unbounded_sources: frozenset[tuple[str, int]] = frozenset()
    pad_to: int = 1024

    @property
    def allow(self) -> str:
        """The ``Allow`` value: what this UA actually handles (§20.5)."""
        methods = CORE_METHODS | self.methods
        ordered = [m for m in _ALLOW_ORDER if m in methods]
        return ", ".join(ordered + sorted(methods - set(ordered)))


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
class Answer:
    """The core answers ``reply`` itself; ``end`` names why the dialog ends, if it does."""

    reply: Reply
    dialog: Dialog | None = None
    end: str | None = None


@dataclass(frozen=True, slots=True)
class Dispatch:
    """The request goes to the application handler."""

    dialog: Dialog | None
    previous_target: str | None


@dataclass(frozen=True, slots=True)
class Cancelled:
    """A CANCEL matched a pending INVITE: 200 to the CANCEL, 487 to ``invite``."""

    invite: Request
    dialog: Dialog | None


Decision = Answer | Dispatch | Cancelled
# Before a request changes a dialog: None lets it through, a Reply refuses it (e.g. a
# 401 challenge for an in-dialog request from an unexpected source). The third argument
# is the address the request came from (None when the caller does not know it).
Guard = Callable[[Request, Dialog, Address | None], Reply | None]


@dataclass(frozen=True, slots=True)
class Send:
    """Bytes for the wire outside any transaction (the ACK for a 2xx, §13.2.2.4)."""

    wire: bytes
    dest: Address
    transport: str


@dataclass(frozen=True, slots=True)
class Refusal:
    """A request refused before any transaction exists; ``response`` is None when its
    own headers cannot make one (it is dropped)."""

    response: Response | None


@dataclass(slots=True)
class UaStats:
    """Counters for what the UA dropped or refused."""

    malformed: int = 0
    answered_400: int = 0
    stray: int = 0
    over_cap: int = 0
    too_large: int = 0  # unproven answers dropped: larger than max_answer_ratio allows
    received: dict[str, int] = field(default_factory=dict)  # messages per transport


@dataclass(slots=True)
class DialogRecord:
    """One dialog and what the UA keeps beside it, dropped together when it ends.

    ``ack``: the ACK sent for the INVITE's 2xx, sent again for each retransmission of
    that 2xx (UAC, §13.2.2.4); ``retransmitter``: our 2xx re-sent until its ACK (UAS over
    UDP, §13.3.1.4; set through :meth:`DialogTable.retransmit`); ``flow``: the
    (transport, address) of the connection the peer reached us over, which our
    in-dialog requests reuse (RFC 5626 §5.3).
    """

    dialog: Dialog
    ack: Send | None = None
    retransmitter: TwoXxRetransmitter | None = None
    flow: tuple[str, Address] | None = None


class DialogTable(MutableMapping[DialogId, Dialog]):
    """The UA's dialogs by id, and what is kept beside each (:class:`DialogRecord`).

    As a mapping it holds dialogs (storing a dialog starts it with nothing beside it
    unless it is already the one stored). A dialog with nothing beside it (the usual one,
    once its 2xx is acknowledged) is held as it is, not in a record: a broker holds a
    dialog per session. :meth:`record` reads what is kept; it is written through
    :meth:`set_ack`, :meth:`set_flow` and :meth:`retransmit`.
    """

    def __init__(self) -> None:
        self._records: dict[DialogId, Dialog | DialogRecord] = {}
        # The records whose 2xx is being re-sent: the timer looks at these only, not at
        # every dialog of a broker holding thousands.
        self._retransmitting: set[DialogId] = set()

    def __getitem__(self, key: DialogId) -> Dialog:
        held = self._records[key]
        return held.dialog if isinstance(held, DialogRecord) else held

    def __setitem__(self, key: DialogId, dialog: Dialog) -> None:
        held = self._records.get(key)
        if held is not dialog and not (isinstance(held, DialogRecord) and held.dialog is dialog):
            self._records[key] = dialog
            self._retransmitting.discard(key)

    def __delitem__(self, key: DialogId) -> None:
        del self._records[key]
        self._retransmitting.discard(key)

    def __iter__(self) -> Iterator[DialogId]:
        return iter(self._records)

    def __len__(self) -> int:
        return len(self._records)

    def record(self, key: DialogId) -> DialogRecord | None:
        """What is kept beside dialog ``key``, if it is held (read only: a dialog held
        bare gives a record of its own with nothing set)."""
        held = self._records.get(key)
        return DialogRecord(held) if isinstance(held, Dialog) else held

    def add(self, dialog: Dialog) -> None:
        """Hold ``dialog``."""
        self[dialog.id] = dialog

    def records(self) -> list[DialogRecord]:
        return [r for r in map(self.record, self._records) if r is not None]

    def set_ack(self, key: DialogId, ack: Send | None) -> None:
        """Keep (None: forget) the ACK of dialog ``key``'s 2xx, if it is held."""
        if (record := self._kept(key)) is not None:
            record.ack = ack
            self._settle(key, record)

    def set_flow(self, key: DialogId, flow: tuple[str, Address] | None) -> None:
        """Keep (None: forget) the flow of dialog ``key``, if it is held."""
        if (record := self._kept(key)) is not None:
            record.flow = flow
            self._settle(key, record)

    def retransmit(self, key: DialogId, retransmitter: TwoXxRetransmitter | None) -> None:
        """Set (or with None, clear) the 2xx retransmitter of dialog ``key``'s record."""
        record = self._kept(key)
        if record is None:
            return
        record.retransmitter = retransmitter
        if retransmitter is None:
            self._retransmitting.discard(key)
            self._settle(key, record)
        else:
            self._retransmitting.add(key)

    def retransmitting(self) -> list[TwoXxRetransmitter]:
        """The 2xx retransmitters running now."""
        out = []
        for key in self._retransmitting:
            held = self._records[key]
            if isinstance(held, DialogRecord) and held.retransmitter is not None:
                out.append(held.retransmitter)
        return out

    def _kept(self, key: DialogId) -> DialogRecord | None:
        """Dialog ``key``'s record to write to (held from now on), if it is held."""
        held = self._records.get(key)
        if isinstance(held, Dialog):
            held = self._records[key] = DialogRecord(held)
        return held

    def _settle(self, key: DialogId, record: DialogRecord) -> None:
        """Hold the dialog bare again once nothing is kept beside it."""
        if record.ack is None and record.retransmitter is None and record.flow is None:
            self._records[key] = record.dialog


def answer_address(response: Response, source: Address, transport: str) -> Address:
    """Where a response outside a transaction goes (§18.2.2, RFC 3581): over a stream,
    or when the top Via asks for ``rport``, back to the packet's source; else to the
    Via's sent-by (``received``/``maddr``)."""
    if transport != "udp":
        return source
    via = response.top_via
    return source if via.rport is not None else via.response_address()


def warning(text: str, agent: str = "mdeci") -> tuple[str, str]:
    """A ``Warning: 399`` header naming ``text`` (quotes and line breaks removed)."""
    clean = text.replace('"', "'").replace("\r", " ").replace("\n", " ")[:180]
    return ("Warning", f'399 {agent} "{clean}"')


def transport_of(uri: SipUri) -> str:
    """The transport a request to ``uri`` uses (§18.1.1, §26.2): ``sips:`` or
    ``transport=tls`` -> tls, ``transport=tcp`` -> tcp, else udp."""
    wanted = (uri.params.get("transport") or "").lower()
    if uri.scheme == "sips" or wanted == "tls":
        return "tls"
    return "tcp" if wanted == "tcp" else "udp"


def check_request(msg: Request, transport: str) -> tuple[int, str] | None:
    """What makes us refuse a request before a transaction exists: (status, why) or None.

    400 for unreadable mandatory headers or a CSeq method that differs from the request;
    416 for a ``sips:`` Request-URI that did not arrive over TLS (§26.2.2: never a silent
    downgrade).
    """
    try:
        cseq = msg.cseq
        msg.from_  # noqa: B018
        msg.to  # noqa: B018
        msg.top_via  # noqa: B018
        uri = msg.parsed_uri
    except SipParseError as exc:
        return (400, exc.reason)
    if cseq.method != msg.method:
        return (400, "CSeq method does not match the request")
    if isinstance(uri, SipUri) and uri.scheme == "sips" and transport.lower() != "tls":
        return (416, "sips: Request-URI over a non-TLS transport")
    if not isinstance(uri, SipUri):
        return (416, f"unsupported URI scheme in {msg.uri[:40]!r}")
    return None


def stateless_response(msg: Request, status: int, why: str, tag: str) -> Response | None:
    """A response built without a transaction (a refused or malformed request): To gets
    ``tag`` (§8.2.6.2: every response but 100 carries one), Warning says why. None when
    the request's own headers cannot make a response."""
    try:
        msg.top_via  # noqa: B018  (raises when unreadable)
        response = make_response(msg, status, to_tag=tag)
        if status == 400:
            response.reason = f"Bad Request ({why})"[:120].replace("\r", " ").replace("\n", " ")
        response.headers.add(*warning(why))
    except (SipParseError, ValueError):
        return None
    return response


def malformed_response(exc: SipParseError, tag: str) -> Response | None:
    """400 (505 for an unsupported version) for a request that did not parse but whose
    headers were readable; None for anything else (responses, ACKs, unreadable Via):
    those are dropped."""
    partial = exc.message
    if not isinstance(partial, Request) or partial.method == "ACK":
        return None
    return stateless_response(partial, exc.status, exc.reason, tag)


def unsupported_extensions(msg: Request) -> list[str]:
    """The ``Require`` options we do not support (§8.2.2.3)."""
    return [
        ext.strip()
        for value in msg.headers.get_all("Require")
        for ext in value.split(",")
        if ext.strip() and ext.strip() not in SUPPORTED_EXTENSIONS
    ]


def invite_key(cancel: Request) -> TransactionKey:
    """The key of the INVITE server transaction a CANCEL names (§9.2: same branch and
    sent-by). Raises :class:`SipParseError` for an unreadable Via."""
    branch, sent_by, _ = transaction_key(cancel)
    return (branch, sent_by, "INVITE")


class UasCore:
    """The UAS decisions of one user agent (see the module docstring).

    ``dialogs`` is shared with :class:`sip.uac.UacCore` (which adds the dialogs it
    creates as UAC); ``guard`` checks in-dialog requests before they change state.
    """

    def __init__(
        self, config: UaConfig, guard: Guard | None = None, dialogs: DialogTable | None = None
    ) -> None:
        self.config = config
        self.guard = guard
        self.dialogs = dialogs if dialogs is not None else DialogTable()
        self.stats = UaStats()
        self._waiting: dict[TransactionKey, Request] = {}
        # While set, out-of-dialog INVITE and OPTIONS get this answer (a UAS out of
        # service answers 503, §21.5.4; OPTIONS is answered as an INVITE would be, §11.2).
        self.out_of_service: Reply | None = None

    def screen(
        self,
        msg: Request,
        transport: str,
        tag: Callable[[], str],
        *,
        busy: int = 0,
        retransmission: Callable[[Request], bool] = lambda _: False,
    ) -> Refusal | None:
        """Refuse a request (not ACK) before a transaction exists, or None to let it in:
        :func:`check_request`'s 400/416, and 503 when its source has ``busy`` requests
        with the application already (``max_open_per_source``; a retransmission of one
        of them still reaches its transaction). ``tag`` makes the response's To tag."""
        problem = check_request(msg, transport)
        if problem is None:
            if busy < self.config.max_open_per_source or retransmission(msg):
                return None
            self.stats.over_cap += 1
            problem = (503, "too many open requests")
        elif problem[0] == 400:
            self.stats.answered_400 += 1
        response = stateless_response(msg, problem[0], problem[1], tag())
        if response is None:
            self.stats.malformed += 1
        elif problem[0] == 503:
            response.headers.add("Retry-After", "5")
        return Refusal(response)

    def malformed(self, exc: SipParseError, tag: str) -> Response | None:
        """The 400 for a request that did not parse (:func:`malformed_response`); it goes
        to the packet's source, never to its Via, so that it cannot be reflected."""
        response = malformed_response(exc, tag)
        if response is not None:
            self.stats.answered_400 += 1
        return response

    def acked(self, msg: Request) -> Dialog | None:
        """An ACK (§13.3.1.4): when it is for the 2xx we are re-sending, the re-sending
        stops and the dialog it confirms is returned."""
        dialog = self.find_dialog(msg)
        record = self.dialogs.record(dialog.id) if dialog is not None else None
        if record is None or record.retransmitter is None:
            return None
        record.retransmitter.ack_received()
        self.dialogs.retransmit(record.dialog.id, None)
        return record.dialog

    def respond(
        self, msg: Request, reply: Reply, *, tag: str, contact: Callable[[str], str]
    ) -> Response | None:
        """The response for ``reply`` with To tag ``tag`` and ``contact(transport)`` for
        the transport of the request's Via; None when the Via is unreadable."""
        try:
            via_transport = msg.top_via.transport.lower()
        except SipParseError:
            return None
        return self.build_response(msg, reply, tag=tag, contact=contact(via_transport))

    def accepted(
        self, dialog: Dialog, response: Response, source: Address, transport: str
    ) -> Address | None:
        """Our 2xx to an INVITE went out from ``dialog``: over a stream the peer's
        connection becomes the dialog's flow (RFC 5626 §5.3); over UDP the 2xx is re-sent
        until the ACK (§13.3.1.4), to the address returned."""
        if dialog.id not in self.dialogs:
            return None
        self.dialogs.set_flow(dialog.id, (transport, source) if transport != "udp" else None)
        return answer_address(response, source, transport) if transport == "udp" else None

    def new_dialog(self, msg: Request, tag: str) -> Dialog | Reply:
        """The dialog a 2xx to an out-of-dialog INVITE creates, held in :attr:`dialogs`
        (§12.1.1), or the 400 when the INVITE cannot make one."""
        try:
            dialog = Dialog.from_uas(msg, tag)
        except DialogError as exc:
            return Reply(exc.status, reason=f"Bad Request ({exc.reason})")
        self.dialogs.add(dialog)
        return dialog

    def find_dialog(self, msg: Request) -> Dialog | None:
        """The dialog an in-dialog request belongs to (§12.2.2)."""
        return self.dialogs.get((msg.call_id, msg.to.tag or "", msg.from_.tag or ""))

    def decide(
        self, msg: Request, invite_exists: bool = False, source: Address | None = None
    ) -> Decision:
        """What to do with a new request (not ACK). ``invite_exists``: for a CANCEL,
        whether the transaction layer still has the matching INVITE server transaction;
        ``source``: where it came from (handed to the guard)."""
        method = msg.method
        if method == "CANCEL":
            return self._cancel(msg, invite_exists)
        if method not in KNOWN_METHODS:
            return Answer(Reply(501, headers=(("Allow", self.config.allow),)))
        unsupported = unsupported_extensions(msg)
        if unsupported:
            return Answer(Reply(420, headers=(("Unsupported", ", ".join(unsupported)),)))
        dialog: Dialog | None = None
        if msg.to.tag:
            dialog = self.find_dialog(msg)
            if dialog is None:
                return Answer(Reply(481))  # §12.2.2: no such dialog
        handled = CORE_METHODS | self.config.methods
        if method not in handled:
            return Answer(Reply(405, headers=(("Allow", self.config.allow),)), dialog)
        previous_target = dialog.remote_target if dialog is not None else None
        if dialog is not None:
            if self.guard is not None:
                refused = self.guard(msg, dialog, source)
                if refused is not None:
                    return Answer(refused, dialog)
            try:
                dialog.receive_request(msg)
            except DialogError as exc:
                extra = (("Retry-After", "1"),) if exc.status == 500 and method == "INVITE" else ()
                return Answer(Reply(exc.status, headers=extra), dialog)
            if method == "BYE":
                return Answer(Reply(200), dialog, end="bye received")
        elif self.out_of_service is not None and method in ("INVITE", "OPTIONS"):
            return Answer(self.out_of_service)
        if method == "OPTIONS":
            return Answer(self.options_reply(), dialog)
        if method == "BYE":
            return Answer(Reply(481))  # a BYE outside a dialog
        if (
            method == "INVITE"
            and msg.body
            and not (msg.headers.get("Content-Type") or "").lower().startswith("application/sdp")
        ):
            if dialog is not None:
                dialog.answered_invite()
                dialog.remote_target = previous_target or dialog.remote_target
            return Answer(Reply(415, headers=(("Accept", "application/sdp"),)), dialog)
        if method == "INVITE":
            self._waiting[transaction_key(msg)] = msg
        return Dispatch(dialog, previous_target)

    def options_reply(self) -> Reply:
        """200 to OPTIONS in or out of a dialog (§11.2): what we allow and accept."""
        supported = ", ".join(sorted(SUPPORTED_EXTENSIONS))
        headers = [("Allow", self.config.allow), ("Accept", "application/sdp")]
        return Reply(200, headers=(*headers, *([("Supported", supported)] if supported else [])))

    def _cancel(self, msg: Request, invite_exists: bool) -> Decision:
        try:
            key = invite_key(msg)
        except SipParseError:
            return Answer(Reply(400))
        invite = self._waiting.pop(key, None)
        if invite is not None:
            dialog = self.find_dialog(invite) if invite.to.tag else None
            return Cancelled(invite, dialog)
        # §9.2: a CANCEL matching a transaction already answered gets 200 and no effect;
        # one matching nothing gets 481.
        return Answer(Reply(200 if invite_exists else 481))

    def after_handler(self, msg: Request, reply: Reply, dispatch: Dispatch) -> Reply | None:
        """The application's answer: None when a CANCEL already answered the INVITE."""
        if msg.method == "INVITE":
            key = transaction_key(msg)
            if key not in self._waiting:
                return None
            del self._waiting[key]
        dialog = dispatch.dialog
        if dialog is not None and dispatch.previous_target is not None and reply.status >= 300:
            # A refused target refresh leaves the dialog where it was (§12.2.2 applies a
            # refresh only with the request that succeeds).
            dialog.remote_target = dispatch.previous_target
        if dialog is not None and msg.method == "INVITE":
            dialog.answered_invite()
        return reply

    @property
    def waiting(self) -> int:
        """INVITEs waiting for the application's answer."""
        return len(self._waiting)

    def build_response(
        self,
        msg: Request,
        reply: Reply,
        *,
        tag: str,
        contact: str | None = None,
    ) -> Response:
        """The response for ``reply`` (§8.2.6): To tag, Contact for dialog-creating and
        target-refresh 2xx, Record-Route copied (§12.1.1), Allow on 405/501, Server."""
        response = make_response(msg, reply.status, reply.reason, to_tag=tag)
        if contact is not None and (
            msg.method in ("INVITE", "UPDATE") and 200 <= reply.status < 300
        ):
            response.headers.add("Contact", contact)
        if msg.method == "INVITE" and 100 < reply.status < 300:
            for value in msg.headers.get_raw("Record-Route"):
                response.headers.add("Record-Route", value)
        names = {n.lower() for n, _ in reply.headers}
        if reply.status in (405, 501) and "allow" not in names:
            response.headers.add("Allow", self.config.allow)
        for name, value in reply.headers:
            response.headers.add(name, value)
        if not is_unproven(msg, reply.status):  # lean refusals: nothing for a stranger
            response.headers.add("Server", self.config.user_agent)
        if reply.body:
            response.headers.add("Content-Type", reply.content_type)
            response.body = reply.body
        return response


def is_challenge(reply: Reply) -> bool:
    """A 401/407: sent statelessly, once (no transaction kept for an unauthenticated
    request, no retransmission; RFC 3261 §26.3.2.4). A lost challenge is recovered by
    the client's own retransmission, which gets a fresh one."""
    return reply.status in (401, 407)


def is_unproven(msg: Request, status: int) -> bool:
    """An answer that does not prove ``msg`` was accepted (a challenge, a refusal, the
    200 to OPTIONS): what an unauthenticated source, spoofed or not, can draw."""
    return status >= 300 or msg.method == "OPTIONS"


def amplifies(answer: bytes, msg: Request, ratio: float | None) -> bool:
    """Whether ``answer`` is more than ``ratio`` times the UDP datagram ``msg`` came in."""
    return ratio is not None and msg.udp_size > 0 and len(answer) > ratio * msg.udp_size


def to_tag_of(response: Response) -> str:
    """The To tag of a response ('' when missing)."""
    try:
        return NameAddr.parse(response.headers.get("To") or "").tag or ""
    except SipParseError:
        return ""


__all__ = [
    "CORE_METHODS",
    "KNOWN_METHODS",
    "SUPPORTED_EXTENSIONS",
    "Answer",
    "Cancelled",
    "Decision",
    "DialogRecord",
    "DialogTable",
    "Dispatch",
    "Guard",
    "Refusal",
    "Reply",
    "Send",
    "UaConfig",
    "UaStats",
    "UasCore",
    "amplifies",
    "answer_address",
    "check_request",
    "invite_key",
    "is_challenge",
    "is_unproven",
    "malformed_response",
    "stateless_response",
    "to_tag_of",
    "transport_of",
    "unsupported_extensions",
    "warning",
]
