"""SIP transactions (RFC 3261 §17, with the Accepted state of RFC 6026), sans-IO.

:class:`TransactionLayer` owns the transactions of one endpoint, matches
responses to client transactions by (top Via branch, CSeq method) (§17.1.3)
and requests to server transactions by (branch, sent-by, method, with ACK
matching its INVITE) (§17.2.3), and creates a server transaction for every new
request except ACK. A response that matches no client transaction is
discarded (RFC 6026, amending RFC 3261 §18.1.2): the Accepted state of
the INVITE client transaction already passes 2xx retransmissions up.

The machines are in :mod:`sip.client_transaction` and :mod:`sip.server_transaction`
(their RFC-figure tables beside them), what they share in :mod:`sip.transaction_machine`;
this module re-exports them.
"""

from __future__ import annotations

import heapq
from collections import deque

from sip.client_transaction import (
    CLIENT_INVITE_TABLE,
    CLIENT_NON_INVITE_TABLE,
    ClientInviteTransaction,
    ClientNonInviteTransaction,
    ClientTransaction,
    build_ack_for_non2xx,
)
from sip.errors import SipParseError, TransactionError
from sip.message import Request, Response, parse_message, serialize
from sip.server_transaction import (
    SERVER_INVITE_TABLE,
    SERVER_NON_INVITE_TABLE,
    ServerInviteTransaction,
    ServerNonInviteTransaction,
    ServerTransaction,
)
from sip.timers import TimerConfig
from sip.transaction_machine import (
    MAGIC_COOKIE,
    TIMER_INPUTS,
    TU_INPUTS,
    Address,
    Datagram,
    Event,
    Input,
    RequestReceived,
    ResponseReceived,
    State,
    Transaction,
    TransactionKey,
    TransactionTerminated,
    TransactionTimedOut,
    make_branch,
    transaction_key,
)


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

    def __init__(
        self, config: TimerConfig = TimerConfig(), *, trying_delay: float | None = None
    ) -> None:
        self.config = config
        # Seconds an INVITE server transaction waits for the TU before its 100 Trying
        # (None: at once; see ServerInviteTransaction).
        self.trying_delay = trying_delay
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
        txn: ServerTransaction
        if msg.method == "INVITE":
            txn = ServerInviteTransaction(
                msg, dest, self.config, reliable, source, now=now, trying_delay=self.trying_delay
            )
        else:
            txn = ServerNonInviteTransaction(msg, dest, self.config, reliable, source)
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
            if isinstance(txn, ServerTransaction) and self.servers.get(txn.key) is not txn:
                continue  # forgotten (forget_server): nothing of it is sent
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
        self.forget_server(key)
        self._out.append((serialize(response), dest))

    def forget_server(self, key: TransactionKey) -> None:
        """Drop server transaction ``key`` unanswered: nothing it holds is sent, and a
        retransmission of its request makes a new one."""
        txn = self.servers.pop(key, None)
        if txn is not None:
            self._closed_server(txn)
            txn.datagrams_to_send()  # the 100 Trying it may still hold is not needed now

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


__all__ = [
    "CLIENT_INVITE_TABLE",
    "CLIENT_NON_INVITE_TABLE",
    "MAGIC_COOKIE",
    "SERVER_INVITE_TABLE",
    "SERVER_NON_INVITE_TABLE",
    "TIMER_INPUTS",
    "TU_INPUTS",
    "Address",
    "ClientInviteTransaction",
    "ClientNonInviteTransaction",
    "ClientTransaction",
    "Datagram",
    "Event",
    "Input",
    "RequestReceived",
    "ResponseReceived",
    "ServerInviteTransaction",
    "ServerNonInviteTransaction",
    "ServerTransaction",
    "State",
    "TimerConfig",
    "Transaction",
    "TransactionKey",
    "TransactionLayer",
    "TransactionTerminated",
    "TransactionTimedOut",
    "build_ack_for_non2xx",
    "make_branch",
    "transaction_key",
]
