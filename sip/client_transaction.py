"""The two client transaction machines (RFC 3261 §17.1, RFC 6026 §8.4), sans-IO: their
RFC-figure tables, and the ACK a client INVITE transaction sends for a non-2xx final.
:mod:`sip.transaction_machine` describes how a machine is driven."""

from __future__ import annotations

from sip.errors import TransactionError
from sip.headers import Headers
from sip.message import Request, Response, serialize
from sip.timers import TimerConfig
from sip.transaction_machine import (
    Address,
    Input,
    ResponseReceived,
    State,
    Transaction,
    response_input,
    transaction_key,
)

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


class ClientTransaction(Transaction):
    """Base of the two client machines."""

    def __init__(
        self,
        request: Request,
        dest: Address,
        config: TimerConfig = TimerConfig(),
        reliable: bool = False,
    ) -> None:
        super().__init__(request, dest, config, reliable)
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
        self._emit(msg)
        self._start_retransmissions(now)

    def receive(self, msg: Response, now: float) -> None:
        """Feed a response matched to this transaction."""
        raise NotImplementedError


class ClientInviteTransaction(ClientTransaction):
    """INVITE client transaction (§17.1.1, RFC 6026)."""

    TABLE = CLIENT_INVITE_TABLE
    INITIAL = S.CALLING
    RETRANSMIT_TIMER = "A"
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
        inp = response_input(msg.status, tu=False)
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

    def _backoff(self, interval: float) -> float:
        return 2 * interval  # §17.1.1.2: doubles, no cap


class ClientNonInviteTransaction(ClientTransaction):
    """Non-INVITE client transaction (§17.1.2)."""

    TABLE = CLIENT_NON_INVITE_TABLE
    INITIAL = S.TRYING
    RETRANSMIT_TIMER = "E"
    TIMEOUT_TIMER = "F"

    def receive(self, msg: Response, now: float) -> None:
        """Feed a response."""
        inp = response_input(msg.status, tu=False)
        if not self._step(inp):
            return
        self.last_response = msg
        if self._state is S.COMPLETED:
            # §17.1.2.2: timer K buffers response retransmissions (T4 on UDP, 0 reliable).
            self._stop("E", "F")
            self._start("K", now, 0.0 if self.reliable else self.config.t4)
        self._events.append(ResponseReceived(msg, self.key))

    def _backoff(self, interval: float) -> float:
        # Trying: min(2E, T2); Proceeding: T2 (§17.1.2.2).
        return super()._backoff(interval) if self._state is S.TRYING else self.config.t2


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
