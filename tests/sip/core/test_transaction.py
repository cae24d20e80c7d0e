"""The four transaction machines (RFC 3261 §17, RFC 6026) on a hand-stepped fake clock.

Every test drives a sans-IO machine with explicit ``now`` values and asserts
exact timer deadlines and exact retransmission times. The clock is advanced
only to the deadlines the machine itself reports (``get_timer()``), as the
asyncio adapter does with one ``loop.call_at``.
"""

from __future__ import annotations

from typing import Any, overload

import pytest

from sip.errors import TransactionError
from sip.headers import Headers
from sip.message import Request, Response, make_response, parse_message, serialize
from sip.transaction import (
    ClientInviteTransaction,
    ClientNonInviteTransaction,
    RequestReceived,
    ResponseReceived,
    ServerInviteTransaction,
    ServerNonInviteTransaction,
    State,
    TimerConfig,
    Transaction,
    TransactionLayer,
    TransactionTerminated,
    TransactionTimedOut,
    build_ack_for_non2xx,
)

Address = tuple[str, int]
UAC = ("192.0.2.1", 5060)
UAS = ("192.0.2.2", 5060)
DEFAULT = TimerConfig()
FAST = TimerConfig(t1=0.25, t2=1.0, t4=2.0)  # dyadic: deadlines add up exactly


def request(
    method: str = "INVITE",
    branch: str = "z9hG4bK-1",
    sent_by: str = "192.0.2.1:5060",
    cseq: int = 1,
    extra: tuple[tuple[str, str], ...] = (),
) -> Request:
    headers = Headers(
        [
            ("Via", f"SIP/2.0/UDP {sent_by};branch={branch};rport"),
            ("Via", "SIP/2.0/UDP 198.51.100.7;branch=z9hG4bK-lower"),
            ("Max-Forwards", "70"),
            ("Route", "<sip:proxy.example.org;lr>"),
            ("From", "<sip:alice@example.org>;tag=a1"),
            ("To", "<sip:bob@example.org>"),
            ("Call-ID", "c1@192.0.2.1"),
            ("CSeq", f"{cseq} {method}"),
            *extra,
        ]
    )
    return as_request(Request(method=method, uri="sip:bob@example.org", headers=headers))


def answer(req: Request, status: int, tag: str = "b1") -> Response:
    resp = wire(make_response(req, status, to_tag=tag))
    assert isinstance(resp, Response)
    return resp


def as_request(req: Request) -> Request:
    """``req`` normalised as it is on the wire (with its Content-Length)."""
    out = wire(req)
    assert isinstance(out, Request)
    return out


@overload
def wire(msg: Request) -> Request: ...
@overload
def wire(msg: Response) -> Response: ...
def wire(msg: Request | Response) -> Request | Response:
    """The message as the peer would see it (a parse of its bytes), of the same kind."""
    parsed = parse_message(serialize(msg))
    assert type(parsed) is type(msg)
    return parsed


def state_of(txn: Any) -> State:
    """The state, read through a call so that mypy does not keep an earlier narrowing."""
    state: State = txn.state
    return state


class Tx:
    """Whatever has the sans-IO output interface (a transaction or the layer)."""

    def __init__(self, core: Transaction | TransactionLayer) -> None:
        self.core = core

    def run_until(self, until: float) -> list[tuple[float, Request | Response]]:
        """Step the fake clock from deadline to deadline up to ``until``; what was sent, when."""
        sent: list[tuple[float, Request | Response]] = []
        while (deadline := self.core.get_timer()) is not None and deadline <= until:
            self.core.handle_timer(deadline)
            sent += [(deadline, parse_message(d)) for d, _ in self.core.datagrams_to_send()]
        return sent

    def events(self) -> list[object]:
        out: list[object] = []
        while (event := self.core.next_event()) is not None:
            out.append(event)
        return out

    def sent(self) -> list[Request | Response]:
        return [parse_message(d) for d, _ in self.core.datagrams_to_send()]


def times(sent: list[tuple[float, Request | Response]]) -> list[float]:
    return [t for t, _ in sent]


# ------------------------------------------------------------ INVITE client (§17.1.1)


def started_invite_client(
    config: TimerConfig = DEFAULT, reliable: bool = False
) -> tuple[ClientInviteTransaction, Tx, Request]:
    req = request()
    txn = ClientInviteTransaction(req, UAS, config, reliable)
    txn.send(req, 0.0)
    tx = Tx(txn)
    assert tx.sent() == [req]
    return txn, tx, req


@pytest.mark.parametrize(
    ("config", "expected", "timer_b"),
    [
        (TimerConfig(), [0.5, 1.5, 3.5, 7.5, 15.5, 31.5], 32.0),
        (FAST, [0.25, 0.75, 1.75, 3.75, 7.75, 15.75], 16.0),
        (TimerConfig(t1=1.0, t2=2.0), [1.0, 3.0, 7.0, 15.0, 31.0, 63.0], 64.0),
    ],
)
def test_invite_client_timer_a_doubles_without_cap_until_timer_b(
    config: TimerConfig, expected: list[float], timer_b: float
) -> None:
    txn, tx, req = started_invite_client(config)
    assert txn.state is State.CALLING
    assert txn.timers() == {"A": config.t1, "B": timer_b}
    sent = tx.run_until(1000.0)
    # §17.1.1.2: A fires at T1, then the interval doubles (2T1, 4T1, ...), T2 is no cap.
    assert times(sent) == expected
    assert all(msg == req for _, msg in sent)
    assert tx.events() == [
        TransactionTimedOut(txn.key, req, "B"),
        TransactionTerminated(txn.key),
    ]
    assert state_of(txn) is State.TERMINATED
    assert txn.get_timer() is None


def test_invite_client_timer_a_with_a_non_dyadic_t1() -> None:
    txn, tx, _ = started_invite_client(TimerConfig(t1=0.1))
    assert times(tx.run_until(100.0)) == pytest.approx([0.1, 0.3, 0.7, 1.5, 3.1, 6.3])
    assert txn.terminated


def test_invite_client_over_reliable_transport_has_no_timer_a() -> None:
    txn, tx, req = started_invite_client(reliable=True)
    assert txn.timers() == {"B": 32.0}
    assert tx.run_until(1000.0) == []
    assert tx.events() == [TransactionTimedOut(txn.key, req, "B"), TransactionTerminated(txn.key)]


def test_invite_client_provisional_stops_retransmissions_and_timer_b() -> None:
    txn, tx, req = started_invite_client()
    assert times(tx.run_until(1.0)) == [0.5]
    ringing = answer(req, 180)
    txn.receive(ringing, 1.2)
    assert txn.state is State.PROCEEDING
    # Figure 5: Proceeding has no timer at all; the TU ends it (CANCEL, §9.1).
    assert txn.timers() == {}
    assert tx.events() == [ResponseReceived(ringing, txn.key)]
    txn.receive(answer(req, 183), 2.0)
    assert txn.state is State.PROCEEDING
    assert [type(e) for e in tx.events()] == [ResponseReceived]
    assert tx.run_until(10_000.0) == []
    assert not txn.terminated


@pytest.mark.parametrize("via_proceeding", [False, True])
def test_invite_client_2xx_enters_accepted_and_passes_up_retransmissions(
    via_proceeding: bool,
) -> None:
    txn, tx, req = started_invite_client()
    if via_proceeding:
        txn.receive(answer(req, 100), 0.1)
        tx.events()
    ok = answer(req, 200)
    txn.receive(ok, 0.4)
    # RFC 6026 §8.4: Accepted, timer M = 64*T1; no ACK from the transaction (the TU ACKs 2xx).
    assert txn.state is State.ACCEPTED
    assert txn.timers() == {"M": 0.4 + 32.0}
    assert tx.sent() == []
    assert tx.events() == [ResponseReceived(ok, txn.key)]
    # 2xx retransmissions and 2xx from other forks go up; other responses are absorbed.
    forked = answer(req, 200, tag="fork2")
    txn.receive(ok, 1.0)
    txn.receive(forked, 2.0)
    txn.receive(answer(req, 180), 3.0)
    txn.receive(answer(req, 486), 4.0)
    assert tx.events() == [ResponseReceived(ok, txn.key), ResponseReceived(forked, txn.key)]
    assert tx.sent() == []
    assert txn.timers() == {"M": 32.4}  # retransmissions do not restart M
    assert tx.run_until(32.3) == []
    assert not txn.terminated
    assert tx.run_until(32.4) == []
    assert tx.events() == [TransactionTerminated(txn.key)]


def test_invite_client_accepted_timer_m_with_custom_t1_and_reliable() -> None:
    txn, _, req = started_invite_client(FAST, reliable=True)
    txn.receive(answer(req, 200), 1.0)
    assert txn.timers() == {"M": 17.0}


def test_invite_client_non2xx_is_acked_by_the_transaction_then_timer_d() -> None:
    txn, tx, req = started_invite_client()
    tx.run_until(1.0)
    busy = answer(req, 486, tag="busy-tag")
    txn.receive(busy, 1.25)
    assert txn.state is State.COMPLETED
    assert txn.timers() == {"D": 1.25 + 32.0}
    assert tx.events() == [ResponseReceived(busy, txn.key)]
    [ack] = tx.sent()
    # §17.1.1.3: same Request-URI, Call-ID, From, CSeq number, a single Via equal to
    # the INVITE's top Via (so the same branch), To from the response, the Routes.
    assert isinstance(ack, Request)
    assert ack.method == "ACK"
    assert ack.uri == req.uri
    assert ack.headers.get_all("Via") == [req.headers.get("Via")]
    assert ack.top_via.branch == "z9hG4bK-1"
    assert ack.to.tag == "busy-tag"
    assert ack.headers.get("From") == req.headers.get("From")
    assert ack.call_id == req.call_id
    assert str(ack.cseq) == "1 ACK"
    assert ack.headers.get_raw("Route") == req.headers.get_raw("Route")
    assert ack == as_request(build_ack_for_non2xx(req, busy))
    # A retransmitted final is ACKed again and absorbed; other responses absorbed silently.
    txn.receive(busy, 5.0)
    assert tx.sent() == [ack]
    txn.receive(answer(req, 200), 6.0)
    txn.receive(answer(req, 180), 7.0)
    assert tx.sent() == []
    assert tx.events() == []
    assert tx.run_until(33.24) == []
    assert txn.state is State.COMPLETED
    assert tx.run_until(33.25) == []
    assert tx.events() == [TransactionTerminated(txn.key)]


@pytest.mark.parametrize(
    ("config", "reliable", "timer_d"),
    [
        (TimerConfig(), False, 32.0),
        (FAST, False, 32.0),  # D never drops below 32 s on UDP
        (TimerConfig(t1=1.0), False, 64.0),  # ... nor below H = 64*T1 (§17.1.1.2)
        (TimerConfig(timer_d=40.0), False, 40.0),
        (TimerConfig(), True, 0.0),
    ],
)
def test_invite_client_timer_d(config: TimerConfig, reliable: bool, timer_d: float) -> None:
    txn, tx, req = started_invite_client(config, reliable)
    txn.receive(answer(req, 603), 2.0)
    assert txn.timers() == {"D": 2.0 + timer_d}
    tx.run_until(2.0 + timer_d)
    assert txn.terminated


def test_invite_client_reliable_timer_d_ends_at_once() -> None:
    txn, tx, req = started_invite_client(reliable=True)
    txn.receive(answer(req, 404), 3.0)
    assert txn.get_timer() == 3.0
    txn.handle_timer(3.0)
    assert txn.terminated
    assert [type(e) for e in tx.events()] == [ResponseReceived, TransactionTerminated]


@pytest.mark.parametrize("state", [State.CALLING, State.COMPLETED])
def test_invite_client_transport_error_terminates_and_informs_the_tu(state: State) -> None:
    txn, tx, req = started_invite_client()
    if state is State.COMPLETED:
        txn.receive(answer(req, 500), 1.0)
        tx.events()
    txn.transport_error(2.0)
    assert tx.events() == [
        TransactionTimedOut(txn.key, req, "transport"),
        TransactionTerminated(txn.key),
    ]
    assert txn.timers() == {}


def test_invite_client_transport_error_in_proceeding_and_accepted_is_absorbed() -> None:
    # Figure 5 and RFC 6026 figure 3 have no transport error arc there: nothing is sent.
    txn, tx, req = started_invite_client()
    txn.receive(answer(req, 180), 0.1)
    txn.transport_error(0.2)
    assert txn.state is State.PROCEEDING
    txn.receive(answer(req, 200), 0.3)
    tx.events()
    txn.transport_error(0.4)
    assert state_of(txn) is State.ACCEPTED
    assert tx.events() == []


def test_invite_client_timeout_event_keeps_its_place_in_the_queue() -> None:
    txn, tx, req = started_invite_client(reliable=True)
    txn.receive(answer(req, 100), 0.1)  # event not pulled yet
    txn2 = ClientInviteTransaction(req, UAS)
    txn2.send(req, 0.0)
    txn2.transport_error(0.1)
    ok = answer(req, 100)
    assert tx.events() == [ResponseReceived(ok, txn.key)]
    assert [type(e) for e in Tx(txn2).events()] == [TransactionTimedOut, TransactionTerminated]


def test_client_send_misuse_raises() -> None:
    txn, _, req = started_invite_client()
    with pytest.raises(TransactionError):
        txn.send(req, 1.0)
    other = ClientNonInviteTransaction(request("OPTIONS"), UAS)
    with pytest.raises(TransactionError):
        other.send(request("OPTIONS", branch="z9hG4bK-other"), 0.0)
    txn.transport_error(2.0)
    fresh = ClientInviteTransaction(req, UAS)
    fresh.transport_error(0.0)  # a failure before the send also ends it
    with pytest.raises(TransactionError):
        fresh.send(req, 0.0)


# -------------------------------------------------------- non-INVITE client (§17.1.2)


def started_client(
    config: TimerConfig = DEFAULT, reliable: bool = False, method: str = "OPTIONS"
) -> tuple[ClientNonInviteTransaction, Tx, Request]:
    req = request(method)
    txn = ClientNonInviteTransaction(req, UAS, config, reliable)
    txn.send(req, 0.0)
    tx = Tx(txn)
    assert tx.sent() == [req]
    return txn, tx, req


@pytest.mark.parametrize(
    ("config", "expected", "timer_f"),
    [
        # §17.1.2.2: T1, then doubling, capped at T2.
        (TimerConfig(), [0.5, 1.5, 3.5, 7.5, 11.5, 15.5, 19.5, 23.5, 27.5, 31.5], 32.0),
        (FAST, [0.25, 0.75, 1.75, 2.75, *[2.75 + k for k in range(1, 14)]], 16.0),
        (TimerConfig(t1=0.5, t2=0.5), [0.5 * k for k in range(1, 64)], 32.0),
    ],
)
def test_non_invite_client_timer_e_doubles_up_to_t2_until_timer_f(
    config: TimerConfig, expected: list[float], timer_f: float
) -> None:
    txn, tx, req = started_client(config)
    assert txn.timers() == {"E": config.t1, "F": timer_f}
    sent = tx.run_until(1000.0)
    assert times(sent) == expected
    assert all(msg == req for _, msg in sent)
    assert tx.events() == [TransactionTimedOut(txn.key, req, "F"), TransactionTerminated(txn.key)]


def test_non_invite_client_timer_f_beats_timer_e_on_a_tie() -> None:
    # With T1 = T2, E is due at 64*T1 too: the timeout wins and nothing is resent.
    txn, tx, _ = started_client(TimerConfig(t1=0.5, t2=0.5))
    sent = tx.run_until(32.0)
    assert times(sent)[-1] == 31.5
    assert txn.terminated


def test_non_invite_client_proceeding_retransmits_every_t2() -> None:
    txn, tx, req = started_client()
    trying = answer(req, 100)
    txn.receive(trying, 0.2)
    assert txn.state is State.PROCEEDING
    assert txn.timers() == {"E": 0.5, "F": 32.0}  # a 1xx leaves E and F running
    assert tx.events() == [ResponseReceived(trying, txn.key)]
    # §17.1.2.2: in Proceeding E is reset to T2 (not min(2E, T2)).
    assert times(tx.run_until(1000.0)) == [0.5, 4.5, 8.5, 12.5, 16.5, 20.5, 24.5, 28.5]
    assert [type(e) for e in tx.events()] == [TransactionTimedOut, TransactionTerminated]


def test_non_invite_client_reliable_has_no_timer_e() -> None:
    txn, tx, _ = started_client(FAST, reliable=True)
    assert txn.timers() == {"F": 16.0}
    assert tx.run_until(100.0) == []
    assert txn.terminated


@pytest.mark.parametrize(
    ("config", "reliable", "timer_k"),
    [(TimerConfig(), False, 5.0), (FAST, False, 2.0), (TimerConfig(), True, 0.0)],
)
@pytest.mark.parametrize("status", [200, 404])
def test_non_invite_client_final_enters_completed_with_timer_k(
    config: TimerConfig, reliable: bool, timer_k: float, status: int
) -> None:
    txn, tx, req = started_client(config, reliable)
    txn.receive(answer(req, 100), 0.1)
    final = answer(req, status)
    txn.receive(final, 3.0)
    assert txn.state is State.COMPLETED
    assert txn.timers() == {"K": 3.0 + timer_k}
    assert txn.last_response == final
    # Completed buffers response retransmissions: absorbed, nothing sent, nothing up.
    txn.receive(final, 3.0)
    txn.receive(answer(req, 180), 3.0)
    tx.run_until(3.0 + timer_k)
    assert txn.terminated
    assert [type(e) for e in tx.events()] == [
        ResponseReceived,
        ResponseReceived,
        TransactionTerminated,
    ]
    assert tx.sent() == []


@pytest.mark.parametrize("to_proceeding", [False, True])
def test_non_invite_client_transport_error(to_proceeding: bool) -> None:
    txn, tx, req = started_client()
    if to_proceeding:
        txn.receive(answer(req, 100), 0.1)
        tx.events()
    txn.transport_error(0.2)
    assert tx.events() == [
        TransactionTimedOut(txn.key, req, "transport"),
        TransactionTerminated(txn.key),
    ]
    txn.receive(answer(req, 200), 0.3)
    assert tx.events() == []
    assert tx.sent() == []


# ------------------------------------------------------------ INVITE server (§17.2.1)


def invite_server(
    config: TimerConfig = DEFAULT, reliable: bool = False
) -> tuple[ServerInviteTransaction, Tx, Request]:
    req = request(extra=(("Timestamp", "54"),))
    txn = ServerInviteTransaction(req, UAC, config, reliable, source=UAC)
    return txn, Tx(txn), req


def test_invite_server_sends_100_trying_at_once() -> None:
    txn, tx, req = invite_server()
    assert txn.state is State.PROCEEDING
    assert tx.events() == [RequestReceived(req, UAC, txn.key)]
    [trying] = tx.sent()
    # §17.2.1: the transaction answers 100 itself (allowed at once, mandatory by 200 ms),
    # §8.2.6.1: with the Timestamp copied and no To tag.
    assert isinstance(trying, Response)
    assert trying.status == 100
    assert trying.headers.get("Timestamp") == "54"
    assert trying.to.tag is None
    assert trying.headers.get_all("Via") == req.headers.get_all("Via")
    assert txn.timers() == {}


def test_invite_server_with_a_trying_delay_answers_once_when_the_tu_is_quick() -> None:
    """A challenge within the delay is the only answer: no 100 before it."""
    req = request()
    txn = ServerInviteTransaction(req, UAC, DEFAULT, source=UAC, now=1.0, trying_delay=0.2)
    tx = Tx(txn)
    assert tx.sent() == [] and txn.timers() == {"Trying": 1.2}
    txn.receive(wire(req), 1.1)  # a retransmission before any answer: nothing to resend
    assert tx.sent() == []
    txn.send(answer(req, 401), 1.15)
    [challenge] = tx.sent()
    assert isinstance(challenge, Response) and challenge.status == 401
    assert "Trying" not in txn.timers()
    txn.handle_timer(1.2)
    assert tx.sent() == []


def test_invite_server_with_a_trying_delay_sends_100_when_the_tu_is_slow() -> None:
    req = request()
    txn = ServerInviteTransaction(req, UAC, DEFAULT, source=UAC, now=1.0, trying_delay=0.2)
    tx = Tx(txn)
    txn.handle_timer(1.19)
    assert tx.sent() == []
    txn.handle_timer(1.2)  # §17.2.1: no provisional from the TU within 200 ms
    [trying] = tx.sent()
    assert isinstance(trying, Response) and trying.status == 100
    txn.receive(wire(req), 1.3)  # Proceeding resends it
    assert [m.status for m in tx.sent() if isinstance(m, Response)] == [100]


def test_invite_server_resends_the_last_provisional_on_retransmission() -> None:
    txn, tx, req = invite_server()
    [trying] = tx.sent()
    txn.receive(wire(req), 0.5)
    assert tx.sent() == [trying]
    ringing = answer(req, 180)
    txn.send(ringing, 1.0)
    assert tx.sent() == [ringing]
    txn.receive(wire(req), 1.5)
    txn.receive(wire(req), 3.5)
    assert tx.sent() == [ringing, ringing]
    assert tx.events()[1:] == []  # retransmissions never reach the TU
    assert txn.timers() == {}


@pytest.mark.parametrize(
    ("config", "expected", "timer_h"),
    [
        # §17.2.1: G at T1, doubling, capped at T2; H at 64*T1.
        (
            TimerConfig(),
            [1.5, 2.5, 4.5, 8.5, 12.5, 16.5, 20.5, 24.5, 28.5, 32.5],
            33.0,
        ),
        (FAST, [1.25, 1.75, 2.75, *[2.75 + k for k in range(1, 15)]], 17.0),
    ],
)
def test_invite_server_non2xx_retransmitted_by_timer_g_until_timer_h(
    config: TimerConfig, expected: list[float], timer_h: float
) -> None:
    txn, tx, req = invite_server(config)
    tx.sent()
    busy = answer(req, 486)
    txn.send(busy, 1.0)
    assert txn.state is State.COMPLETED
    assert tx.sent() == [busy]
    assert txn.timers() == {"G": 1.0 + config.t1, "H": timer_h}
    sent = tx.run_until(1000.0)
    assert times(sent) == expected
    assert all(msg == busy for _, msg in sent)
    assert tx.events()[1:] == [
        TransactionTimedOut(txn.key, req, "H"),
        TransactionTerminated(txn.key),
    ]


def test_invite_server_ack_confirms_and_timer_i_absorbs() -> None:
    txn, tx, req = invite_server()
    tx.events()
    tx.sent()
    busy = answer(req, 486)
    txn.send(busy, 1.0)
    tx.sent()
    assert times(tx.run_until(2.5)) == [1.5, 2.5]
    txn.receive(wire(req), 3.0)  # INVITE retransmission in Completed: the final again
    assert tx.sent() == [busy]
    txn.receive(build_ack_for_non2xx(req, busy), 3.25)
    assert txn.state is State.CONFIRMED
    assert txn.timers() == {"I": 3.25 + 5.0}  # G and H stopped, I = T4
    # Confirmed absorbs ACK and INVITE retransmissions.
    txn.receive(build_ack_for_non2xx(req, busy), 4.0)
    txn.receive(wire(req), 5.0)
    assert tx.sent() == []
    assert tx.events() == []
    assert tx.run_until(8.25) == []
    assert tx.events() == [TransactionTerminated(txn.key)]


@pytest.mark.parametrize(("config", "timer_i"), [(FAST, 2.0), (TimerConfig(t4=0.0), 0.0)])
def test_invite_server_timer_i_custom(config: TimerConfig, timer_i: float) -> None:
    txn, _, req = invite_server(config)
    txn.send(answer(req, 480), 1.0)
    txn.receive(build_ack_for_non2xx(req, answer(req, 480)), 2.0)
    assert txn.timers() == {"I": 2.0 + timer_i}


def test_invite_server_reliable_no_timer_g_and_timer_i_zero() -> None:
    txn, tx, req = invite_server(reliable=True)
    tx.sent()
    txn.send(answer(req, 404), 1.0)
    assert txn.timers() == {"H": 33.0}
    txn.receive(build_ack_for_non2xx(req, answer(req, 404)), 2.0)
    assert txn.timers() == {"I": 2.0}
    txn.handle_timer(2.0)
    assert txn.terminated


def test_invite_server_2xx_enters_accepted_with_timer_l() -> None:
    txn, tx, req = invite_server()
    tx.events()
    tx.sent()
    ok = answer(req, 200)
    txn.send(ok, 1.0)
    assert txn.state is State.ACCEPTED
    assert txn.timers() == {"L": 33.0}  # RFC 6026 §8.7: 64*T1, any transport
    assert tx.sent() == [ok]
    # INVITE retransmissions are absorbed (RFC 6026: not a new request, not resent);
    # the 2xx is retransmitted by the TU (§13.3.1.4) through the transaction.
    txn.receive(wire(req), 1.5)
    assert tx.sent() == []
    txn.send(ok, 1.5)
    assert tx.sent() == [ok]
    assert txn.timers() == {"L": 33.0}
    # An ACK reaching the transaction goes to the TU with where it came from.
    ack = request("ACK", branch="z9hG4bK-1")
    txn.receive(ack, 2.0, source=("203.0.113.9", 5070))
    assert tx.events() == [RequestReceived(ack, ("203.0.113.9", 5070), txn.key)]
    assert txn.state is State.ACCEPTED
    assert tx.run_until(33.0) == []
    assert tx.events() == [TransactionTerminated(txn.key)]


def test_invite_server_timer_l_custom_and_reliable() -> None:
    txn, _, req = invite_server(FAST, reliable=True)
    txn.send(answer(req, 200), 1.0)
    assert txn.timers() == {"L": 17.0}


def test_invite_server_tu_misuse_raises() -> None:
    txn, _, req = invite_server()
    txn.send(answer(req, 200), 1.0)
    for status in (180, 486):
        with pytest.raises(TransactionError):
            txn.send(answer(req, status), 1.0)
    txn2, _, req2 = invite_server()
    txn2.send(answer(req2, 486), 1.0)
    for status in (100, 200, 486):
        with pytest.raises(TransactionError):
            txn2.send(answer(req2, status), 2.0)


@pytest.mark.parametrize("state", [State.PROCEEDING, State.COMPLETED])
def test_invite_server_transport_error(state: State) -> None:
    txn, tx, req = invite_server()
    tx.events()
    if state is State.COMPLETED:
        txn.send(answer(req, 486), 1.0)
    txn.transport_error(1.5)
    assert tx.events() == [
        TransactionTimedOut(txn.key, req, "transport"),
        TransactionTerminated(txn.key),
    ]
    assert txn.timers() == {}


# -------------------------------------------------------- non-INVITE server (§17.2.2)


def test_non_invite_server_trying_proceeding_completed_timer_j() -> None:
    req = request("REGISTER")
    txn = ServerNonInviteTransaction(req, UAC, TimerConfig(), False, source=UAC)
    tx = Tx(txn)
    assert txn.state is State.TRYING
    assert tx.events() == [RequestReceived(req, UAC, txn.key)]
    assert tx.sent() == []  # no automatic 100 for non-INVITE
    txn.receive(wire(req), 0.5)  # Trying: absorbed, nothing to resend
    assert tx.sent() == []
    trying = answer(req, 100)
    txn.send(trying, 1.0)
    assert state_of(txn) is State.PROCEEDING
    txn.receive(wire(req), 1.5)
    assert tx.sent() == [trying, trying]
    ok = answer(req, 200)
    txn.send(ok, 2.0)
    assert state_of(txn) is State.COMPLETED
    assert txn.timers() == {"J": 34.0}
    txn.receive(wire(req), 3.0)
    assert tx.sent() == [ok, ok]
    with pytest.raises(TransactionError):
        txn.send(answer(req, 500), 3.0)
    assert tx.run_until(33.9) == []
    assert tx.run_until(34.0) == []
    assert txn.terminated
    assert tx.events() == [TransactionTerminated(txn.key)]
    txn.receive(wire(req), 35.0)
    assert tx.sent() == []


@pytest.mark.parametrize(
    ("config", "reliable", "timer_j"),
    [(FAST, False, 16.0), (TimerConfig(), True, 0.0), (FAST, True, 0.0)],
)
def test_non_invite_server_timer_j(config: TimerConfig, reliable: bool, timer_j: float) -> None:
    req = request("BYE")
    txn = ServerNonInviteTransaction(req, UAC, config, reliable)
    txn.send(answer(req, 481), 5.0)
    assert txn.timers() == {"J": 5.0 + timer_j}


def test_non_invite_server_transport_error_only_after_sending() -> None:
    req = request("BYE")
    txn = ServerNonInviteTransaction(req, UAC)
    tx = Tx(txn)
    tx.events()
    txn.transport_error(0.0)  # figure 8: nothing sent in Trying, no arc
    assert txn.state is State.TRYING
    txn.send(answer(req, 180), 0.1)
    txn.transport_error(0.2)
    assert [type(e) for e in tx.events()] == [TransactionTimedOut, TransactionTerminated]
