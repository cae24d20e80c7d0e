"""SIP transactions (RFC 3261 §17, with the Accepted state of RFC 6026), sans-IO.

Theory of operation: each of the four machines is driven by inputs
``send(msg, now)`` (from the transaction user), ``receive(msg, now)`` (from
the transport) and ``handle_timer(now)``; it produces outputs the caller
pulls: ``datagrams_to_send()`` (bytes + destination), ``get_timer()`` (the
next deadline, absolute, same clock as ``now``) and ``next_event()``
(:class:`ResponseReceived`, :class:`RequestReceived`,
:class:`TransactionTimedOut`, :class:`TransactionTerminated`). The next state
of every machine comes from one table; the side effects of a transition live
in the method that feeds the input. An input the table does not list is, for
network input, absorbed (that is what a transaction does with strays and
retransmissions), and for TU input a :class:`TransactionError`. The TU
sending the request (``send``) is itself a table input, the entry arc of
figures 5 and 6.

Timers are re-armed relative to the ``now`` at which they fire (§17.1.1.2:
"reset the timer with a value of 2*T1"), so a late ``handle_timer`` call
delays the rest of the schedule instead of bursting retransmissions. When two
timers fall due at the same instant, a timeout (B, F, H) fires before a
retransmission timer (A, E, G): nothing is resent by a transaction that is
giving up.

:class:`TransactionLayer` owns the transactions of one endpoint, matches
responses to client transactions by (top Via branch, CSeq method) (§17.1.3)
and requests to server transactions by (branch, sent-by, method, with ACK
matching its INVITE) (§17.2.3), and creates a server transaction for every new
request except ACK. A response that matches no client transaction is
discarded (RFC 6026, amending RFC 3261 §18.1.2): the Accepted state of
the INVITE client transaction already passes 2xx retransmissions up.
"""

from __future__ import annotations

import enum
import heapq
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from sip.errors import SipParseError, TransactionError
from sip.headers import Headers
from sip.message import Request, Response, make_response, parse_message, serialize
from sip.timers import TimerConfig as TimerConfig  # its home before sip.timers

Address = tuple[str, int]
Datagram = tuple[bytes, Address]
MAGIC_COOKIE = "z9hG4bK"


TransactionKey = tuple[str, str, str]  # (branch, sent-by, method)


def make_branch(random: Callable[[int], bytes]) -> str:
    """A fresh RFC 3261 branch (magic cookie + 16 random bytes in hex)."""
    return MAGIC_COOKIE + random(16).hex()


# ---------------------------------------------------------------- events


@dataclass(frozen=True, slots=True)
class RequestReceived:
    """A new request (or an ACK to pass up) arrived for the TU."""

    request: Request
    source: Address
    key: TransactionKey | None


@dataclass(frozen=True, slots=True)
class ResponseReceived:
    """A response the TU must see (provisional, final, 2xx retransmission in Accepted)."""

    response: Response
    key: TransactionKey | None


@dataclass(frozen=True, slots=True)
class TransactionTimedOut:
    """Timer B, F or H fired (or the transport failed): the request failed (408 to the TU).

    ``request`` is None only for a completed non-INVITE server transaction, which keeps
    the final response's bytes and no longer the request.
    """

    key: TransactionKey
    request: Request | None
    timer: str


@dataclass(frozen=True, slots=True)
class TransactionTerminated:
    """The transaction reached Terminated and was forgotten."""

    key: TransactionKey


Event = RequestReceived | ResponseReceived | TransactionTimedOut | TransactionTerminated


class State(enum.Enum):
    """States of all four machines (RFC 3261 figures 5-8, RFC 6026 figures 3-4)."""

    CALLING = "Calling"
    TRYING = "Trying"
    PROCEEDING = "Proceeding"
    ACCEPTED = "Accepted"
    COMPLETED = "Completed"
    CONFIRMED = "Confirmed"
    TERMINATED = "Terminated"


class Input(enum.Enum):
    """Abstract inputs of the machines."""

    TU_REQUEST = "send request"
    TU_1XX = "send 1xx"
    TU_2XX = "send 2xx"
    TU_FINAL = "send 300-699"
    RECV_1XX = "receive 1xx"
    RECV_2XX = "receive 2xx"
    RECV_FINAL = "receive 300-699"
    RECV_REQUEST = "receive request retransmission"
    RECV_ACK = "receive ACK"
    TIMER_A = "A"
    TIMER_B = "B"
    TIMER_D = "D"
    TIMER_E = "E"
    TIMER_F = "F"
    TIMER_G = "G"
    TIMER_H = "H"
    TIMER_I = "I"
    TIMER_J = "J"
    TIMER_K = "K"
    TIMER_L = "L"
    TIMER_M = "M"
    TRANSPORT_ERROR = "transport error"


S, I = State, Input  # noqa: E741  (short aliases keep the tables readable)

# RFC 3261 §17.1.1 (figure 5) as amended by RFC 6026 §8.4 (figure 3): INVITE client.
# No timer B and no transport error in Proceeding: the figure has neither (the
# client sends nothing there and waits for the TU to CANCEL, §9.1).
CLIENT_INVITE_TABLE: dict[tuple[State, Input], State] = {
    (S.CALLING, I.TU_REQUEST): S.CALLING,
    (S.CALLING, I.TIMER_A): S.CALLING,
    (S.CALLING, I.TIMER_B): S.TERMINATED,
    (S.CALLING, I.RECV_1XX): S.PROCEEDING,
    (S.CALLING, I.RECV_2XX): S.ACCEPTED,
    (S.CALLING, I.RECV_FINAL): S.COMPLETED,
    (S.CALLING, I.TRANSPORT_ERROR): S.TERMINATED,
    (S.PROCEEDING, I.RECV_1XX): S.PROCEEDING,
    (S.PROCEEDING, I.RECV_2XX): S.ACCEPTED,
    (S.PROCEEDING, I.RECV_FINAL): S.COMPLETED,
    (S.COMPLETED, I.RECV_FINAL): S.COMPLETED,
    (S.COMPLETED, I.TIMER_D): S.TERMINATED,
    (S.COMPLETED, I.TRANSPORT_ERROR): S.TERMINATED,
    (S.ACCEPTED, I.RECV_2XX): S.ACCEPTED,
    (S.ACCEPTED, I.TIMER_M): S.TERMINATED,
}

# RFC 3261 §17.1.2 (figure 6): non-INVITE client.
CLIENT_NON_INVITE_TABLE: dict[tuple[State, Input], State] = {
    (S.TRYING, I.TU_REQUEST): S.TRYING,
    (S.TRYING, I.TIMER_E): S.TRYING,
    (S.TRYING, I.TIMER_F): S.TERMINATED,
    (S.TRYING, I.RECV_1XX): S.PROCEEDING,
    (S.TRYING, I.RECV_2XX): S.COMPLETED,
    (S.TRYING, I.RECV_FINAL): S.COMPLETED,
    (S.TRYING, I.TRANSPORT_ERROR): S.TERMINATED,
    (S.PROCEEDING, I.TIMER_E): S.PROCEEDING,
    (S.PROCEEDING, I.TIMER_F): S.TERMINATED,
    (S.PROCEEDING, I.RECV_1XX): S.PROCEEDING,
    (S.PROCEEDING, I.RECV_2XX): S.COMPLETED,
    (S.PROCEEDING, I.RECV_FINAL): S.COMPLETED,
    (S.PROCEEDING, I.TRANSPORT_ERROR): S.TERMINATED,
    (S.COMPLETED, I.TIMER_K): S.TERMINATED,
}

# RFC 3261 §17.2.1 (figure 7) as amended by RFC 6026 §8.7 (figure 4): INVITE server.
SERVER_INVITE_TABLE: dict[tuple[State, Input], State] = {
    (S.PROCEEDING, I.RECV_REQUEST): S.PROCEEDING,
    (S.PROCEEDING, I.TU_1XX): S.PROCEEDING,
    (S.PROCEEDING, I.TU_2XX): S.ACCEPTED,
    (S.PROCEEDING, I.TU_FINAL): S.COMPLETED,
    (S.PROCEEDING, I.TRANSPORT_ERROR): S.TERMINATED,
    (S.ACCEPTED, I.RECV_REQUEST): S.ACCEPTED,
    (S.ACCEPTED, I.RECV_ACK): S.ACCEPTED,
    (S.ACCEPTED, I.TU_2XX): S.ACCEPTED,
    (S.ACCEPTED, I.TIMER_L): S.TERMINATED,
    (S.COMPLETED, I.RECV_REQUEST): S.COMPLETED,
    (S.COMPLETED, I.TIMER_G): S.COMPLETED,
    (S.COMPLETED, I.TIMER_H): S.TERMINATED,
    (S.COMPLETED, I.RECV_ACK): S.CONFIRMED,
    (S.COMPLETED, I.TRANSPORT_ERROR): S.TERMINATED,
    (S.CONFIRMED, I.RECV_ACK): S.CONFIRMED,
    (S.CONFIRMED, I.RECV_REQUEST): S.CONFIRMED,
    (S.CONFIRMED, I.TIMER_I): S.TERMINATED,
}

# RFC 3261 §17.2.2 (figure 8): non-INVITE server.
SERVER_NON_INVITE_TABLE: dict[tuple[State, Input], State] = {
    (S.TRYING, I.RECV_REQUEST): S.TRYING,
    (S.TRYING, I.TU_1XX): S.PROCEEDING,
    (S.TRYING, I.TU_2XX): S.COMPLETED,
    (S.TRYING, I.TU_FINAL): S.COMPLETED,
    (S.PROCEEDING, I.RECV_REQUEST): S.PROCEEDING,
    (S.PROCEEDING, I.TU_1XX): S.PROCEEDING,
    (S.PROCEEDING, I.TU_2XX): S.COMPLETED,
    (S.PROCEEDING, I.TU_FINAL): S.COMPLETED,
    (S.PROCEEDING, I.TRANSPORT_ERROR): S.TERMINATED,
    (S.COMPLETED, I.RECV_REQUEST): S.COMPLETED,
    (S.COMPLETED, I.TIMER_J): S.TERMINATED,
    (S.COMPLETED, I.TRANSPORT_ERROR): S.TERMINATED,
}

TU_INPUTS = frozenset({I.TU_REQUEST, I.TU_1XX, I.TU_2XX, I.TU_FINAL})
TIMER_INPUTS: dict[str, Input] = {
    "A": I.TIMER_A,
    "B": I.TIMER_B,
    "D": I.TIMER_D,
    "E": I.TIMER_E,
    "F": I.TIMER_F,
    "G": I.TIMER_G,
    "H": I.TIMER_H,
    "I": I.TIMER_I,
    "J": I.TIMER_J,
    "K": I.TIMER_K,
    "L": I.TIMER_L,
    "M": I.TIMER_M,
}
# Retransmission timers lose a tie against the timeout they race (see the docstring).
_RETRANSMIT_TIMERS = frozenset({"A", "E", "G"})


def _response_input(status: int, tu: bool) -> Input:
    if status < 200:
        return I.TU_1XX if tu else I.RECV_1XX
    if status < 300:
        return I.TU_2XX if tu else I.RECV_2XX
    return I.TU_FINAL if tu else I.RECV_FINAL


def transaction_key(msg: Request | Response) -> TransactionKey:
    """(branch, sent-by, method) of a message; ACK maps to INVITE (§17.2.3).

    Raises :class:`SipParseError` if the top Via or CSeq is unreadable.
    """
    via = msg.top_via
    method = msg.cseq.method if isinstance(msg, Response) else msg.method
    if method == "ACK":
        method = "INVITE"
    branch = via.branch or ""
    if not branch.startswith(MAGIC_COOKIE):
        # RFC 2543 peers: fall back on Call-ID + CSeq number (§17.2.3 simplified).
        branch = f"{msg.call_id}/{msg.cseq.seq}"
    sent_by = f"{via.host}:{via.port or ''}"
    return (branch, sent_by.lower(), method)


class Transaction:
    """Common machinery: state, timers, output queues. Use the four subclasses."""

    TABLE: dict[tuple[State, Input], State] = {}
    INITIAL: State = S.TERMINATED

    def __init__(
        self, request: Request, dest: Address, config: TimerConfig, reliable: bool
    ) -> None:
        self._request: Request | None = request
        self.method = request.method
        self.dest = dest
        self.config = config
        self.reliable = reliable
        self._state = self.INITIAL
        self.key = transaction_key(request)
        self._timers: dict[str, float] = {}
        self._intervals: dict[str, float] = {}
        self._out: list[Datagram] = []
        self._events: deque[Event] = deque()

    @property
    def request(self) -> Request:
        """The request this transaction is for.

        Raises :class:`TransactionError` once a completed non-INVITE server transaction
        released it (it only resends the final response's bytes until timer J).
        """
        if self._request is None:
            raise TransactionError("a completed server transaction keeps no request")
        return self._request

    # ---- outputs
    @property
    def state(self) -> State:
        """The current state (read-only: only the table changes it)."""
        return self._state

    def datagrams_to_send(self) -> list[Datagram]:
        """Messages to put on the wire now, each with its destination."""
        out, self._out = self._out, []
        return out

    def get_timer(self) -> float | None:
        """The earliest pending timer deadline, or None."""
        return min(self._timers.values(), default=None)

    def timers(self) -> dict[str, float]:
        """Pending timers by RFC letter and deadline (for tests and diagnostics)."""
        return dict(self._timers)

    def next_event(self) -> Event | None:
        """The next event for the TU, or None."""
        return self._events.popleft() if self._events else None

    @property
    def terminated(self) -> bool:
        """True once the machine reached Terminated."""
        return self._state is S.TERMINATED

    # ---- internals
    def _step(self, inp: Input, failure: str | None = None) -> bool:
        """Apply the table; False when a network input is absorbed.

        Raises :class:`TransactionError` for a TU input the table does not
        list. ``failure`` names the timer (or "transport") whose firing means
        the request failed: :class:`TransactionTimedOut` is queued, before
        :class:`TransactionTerminated`.
        """
        nxt = self.TABLE.get((self._state, inp))
        if nxt is None:
            if inp in TU_INPUTS:
                raise TransactionError(f"{type(self).__name__}: {inp.value} in {self._state.value}")
            return False
        self._state = nxt
        if failure is not None:
            self._events.append(TransactionTimedOut(self.key, self._request, failure))
        if nxt is S.TERMINATED:
            self._timers.clear()
            self._events.append(TransactionTerminated(self.key))
        return True

    def _start(self, name: str, now: float, interval: float) -> None:
        self._intervals[name] = interval
        self._timers[name] = now + interval

    def _stop(self, *names: str) -> None:
        for name in names:
            self._timers.pop(name, None)

    def handle_timer(self, now: float) -> None:
        """Fire every timer whose deadline is ``<= now`` (earliest first)."""
        for _ in range(64):  # bounded: each firing re-arms at most one later timer
            due = [(t, n in _RETRANSMIT_TIMERS, n) for n, t in self._timers.items() if t <= now]
            if not due:
                return
            _, _, name = min(due)
            del self._timers[name]
            self._fire(TIMER_INPUTS[name], now)

    def _fire(self, inp: Input, now: float) -> None:
        raise NotImplementedError

    def transport_error(self, now: float) -> None:
        """The transport could not deliver (§17.1.4, §17.2.4): the transaction ends.

        Only in the states whose figure has a "Transport Err." arc; elsewhere
        nothing was being sent, and the report is absorbed.
        """
        self._step(I.TRANSPORT_ERROR, failure="transport")


class ClientTransaction(Transaction):
    """Base of the two client machines."""

    FIRST_TIMER = ""  # A or E: the retransmission timer of figure 5 or 6
    TIMEOUT_TIMER = ""  # B or F

    def __init__(
        self,
        request: Request,
        dest: Address,
        config: TimerConfig = TimerConfig(),
        reliable: bool = False,
    ) -> None:
        super().__init__(request, dest, config, reliable)
        self._wire = b""
        self._sent = False
        self.last_response: Response | None = None

    def send(self, msg: Request, now: float) -> None:
        """Start the transaction by sending ``msg`` (the request it was built with).

        Starts the retransmission timer (A or E, unreliable transports only)
        and the timeout (B or F) (§17.1.1.2, §17.1.2.2). Raises
        :class:`TransactionError` when called twice or with a request of
        another transaction.
        """
        if self._sent:
            raise TransactionError("request already sent")
        if msg is not self.request and transaction_key(msg) != self.key:
            raise TransactionError("request does not belong to this transaction")
        self._step(I.TU_REQUEST)
        self._sent = True
        self._request = msg
        self._wire = serialize(msg)
        self._out.append((self._wire, self.dest))
        if not self.reliable:
            self._start(self.FIRST_TIMER, now, self.config.t1)
        self._start(self.TIMEOUT_TIMER, now, 64 * self.config.t1)

    def receive(self, msg: Response, now: float) -> None:
        """Feed a response matched to this transaction."""
        raise NotImplementedError


class ClientInviteTransaction(ClientTransaction):
    """INVITE client transaction (§17.1.1, RFC 6026)."""

    TABLE = CLIENT_INVITE_TABLE
    INITIAL = S.CALLING
    FIRST_TIMER = "A"
    TIMEOUT_TIMER = "B"

    def __init__(
        self,
        request: Request,
        dest: Address,
        config: TimerConfig = TimerConfig(),
        reliable: bool = False,
    ) -> None:
        super().__init__(request, dest, config, reliable)
        self._ack: bytes | None = None

    def receive(self, msg: Response, now: float) -> None:
        """Feed a response (1xx, 2xx or 300-699)."""
        inp = _response_input(msg.status, tu=False)
        before = self._state
        if not self._step(inp):
            return
        if inp is I.RECV_FINAL and before is S.COMPLETED:
            # §17.1.1.2: a retransmitted final is ACKed again, not passed up.
            if self._ack is not None:
                self._out.append((self._ack, self.dest))
            return
        self.last_response = msg
        # §17.1.1.2: any response stops A; B lives in Calling only.
        self._stop("A", "B")
        if inp is I.RECV_FINAL:
            # §17.1.1.3: the transaction itself ACKs a 300-699.
            self._ack = serialize(build_ack_for_non2xx(self.request, msg))
            self._out.append((self._ack, self.dest))
            self._start("D", now, 0.0 if self.reliable else self.config.d)
        elif inp is I.RECV_2XX and before is not S.ACCEPTED:
            # RFC 6026 §8.4: Accepted absorbs nothing, passes 2xx up, for timer M.
            self._start("M", now, 64 * self.config.t1)
        self._events.append(ResponseReceived(msg, self.key))

    def _fire(self, inp: Input, now: float) -> None:
        if not self._step(inp, failure="B" if inp is I.TIMER_B else None):
            return
        if inp is I.TIMER_A:
            self._out.append((self._wire, self.dest))
            self._start("A", now, 2 * self._intervals["A"])  # §17.1.1.2: doubles, no cap


class ClientNonInviteTransaction(ClientTransaction):
    """Non-INVITE client transaction (§17.1.2)."""

    TABLE = CLIENT_NON_INVITE_TABLE
    INITIAL = S.TRYING
    FIRST_TIMER = "E"
    TIMEOUT_TIMER = "F"

    def receive(self, msg: Response, now: float) -> None:
        """Feed a response."""
        inp = _response_input(msg.status, tu=False)
        if not self._step(inp):
            return
        self.last_response = msg
        if self._state is S.COMPLETED:
            # §17.1.2.2: timer K buffers response retransmissions (T4 on UDP, 0 reliable).
            self._stop("E", "F")
            self._start("K", now, 0.0 if self.reliable else self.config.t4)
        self._events.append(ResponseReceived(msg, self.key))

    def _fire(self, inp: Input, now: float) -> None:
        if not self._step(inp, failure="F" if inp is I.TIMER_F else None):
            return
        if inp is I.TIMER_E:
            self._out.append((self._wire, self.dest))
            # Trying: min(2E, T2); Proceeding: T2 (§17.1.2.2).
            interval = (
                min(2 * self._intervals["E"], self.config.t2)
                if self._state is S.TRYING
                else self.config.t2
            )
            self._start("E", now, interval)


class ServerTransaction(Transaction):
    """Base of the two server machines; created from the received request."""

    def __init__(
        self,
        request: Request,
        dest: Address,
        config: TimerConfig = TimerConfig(),
        reliable: bool = False,
        source: Address | None = None,
    ) -> None:
        super().__init__(request, dest, config, reliable)
        self.source = source or dest
        # The last response as sent, for retransmissions; not the parsed message: a
        # completed transaction lives on for timer J or L (32 s over UDP), and under a
        # registration storm thousands of them at once held ~2 kB of objects each.
        self._wire: bytes | None = None
        self._events.append(RequestReceived(request, source or dest, self.key))

    def send(self, msg: Response, now: float) -> None:
        """Send a response from the TU.

        Raises :class:`TransactionError` when the state does not take it.
        """
        raise NotImplementedError

    def receive(self, msg: Request, now: float, source: Address | None = None) -> None:
        """Feed a retransmitted request (or ACK) matched to this transaction.

        ``source`` is where it came from (defaults to :attr:`dest`).
        """
        raise NotImplementedError

    def _emit(self, msg: Response) -> None:
        self._wire = serialize(msg)
        self._out.append((self._wire, self.dest))

    def _resend(self) -> None:
        if self._wire is not None:
            self._out.append((self._wire, self.dest))


class ServerInviteTransaction(ServerTransaction):
    """INVITE server transaction (§17.2.1, RFC 6026).

    Sends 100 Trying at once on creation: §17.2.1 demands one unless the TU
    is known to answer within 200 ms, and sending it at once is always
    allowed; it quenches the client's timer A early.
    """

    TABLE = SERVER_INVITE_TABLE
    INITIAL = S.PROCEEDING

    def __init__(
        self,
        request: Request,
        dest: Address,
        config: TimerConfig = TimerConfig(),
        reliable: bool = False,
        source: Address | None = None,
    ) -> None:
        super().__init__(request, dest, config, reliable, source)
        self._emit(make_response(request, 100))

    def send(self, msg: Response, now: float) -> None:
        """Send 1xx (stay), 2xx (Accepted, timer L) or 300-699 (Completed, G and H)."""
        inp = _response_input(msg.status, tu=True)
        before = self._state
        self._step(inp)
        self._emit(msg)
        if inp is I.TU_2XX and before is S.PROCEEDING:
            # RFC 6026 §8.7: the TU retransmits the 2xx; L absorbs INVITE retransmissions.
            self._start("L", now, 64 * self.config.t1)
        elif inp is I.TU_FINAL:
            if not self.reliable:
                self._start("G", now, self.config.t1)
            self._start("H", now, 64 * self.config.t1)

    def receive(self, msg: Request, now: float, source: Address | None = None) -> None:
        """Absorb INVITE retransmissions (resend the last response); handle ACK."""
        inp = I.RECV_ACK if msg.method == "ACK" else I.RECV_REQUEST
        before = self._state
        if not self._step(inp):
            return
        if inp is I.RECV_REQUEST:
            # §17.2.1: Proceeding resends the last provisional, Completed the final;
            # Accepted (RFC 6026) and Confirmed absorb.
            if before in (S.PROCEEDING, S.COMPLETED):
                self._resend()
            return
        if before is S.ACCEPTED:
            # RFC 6026 §8.7: an ACK for the 2xx goes to the TU (it stops 2xx retransmission).
            self._events.append(RequestReceived(msg, source or self.dest, self.key))
        elif before is S.COMPLETED:
            # §17.2.1: Confirmed absorbs ACK retransmissions for timer I.
            self._stop("G", "H")
            self._start("I", now, 0.0 if self.reliable else self.config.t4)

    def _fire(self, inp: Input, now: float) -> None:
        if not self._step(inp, failure="H" if inp is I.TIMER_H else None):
            return
        if inp is I.TIMER_G:
            self._resend()
            self._start("G", now, min(2 * self._intervals["G"], self.config.t2))


class ServerNonInviteTransaction(ServerTransaction):
    """Non-INVITE server transaction (§17.2.2)."""

    TABLE = SERVER_NON_INVITE_TABLE
    INITIAL = S.TRYING

    def send(self, msg: Response, now: float) -> None:
        """Send 1xx (Proceeding) or a final response (Completed, timer J)."""
        inp = _response_input(msg.status, tu=True)
        self._step(inp)
        self._emit(msg)
        if self._state is S.COMPLETED:
            # From here on it only resends the final response's bytes (no timer of this
            # machine fails the request): the parsed request goes, since a registration
            # storm keeps thousands of these alive for timer J (32 s over UDP).
            self._request = None
            self._start("J", now, 0.0 if self.reliable else 64 * self.config.t1)

    def receive(self, msg: Request, now: float, source: Address | None = None) -> None:
        """Absorb a retransmitted request, resending the last response if any."""
        if msg.method == "ACK":
            return
        before = self._state
        if self._step(I.RECV_REQUEST) and before is not S.TRYING:
            self._resend()

    def _fire(self, inp: Input, now: float) -> None:
        self._step(inp)


def build_ack_for_non2xx(request: Request, response: Response) -> Request:
    """The ACK a client INVITE transaction sends for a 300-699 (§17.1.1.3)."""
    headers = Headers()
    top = request.headers.get("Via")
    if top is not None:
        headers.add("Via", top)
    for route in request.headers.get_raw("Route"):
        headers.add("Route", route)
    headers.add("Max-Forwards", "70")
    headers.add("From", request.headers.get("From") or "")
    headers.add("To", response.headers.get("To") or request.headers.get("To") or "")
    headers.add("Call-ID", request.call_id)
    headers.add("CSeq", f"{request.cseq.seq} ACK")
    return Request(method="ACK", uri=request.uri, headers=headers)


class TransactionLayer:
    """All transactions of one endpoint; matches messages to them (§17.1.3, §17.2.3).

    Inputs: :meth:`send_request`, :meth:`send_response`, :meth:`receive`,
    :meth:`handle_timer`. Outputs: :meth:`datagrams_to_send`,
    :meth:`get_timer`, :meth:`next_event`. Requests that match no transaction
    (a new request) create a server transaction and surface as
    :class:`RequestReceived`; an ACK matching nothing (the ACK for a 2xx, its
    own transaction, §17) surfaces with ``key=None`` so the dialog layer can
    handle it. A response matching nothing is discarded and counted in
    :attr:`strays` (RFC 6026, amending RFC 3261 §18.1.2). A message without a
    readable top Via or CSeq, or a datagram that does not parse
    (:meth:`receive_datagram`), is discarded and counted in :attr:`dropped`.
    """

    def __init__(self, config: TimerConfig = TimerConfig()) -> None:
        self.config = config
        self.clients: dict[TransactionKey, ClientTransaction] = {}
        self.servers: dict[TransactionKey, ServerTransaction] = {}
        self._out: list[Datagram] = []
        self._events: deque[Event] = deque()
        self.dropped = 0  # datagrams that do not parse, messages without readable Via/CSeq
        self.strays = 0  # responses that match no client transaction
        self._deadlines: list[tuple[float, int, Transaction]] = []
        self._seq = 0  # tie-breaker: transactions themselves do not order
        self._open: dict[str, int] = {}  # live server transactions per source host

    def send_request(
        self, request: Request, dest: Address, now: float, reliable: bool = False
    ) -> ClientTransaction:
        """Start a client transaction (ACK for a 2xx is sent statelessly: no transaction).

        Raises :class:`TransactionError` if that branch is already in use.
        """
        if request.method == "ACK":
            self._out.append((serialize(request), dest))
            return ClientNonInviteTransaction(request, dest, self.config, reliable)
        cls = ClientInviteTransaction if request.method == "INVITE" else ClientNonInviteTransaction
        txn = cls(request, dest, self.config, reliable)
        if txn.key in self.clients:
            raise TransactionError(f"branch already in use: {txn.key[0]}")
        self.clients[txn.key] = txn
        txn.send(request, now)
        self._collect(txn)
        return txn

    def send_response(self, response: Response, now: float, dest: Address | None = None) -> None:
        """Send a response through its server transaction, or statelessly when none matches
        (to ``dest`` or the top Via's response address, §18.2.2)."""
        try:
            key = transaction_key(response)
        except SipParseError as exc:
            raise TransactionError(f"response without Via/CSeq: {exc.reason}") from None
        txn = self.servers.get(key)
        if txn is not None and not txn.terminated:
            txn.send(response, now)
            self._collect(txn)
            return
        target = dest or response.top_via.response_address()
        self._out.append((serialize(response), target))

    def receive_datagram(
        self, data: bytes, source: Address, now: float, reliable: bool = False
    ) -> None:
        """Parse one datagram (or framed stream message) and feed it to :meth:`receive`.

        A message that does not parse is dropped and counted in :attr:`dropped`,
        never raised (malformed datagrams never reach the event loop).
        """
        try:
            msg = parse_message(data)
        except SipParseError:
            self.dropped += 1
            return
        self.receive(msg, source, now, reliable)

    def receive(
        self, msg: Request | Response, source: Address, now: float, reliable: bool = False
    ) -> None:
        """Feed a parsed message from the transport."""
        try:
            key = transaction_key(msg)
        except SipParseError:
            self.dropped += 1
            return
        if isinstance(msg, Response):
            client = self.clients.get(key)
            if client is None:
                # RFC 6026 (amending §18.1.2): any element but a stateless proxy discards it.
                self.strays += 1
                return
            client.receive(msg, now)
            self._collect(client)
            return
        server = self.servers.get(key)
        if server is not None:
            server.receive(msg, now, source)
            self._collect(server)
            return
        if msg.method == "ACK":
            self._events.append(RequestReceived(msg, source, None))
            return
        # §18.2.1: note where the request really came from before answering.
        via = msg.top_via
        via.stamp(source[0], source[1])
        msg.headers.remove_first("Via")
        msg.headers.prepend("Via", str(via))
        dest = source if reliable else via.response_address()
        cls = ServerInviteTransaction if msg.method == "INVITE" else ServerNonInviteTransaction
        txn = cls(msg, dest, self.config, reliable, source)
        self.servers[key] = txn
        self._open[source[0]] = self._open.get(source[0], 0) + 1
        self._collect(txn)

    def handle_timer(self, now: float) -> None:
        """Fire due timers of every transaction (earliest deadline first)."""
        heap = self._deadlines
        while heap and heap[0][0] <= now:
            deadline, _, txn = heapq.heappop(heap)
            if txn.terminated or txn.get_timer() != deadline:
                continue  # a stale entry: the transaction moved on since it was pushed
            txn.handle_timer(now)
            self._collect(txn)

    def _collect(self, txn: Transaction) -> None:
        # A registrar holds tens of thousands of transactions waiting on Timer J, so
        # deadlines live in a heap (lazy deletion) rather than being scanned per message.
        deadline = txn.get_timer()
        if deadline is not None and not txn.terminated:
            self._seq += 1
            heapq.heappush(self._deadlines, (deadline, self._seq, txn))
        self._out.extend(txn.datagrams_to_send())
        while (event := txn.next_event()) is not None:
            self._events.append(event)
        if txn.terminated:
            table: dict[TransactionKey, ClientTransaction] | dict[TransactionKey, ServerTransaction]
            table = self.clients if isinstance(txn, ClientTransaction) else self.servers
            if table.get(txn.key) is txn:
                del table[txn.key]
                if isinstance(txn, ServerTransaction):
                    self._closed_server(txn)

    def _closed_server(self, txn: ServerTransaction) -> None:
        host = txn.source[0]
        left = self._open.get(host, 0) - 1
        if left > 0:
            self._open[host] = left
        else:
            self._open.pop(host, None)

    def open_from(self, host: str) -> int:
        """Server transactions from ``host`` still held (the per-source cap counts these)."""
        return self._open.get(host, 0)

    def is_retransmission(self, msg: Request) -> bool:
        """Whether ``msg`` matches a server transaction we hold. Raises SipParseError."""
        return transaction_key(msg) in self.servers

    def respond_statelessly(self, response: Response, dest: Address) -> None:
        """Send ``response`` once to ``dest`` and forget its server transaction (a
        challenge: nothing is kept for an unauthenticated request, nothing resent)."""
        try:
            key = transaction_key(response)
        except SipParseError as exc:
            raise TransactionError(f"response without Via/CSeq: {exc.reason}") from None
        txn = self.servers.pop(key, None)
        if txn is not None:
            self._closed_server(txn)
            txn.datagrams_to_send()  # the 100 Trying it may still hold is not needed now
        self._out.append((serialize(response), dest))

    def transport_error(self, key: TransactionKey, now: float) -> None:
        """Tell the transaction ``key`` its transport failed."""
        txn: Transaction | None = self.clients.get(key) or self.servers.get(key)
        if txn is not None:
            txn.transport_error(now)
            self._collect(txn)

    def datagrams_to_send(self) -> list[Datagram]:
        """Messages to send now with their destinations."""
        out, self._out = self._out, []
        return out

    def get_timer(self) -> float | None:
        """The earliest deadline over all transactions."""
        heap = self._deadlines
        while heap and (heap[0][2].terminated or heap[0][2].get_timer() != heap[0][0]):
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def next_event(self) -> Event | None:
        """The next event for the TU, or None."""
        return self._events.popleft() if self._events else None
