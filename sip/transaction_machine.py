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

This module holds what the four machines share (states, inputs, events, timers, the
key); :mod:`sip.client_transaction` and :mod:`sip.server_transaction` hold the
machines with their RFC-figure tables, and :mod:`sip.transaction` the layer.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from sip.errors import TransactionError
from sip.message import Request, Response, serialize
from sip.timers import TimerConfig

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
RETRANSMIT_TIMERS = frozenset({"A", "E", "G"})


def response_input(status: int, tu: bool) -> Input:
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
    RETRANSMIT_TIMER = ""  # A, E or G: resends the last message sent, backing off
    TIMEOUT_TIMER = ""  # B, F or H: its firing means the request failed

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
        # The last message as sent, for retransmissions; not the parsed message: a
        # completed transaction lives on for timer J or L (32 s over UDP), and under a
        # registration storm thousands of them at once held ~2 kB of objects each.
        self._wire: bytes | None = None

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
            due = [(t, n in RETRANSMIT_TIMERS, n) for n, t in self._timers.items() if t <= now]
            if not due:
                return
            _, _, name = min(due)
            del self._timers[name]
            self._fire(name, now)

    def _fire(self, name: str, now: float) -> None:
        failure = name if name == self.TIMEOUT_TIMER else None
        if not self._step(TIMER_INPUTS[name], failure=failure):
            return
        if name == self.RETRANSMIT_TIMER:
            self._resend()
            self._start(name, now, self._backoff(self._intervals[name]))

    def _backoff(self, interval: float) -> float:
        """The next retransmission interval after ``interval``: doubled, capped at T2
        (§17.1.2.2 for E, §17.2.1 for G)."""
        return min(2 * interval, self.config.t2)

    def _start_retransmissions(self, now: float) -> None:
        """Arm the retransmission timer (unreliable transports only) at T1 and the
        timeout at 64*T1 (§17.1.1.2, §17.1.2.2, §17.2.1)."""
        if not self.reliable:
            self._start(self.RETRANSMIT_TIMER, now, self.config.t1)
        self._start(self.TIMEOUT_TIMER, now, 64 * self.config.t1)

    def _emit(self, msg: Request | Response) -> None:
        self._wire = serialize(msg)
        self._out.append((self._wire, self.dest))

    def _resend(self) -> None:
        if self._wire is not None:
            self._out.append((self._wire, self.dest))

    def transport_error(self, now: float) -> None:
        """The transport could not deliver (§17.1.4, §17.2.4): the transaction ends.

        Only in the states whose figure has a "Transport Err." arc; elsewhere
        nothing was being sent, and the report is absorbed.
        """
        self._step(I.TRANSPORT_ERROR, failure="transport")
