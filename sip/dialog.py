"""SIP dialogs (RFC 3261 §12, §13.3.1.4, §14), sans-IO.

Theory of operation: a :class:`Dialog` is created from a 2xx to an INVITE,
either on the UAC side (:meth:`Dialog.from_uac`, §12.1.2) or on the UAS side
(:meth:`Dialog.from_uas`, §12.1.1). It builds in-dialog requests
(:meth:`Dialog.create_request`, §12.2.1.1: CSeq, route set, remote target) and
checks incoming ones (:meth:`Dialog.receive_request`, §12.2.2: CSeq order,
target refresh, glare). Its state goes CONFIRMED -> TERMINATED (the early state
is not used: we never send reliable provisionals).

:class:`TwoXxRetransmitter` is the UAS core's duty of §13.3.1.4: a 2xx to an
INVITE is re-sent at T1, 2*T1, ... capped at T2 until the ACK arrives, and
given up after 64*T1 (the UAS then ends the dialog with BYE).

Glare (§14.1, §14.2): while one re-INVITE of ours is pending, an incoming
re-INVITE is refused with 491; while an incoming one is being answered, a
second one gets 500 with Retry-After.
"""

from __future__ import annotations

import contextlib
import enum
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

from sip.errors import DialogError, SipParseError
from sip.headers import Headers
from sip.message import Request, Response
from sip.transaction import TimerConfig
from sip.uri import NameAddr, SipUri, parse_uri

Address = tuple[str, int]


class DialogState(enum.Enum):
    """§12: we create dialogs only from 2xx, so they start CONFIRMED."""

    CONFIRMED = "confirmed"
    TERMINATED = "terminated"


# One transition table (§12, §15): which methods move the dialog where.
TRANSITIONS: dict[tuple[DialogState, str], DialogState] = {
    (DialogState.CONFIRMED, "INVITE"): DialogState.CONFIRMED,  # target refresh (§12.2)
    (DialogState.CONFIRMED, "UPDATE"): DialogState.CONFIRMED,
    (DialogState.CONFIRMED, "ACK"): DialogState.CONFIRMED,
    (DialogState.CONFIRMED, "INFO"): DialogState.CONFIRMED,
    (DialogState.CONFIRMED, "OPTIONS"): DialogState.CONFIRMED,
    (DialogState.CONFIRMED, "BYE"): DialogState.TERMINATED,  # §15
}

DialogId = tuple[str, str, str]  # (Call-ID, local tag, remote tag), §12


def _uri_of(value: str | None, what: str) -> NameAddr:
    if value is None:
        raise DialogError(400, f"missing {what}")
    try:
        return NameAddr.parse(value)
    except SipParseError as exc:
        raise DialogError(400, f"bad {what}: {exc.reason}") from None


@dataclass(slots=True)
class Dialog:
    """The state of one dialog (§12): ids, sequence numbers, route set, remote target.

    The local and remote URIs are interned: a UA's dialogs mostly share its own URI, and
    the remote one is the peer's address-of-record its owner holds too.
    """

    call_id: str
    local_tag: str
    remote_tag: str
    local_uri: str
    remote_uri: str
    remote_target: str
    route_set: tuple[str, ...] = ()  # a tuple: most dialogs share the empty one
    local_seq: int = 0
    remote_seq: int | None = None
    is_uac: bool = True
    state: DialogState = DialogState.CONFIRMED
    # Glare bookkeeping (§14): an INVITE of ours awaiting its final response, and
    # an INVITE of the peer's awaiting ours.
    invite_out: bool = False
    invite_in: bool = False
    _id: DialogId | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def id(self) -> DialogId:
        """(Call-ID, local tag, remote tag): one tuple per dialog, which every table
        keyed by the dialog shares."""
        if self._id is None:
            self._id = (self.call_id, self.local_tag, self.remote_tag)
        return self._id

    # ------------------------------------------------------------ creation

    @classmethod
    def from_uac(cls, invite: Request, response: Response) -> Dialog:
        """The dialog a 2xx to our INVITE creates (§12.1.2).

        Raises :class:`DialogError` (400) when the response lacks a To tag or a Contact.
        """
        to = _uri_of(response.headers.get("To"), "To")
        frm = _uri_of(invite.headers.get("From"), "From")
        contact = _uri_of(response.headers.get("Contact"), "Contact")
        if to.tag is None or frm.tag is None:
            raise DialogError(400, "2xx without To tag")
        # §12.1.2: the route set is the Record-Route list in reverse order.
        routes = tuple(reversed(response.headers.get_all("Record-Route")))
        return cls(
            call_id=invite.call_id,
            local_tag=frm.tag,
            remote_tag=to.tag,
            local_uri=sys.intern(str(frm.uri)),
            remote_uri=sys.intern(str(to.uri)),
            remote_target=str(contact.uri),
            route_set=routes,
            local_seq=invite.cseq.seq,
            remote_seq=None,
            is_uac=True,
        )

    @classmethod
    def from_uas(cls, invite: Request, local_tag: str) -> Dialog:
        """The dialog our 2xx to an INVITE creates (§12.1.1).

        Raises :class:`DialogError` (400) when the INVITE lacks a From tag or a Contact.
        """
        frm = _uri_of(invite.headers.get("From"), "From")
        to = _uri_of(invite.headers.get("To"), "To")
        contact = _uri_of(invite.headers.get("Contact"), "Contact")
        if frm.tag is None:
            raise DialogError(400, "INVITE without From tag")
        return cls(
            call_id=invite.call_id,
            local_tag=local_tag,
            remote_tag=frm.tag,
            local_uri=sys.intern(str(to.uri)),
            remote_uri=sys.intern(str(frm.uri)),
            remote_target=str(contact.uri),
            # §12.1.1: the route set is the Record-Route list in order.
            route_set=tuple(invite.headers.get_all("Record-Route")),
            local_seq=0,
            remote_seq=invite.cseq.seq,
            is_uac=False,
        )

    # ------------------------------------------------------------ requests out

    def next_hop(self) -> SipUri:
        """Where an in-dialog request goes: the first route, else the remote target (§12.2.1.1)."""
        try:
            if self.route_set:
                uri = NameAddr.parse(self.route_set[0]).uri
            else:
                uri = parse_uri(self.remote_target)
        except SipParseError as exc:
            raise DialogError(400, f"bad route or target: {exc.reason}") from None
        if not isinstance(uri, SipUri):
            raise DialogError(416, f"cannot route to {uri}")
        return uri

    def create_request(
        self,
        method: str,
        *,
        via: str,
        contact: str | None = None,
        body: bytes = b"",
        content_type: str | None = None,
        extra: list[tuple[str, str]] | None = None,
        cseq: int | None = None,
    ) -> Request:
        """A request within the dialog (§12.2.1.1).

        ``via`` is the full top Via value (with a fresh branch). The CSeq is the next local
        one, except for ACK (the INVITE's, pass ``cseq``) and CANCEL. Raises
        :class:`DialogError` (481) when the dialog is terminated.
        """
        if self.state is DialogState.TERMINATED and method != "ACK":
            raise DialogError(481, "dialog terminated")
        if method in ("ACK", "CANCEL"):
            seq = cseq if cseq is not None else self.local_seq
        else:
            self.local_seq += 1
            seq = self.local_seq
        uri = self.remote_target
        routes = list(self.route_set)
        if routes:
            first = NameAddr.parse(routes[0]).uri
            if isinstance(first, SipUri) and "lr" not in first.params:
                # Strict router (§12.2.1.1): it takes the Request-URI; the target goes last.
                uri = str(first)
                routes = [*routes[1:], f"<{self.remote_target}>"]
        headers = Headers()
        headers.add("Via", via)
        headers.add("Max-Forwards", "70")
        for route in routes:
            headers.add("Route", route)
        headers.add("From", f"<{self.local_uri}>;tag={self.local_tag}")
        headers.add("To", f"<{self.remote_uri}>;tag={self.remote_tag}")
        headers.add("Call-ID", self.call_id)
        headers.add("CSeq", f"{seq} {method}")
        if contact is not None and method in ("INVITE", "UPDATE"):
            headers.add("Contact", contact)
        for name, value in extra or []:
            headers.add(name, value)
        if body:
            headers.add("Content-Type", content_type or "application/sdp")
        if method == "INVITE":
            self.invite_out = True
        if method == "BYE":
            self.state = TRANSITIONS[(self.state, "BYE")]
        return Request(method=method, uri=uri, headers=headers, body=body)

    def receive_response(self, request: Request, response: Response) -> None:
        """A final response to one of our in-dialog requests (§12.2.1.2)."""
        if request.method == "INVITE" and response.status >= 200:
            self.invite_out = False
            if response.status < 300:
                contact = response.headers.get("Contact")
                if contact is not None:
                    # A bad Contact keeps the old target rather than losing the dialog.
                    with contextlib.suppress(SipParseError):
                        self.remote_target = str(NameAddr.parse(contact).uri)
        if response.status in (408, 481):
            # §12.2.1.2: these end the dialog.
            self.state = DialogState.TERMINATED

    # ------------------------------------------------------------ requests in

    def receive_request(self, request: Request) -> None:
        """Check and apply an in-dialog request (§12.2.2).

        Raises :class:`DialogError`: 500 for a CSeq lower than the last one (out of order),
        491 for a re-INVITE while ours is pending, 500 for a second re-INVITE while one
        is being answered, 481 on a terminated dialog, 405 for a method not allowed here.
        Nothing changes when it raises.
        """
        method = request.method
        if self.state is DialogState.TERMINATED:
            raise DialogError(481, "dialog terminated")
        if (self.state, method) not in TRANSITIONS:
            raise DialogError(405, f"{method} not allowed in a dialog")
        seq = request.cseq.seq
        if method != "ACK":
            if self.remote_seq is not None and seq < self.remote_seq:
                raise DialogError(500, f"CSeq {seq} lower than {self.remote_seq}")
            if method == "INVITE":
                if self.invite_out:
                    raise DialogError(491, "re-INVITE glare: ours is pending")
                if self.invite_in:
                    raise DialogError(500, "a re-INVITE is already being answered")
            self.remote_seq = seq
        if method in ("INVITE", "UPDATE"):
            contact = request.headers.get("Contact")
            if contact is not None:
                # Target refresh (§12.2.2): the peer moved.
                self.remote_target = str(_uri_of(contact, "Contact").uri)
            if method == "INVITE":
                self.invite_in = True
        self.state = TRANSITIONS[(self.state, method)]

    def answered_invite(self) -> None:
        """Our final response to the peer's re-INVITE went out (glare window closes)."""
        self.invite_in = False

    def terminate(self) -> None:
        """End the dialog (BYE sent or received, or a fatal error)."""
        self.state = DialogState.TERMINATED


@dataclass(slots=True)
class TwoXxRetransmitter:
    """§13.3.1.4: re-send a 2xx to INVITE until its ACK, for at most 64*T1.

    Inputs: :meth:`handle_timer` (``now``) and :meth:`ack_received`. Outputs:
    :meth:`get_timer` and the ``on_resend``/``on_give_up`` callbacks.
    """

    wire: bytes
    start: float
    config: TimerConfig
    on_resend: Callable[[bytes], None]
    on_give_up: Callable[[], None]
    interval: float = 0.0
    deadline: float = 0.0
    next_at: float | None = None

    def __post_init__(self) -> None:
        self.interval = self.config.t1
        self.next_at = self.start + self.interval
        self.deadline = self.start + 64 * self.config.t1

    def get_timer(self) -> float | None:
        """The next time :meth:`handle_timer` must run, or None when done."""
        if self.next_at is None:
            return None
        return min(self.next_at, self.deadline)

    def handle_timer(self, now: float) -> None:
        """Re-send when due; give up at 64*T1."""
        if self.next_at is None:
            return
        if now >= self.deadline:
            self.next_at = None
            self.on_give_up()
            return
        if now >= self.next_at:
            self.on_resend(self.wire)
            self.interval = min(2 * self.interval, self.config.t2)
            self.next_at = now + self.interval

    def ack_received(self) -> None:
        """The ACK came: stop."""
        self.next_at = None
