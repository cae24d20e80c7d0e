"""The two server transaction machines (RFC 3261 §17.2, RFC 6026 §8.7), sans-IO, with
their RFC-figure tables. :mod:`sip.transaction_machine` describes how a machine is
driven."""

from __future__ import annotations

from sip.message import Request, Response, make_response
from sip.timers import TimerConfig
from sip.transaction_machine import (
    Address,
    Input,
    RequestReceived,
    State,
    Transaction,
    response_input,
)

S, I = State, Input  # noqa: E741  (short aliases keep the tables readable)

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


class ServerInviteTransaction(ServerTransaction):
    """INVITE server transaction (§17.2.1, RFC 6026).

    Sends 100 Trying at once on creation: §17.2.1 demands one unless the TU
    is known to answer within 200 ms, and sending it at once is always
    allowed; it quenches the client's timer A early. With ``trying_delay``
    (seconds from ``now``), the 100 goes only if the TU has not answered by
    then (timer "Trying"): a server that challenges unauthenticated requests at
    once answers each with one response, never a 100 first (no amplification).
    """

    TABLE = SERVER_INVITE_TABLE
    INITIAL = S.PROCEEDING
    RETRANSMIT_TIMER = "G"
    TIMEOUT_TIMER = "H"

    def __init__(
        self,
        request: Request,
        dest: Address,
        config: TimerConfig = TimerConfig(),
        reliable: bool = False,
        source: Address | None = None,
        *,
        now: float = 0.0,
        trying_delay: float | None = None,
    ) -> None:
        super().__init__(request, dest, config, reliable, source)
        if trying_delay is None:
            self._emit(make_response(request, 100))
        else:
            self._start("Trying", now, trying_delay)

    def _fire(self, name: str, now: float) -> None:
        if name != "Trying":
            super()._fire(name, now)
        elif self._state is S.PROCEEDING and self._wire is None:
            self._emit(make_response(self.request, 100))  # the TU did not answer in time

    def send(self, msg: Response, now: float) -> None:
        """Send 1xx (stay), 2xx (Accepted, timer L) or 300-699 (Completed, G and H)."""
        inp = response_input(msg.status, tu=True)
        before = self._state
        self._step(inp)
        self._stop("Trying")
        self._emit(msg)
        if inp is I.TU_2XX and before is S.PROCEEDING:
            # RFC 6026 §8.7: the TU retransmits the 2xx; L absorbs INVITE retransmissions.
            self._start("L", now, 64 * self.config.t1)
        elif inp is I.TU_FINAL:
            self._start_retransmissions(now)

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


class ServerNonInviteTransaction(ServerTransaction):
    """Non-INVITE server transaction (§17.2.2)."""

    TABLE = SERVER_NON_INVITE_TABLE
    INITIAL = S.TRYING

    def send(self, msg: Response, now: float) -> None:
        """Send 1xx (Proceeding) or a final response (Completed, timer J)."""
        inp = response_input(msg.status, tu=True)
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
