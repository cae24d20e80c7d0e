"""The transaction layer (RFC 3261 §17.1.3, §17.2.3) on a hand-stepped fake clock:
matching, strays, stateless responses, garbage, and what a completed transaction keeps.
"""

from __future__ import annotations

import gc
import tracemalloc

import pytest

from sip.errors import TransactionError
from sip.message import Request, Response, parse_message, serialize
from sip.transaction import (
    RequestReceived,
    ResponseReceived,
    ServerNonInviteTransaction,
    State,
    TimerConfig,
    TransactionLayer,
    TransactionTerminated,
    TransactionTimedOut,
    build_ack_for_non2xx,
    make_branch,
)
from tests.sip.core.test_transaction import (
    DEFAULT,
    FAST,
    UAC,
    UAS,
    Address,
    Tx,
    answer,
    request,
    state_of,
    times,
    wire,
)

# ------------------------------------------------- TransactionLayer (§17.1.3, §17.2.3)


def pump(src: TransactionLayer, dst: TransactionLayer, source: Address, now: float) -> int:
    """Copy datagrams from one layer to the other, as the network would."""
    out = src.datagrams_to_send()
    for data, _ in out:
        dst.receive_datagram(data, source, now)
    return len(out)


def drain(layer: TransactionLayer) -> list[object]:
    return Tx(layer).events()


def test_layer_two_cores_non2xx_invite_round_trip() -> None:
    uac, uas = TransactionLayer(), TransactionLayer()
    req = request()
    uac.send_request(req, UAS, 0.0)
    pump(uac, uas, UAC, 0.0)
    [new] = drain(uas)
    assert isinstance(new, RequestReceived)
    assert new.source == UAC
    assert pump(uas, uac, UAS, 0.0) == 1  # 100 Trying
    [trying] = drain(uac)
    assert isinstance(trying, ResponseReceived)
    assert trying.response.status == 100
    uas.send_response(answer(new.request, 486), 0.5)
    pump(uas, uac, UAS, 0.5)
    [busy] = drain(uac)
    assert isinstance(busy, ResponseReceived)
    assert busy.response.status == 486
    # The ACK the client transaction built matches the INVITE server transaction.
    pump(uac, uas, UAC, 0.5)
    assert [t.state for t in uas.servers.values()] == [State.CONFIRMED]
    assert drain(uas) == []
    assert uas.get_timer() == 5.5  # timer I
    assert uac.get_timer() == 32.5  # timer D
    Tx(uas).run_until(5.5)
    assert uas.servers == {}
    assert [type(e) for e in drain(uas)] == [TransactionTerminated]
    Tx(uac).run_until(32.5)
    assert uac.clients == {}
    assert [type(e) for e in drain(uac)] == [TransactionTerminated]


def test_layer_retransmissions_on_a_lossy_path_are_absorbed() -> None:
    uac, uas = TransactionLayer(), TransactionLayer()
    req = request("OPTIONS")
    uac.send_request(req, UAS, 0.0)
    uac.datagrams_to_send()  # lost
    sent = Tx(uac).run_until(0.5)
    assert times(sent) == [0.5]
    uas.receive(sent[0][1], UAC, 0.5)
    [new] = drain(uas)
    assert isinstance(new, RequestReceived)
    uas.send_response(answer(new.request, 200), 0.5)
    uas.datagrams_to_send()  # the 200 is lost too
    retrans = Tx(uac).run_until(1.5)
    assert times(retrans) == [1.5]
    uas.receive(retrans[0][1], UAC, 1.5)  # absorbed, the 200 resent
    assert drain(uas) == []
    pump(uas, uac, UAS, 1.5)
    [ok] = drain(uac)
    assert isinstance(ok, ResponseReceived)
    assert ok.response.status == 200
    assert uac.get_timer() == 6.5  # K = T4


def test_layer_responses_match_branch_and_cseq_method() -> None:
    layer = TransactionLayer()
    inv = request("INVITE")
    cancel = request("CANCEL")  # §9.1: CANCEL carries the INVITE's branch
    inv_txn = layer.send_request(inv, UAS, 0.0)
    cancel_txn = layer.send_request(cancel, UAS, 0.1)
    assert inv_txn.key != cancel_txn.key
    layer.receive(wire(answer(cancel, 200)), UAS, 0.2)
    assert cancel_txn.state is State.COMPLETED
    assert inv_txn.state is State.CALLING
    layer.receive(wire(answer(inv, 487)), UAS, 0.3)
    assert state_of(inv_txn) is State.COMPLETED
    statuses = [(e.response.status, e.key) for e in drain(layer) if isinstance(e, ResponseReceived)]
    assert statuses == [(200, cancel_txn.key), (487, inv_txn.key)]


def test_layer_stray_responses_are_discarded_and_counted() -> None:
    layer = TransactionLayer()
    req = request()
    txn = layer.send_request(req, UAS, 0.0, reliable=True)
    layer.receive(wire(answer(request(branch="z9hG4bK-unknown"), 200)), UAS, 0.1)
    layer.receive(wire(answer(request("BYE"), 200)), UAS, 0.1)  # same branch, other method
    assert layer.strays == 2
    assert drain(layer) == []
    # After timer M a late 2xx retransmission is a stray too (RFC 6026 on §18.1.2).
    layer.receive(wire(answer(req, 200)), UAS, 1.0)
    assert txn.state is State.ACCEPTED
    Tx(layer).run_until(33.0)
    drain(layer)
    layer.receive(wire(answer(req, 200)), UAS, 40.0)
    assert layer.strays == 3
    assert drain(layer) == []


def test_layer_request_matching_branch_sent_by_and_method() -> None:
    layer = TransactionLayer()
    req = request()
    layer.receive(wire(req), UAC, 0.0)
    assert len(layer.servers) == 1
    layer.receive(wire(req), UAC, 0.1)  # retransmission
    assert len(layer.servers) == 1
    # Same branch from another sent-by: another transaction (§17.2.3).
    layer.receive(wire(request(sent_by="192.0.2.99:5060")), ("192.0.2.99", 5060), 0.2)
    # CANCEL with the INVITE's branch: its own transaction (§9.2).
    layer.receive(wire(request("CANCEL")), UAC, 0.3)
    assert len(layer.servers) == 3
    assert sorted(k[2] for k in layer.servers) == ["CANCEL", "INVITE", "INVITE"]
    events = drain(layer)
    assert [type(e) for e in events] == [RequestReceived] * 3
    # The two 100 Tryings (retransmission re-sends the first) plus the other INVITE's.
    assert [m.status for m in Tx(layer).sent() if isinstance(m, Response)] == [100, 100, 100]


def test_layer_ack_for_non2xx_matches_ack_for_2xx_goes_to_tu() -> None:
    layer = TransactionLayer()
    req = request()
    layer.receive(wire(req), UAC, 0.0)
    [new] = drain(layer)
    assert isinstance(new, RequestReceived)
    layer.send_response(answer(new.request, 200), 0.1)
    # The ACK for a 2xx carries a new branch (§13.2.2.4): no transaction, up to the TU.
    ack = request("ACK", branch="z9hG4bK-ack2xx")
    layer.receive(wire(ack), UAC, 0.2)
    [up] = drain(layer)
    assert isinstance(up, RequestReceived)
    assert up.key is None
    assert up.request.method == "ACK"
    assert len(layer.servers) == 1  # no server transaction for an ACK
    # A non-2xx ACK (same branch) matches the INVITE transaction.
    req2 = request(branch="z9hG4bK-2")
    layer.receive(wire(req2), UAC, 0.3)
    [new2] = drain(layer)
    assert isinstance(new2, RequestReceived)
    busy = answer(new2.request, 486)
    layer.send_response(busy, 0.4)
    layer.receive(build_ack_for_non2xx(req2, busy), UAC, 0.5)
    assert drain(layer) == []
    assert layer.servers[new2.key or ("", "", "")].state is State.CONFIRMED


def test_layer_stamps_via_and_answers_to_rport() -> None:
    layer = TransactionLayer()
    layer.receive(wire(request()), ("203.0.113.5", 40000), 0.0)
    [(data, dest)] = layer.datagrams_to_send()
    assert dest == ("203.0.113.5", 40000)  # §18.2.2 with RFC 3581
    trying = parse_message(data)
    assert trying.top_via.received == "203.0.113.5"
    assert trying.top_via.rport == 40000
    # Over a reliable transport the response goes back on the connection it came from.
    layer.receive(wire(request(branch="z9hG4bK-tcp")), ("203.0.113.5", 40001), 0.0, True)
    [(_, dest)] = layer.datagrams_to_send()
    assert dest == ("203.0.113.5", 40001)


def test_layer_send_response_without_transaction_is_stateless() -> None:
    layer = TransactionLayer()
    req = request()
    req.headers.set("Via", "SIP/2.0/UDP 192.0.2.1:5060;branch=z9hG4bK-x;received=10.0.0.1")
    layer.send_response(answer(req, 200), 0.0)
    [(_, dest)] = layer.datagrams_to_send()
    assert dest == ("10.0.0.1", 5060)
    layer.send_response(answer(req, 200), 0.0, dest=("10.9.9.9", 1))
    [(_, dest)] = layer.datagrams_to_send()
    assert dest == ("10.9.9.9", 1)
    bad = Response(status=200, reason="OK")
    with pytest.raises(TransactionError):
        layer.send_response(bad, 0.0)


def test_layer_garbage_is_dropped_and_counted_never_raised() -> None:
    layer = TransactionLayer()
    for data in (b"", b"\x00\xff garbage", b"INVITE sip:x SIP/2.0\r\n\r\n", b"SIP/2.0 200\r\n"):
        layer.receive_datagram(data, UAC, 0.0)
    # Hand-built messages without a usable top Via are dropped the same way.
    layer.receive(Request(method="OPTIONS", uri="sip:x"), UAC, 0.0)
    layer.receive(Response(status=200, reason="OK"), UAC, 0.0)
    assert layer.dropped == 6
    assert layer.strays == 0
    assert drain(layer) == []
    assert layer.datagrams_to_send() == []
    assert layer.servers == {}


def test_layer_send_request_misuse_and_stateless_ack() -> None:
    layer = TransactionLayer()
    layer.send_request(request("OPTIONS"), UAS, 0.0)
    with pytest.raises(TransactionError):
        layer.send_request(request("OPTIONS"), UAS, 0.1)
    layer.datagrams_to_send()
    # The ACK for a 2xx is the TU's, sent as is, with no transaction and no timer.
    ack = request("ACK", branch="z9hG4bK-ack")
    layer.send_request(ack, UAS, 0.2)
    assert Tx(layer).sent() == [ack]
    assert [k[2] for k in layer.clients] == ["OPTIONS"]
    assert layer.get_timer() == 0.5  # only the OPTIONS' timer E


def test_layer_transport_error_and_timers_over_all_transactions() -> None:
    layer = TransactionLayer(FAST)
    txn = layer.send_request(request("OPTIONS"), UAS, 0.0)
    layer.receive(wire(request(branch="z9hG4bK-in")), UAC, 0.0)
    assert layer.get_timer() == 0.25  # E of the client; the INVITE server has none
    layer.transport_error(txn.key, 0.1)
    assert layer.clients == {}
    events = drain(layer)
    assert [type(e) for e in events] == [
        RequestReceived,
        TransactionTimedOut,
        TransactionTerminated,
    ]
    layer.transport_error(txn.key, 0.2)  # unknown key: nothing
    assert drain(layer) == []
    assert layer.get_timer() is None


def test_make_branch_uses_the_injected_randomness() -> None:
    branch = make_branch(lambda n: bytes(range(n)))
    assert branch == "z9hG4bK" + bytes(range(16)).hex()


def test_timer_config_validation() -> None:
    with pytest.raises(ValueError):
        TimerConfig(t1=0.0)
    with pytest.raises(ValueError):
        TimerConfig(t4=-1.0)
    assert TimerConfig().d == 32.0


def test_a_completed_server_transaction_keeps_its_response_as_bytes_only() -> None:
    # A registration storm keeps thousands of completed server transactions alive for
    # timer J (32 s over UDP): each must hold the response's bytes only, not the parsed
    # request and response (the broker's memory with 10,000 sessions).
    final = answer(request("REGISTER"), 200)
    txns: list[ServerNonInviteTransaction] = []
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        for _ in range(200):
            req = request("REGISTER")  # each its own, as in a real storm
            txn = ServerNonInviteTransaction(req, UAC, DEFAULT)
            txn.send(answer(req, 200), 0.0)
            txn.datagrams_to_send()
            while txn.next_event() is not None:
                pass
            txns.append(txn)
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    held = sum(stat.size_diff for stat in after.compare_to(before, "filename")) / len(txns)
    assert all(txn.state is State.COMPLETED for txn in txns)
    # Its own state (timers, queues, key: ~1.7 kB on CPython 3.11) and the response's
    # bytes: ~1.9 kB. Keeping the parsed request and response as well held ~5 kB.
    assert held < 2500, held
    txn = txns[0]
    with pytest.raises(TransactionError):
        txn.request  # noqa: B018 - released
    assert txn.method == "REGISTER"
    txn.receive(request("REGISTER"), 1.0)  # a retransmitted request: the same bytes
    assert [data for data, _ in txn.datagrams_to_send()] == [serialize(final)]
    # Figure 8's transport error in Completed still tells the TU, without the request.
    txn.transport_error(2.0)
    assert txn.next_event() == TransactionTimedOut(txn.key, None, "transport")


def test_a_forgotten_invite_server_transaction_sends_nothing() -> None:
    """An answer dropped unsent (it would amplify): not even the delayed 100 follows."""
    uac, uas = TransactionLayer(), TransactionLayer(trying_delay=0.2)
    uac.send_request(request(), UAS, 0.0)
    pump(uac, uas, UAC, 0.0)
    [new] = drain(uas)
    assert isinstance(new, RequestReceived) and new.key is not None
    assert uas.datagrams_to_send() == [] and uas.get_timer() == 0.2
    uas.forget_server(new.key)
    assert uas.servers == {} and uas.open_from(UAC[0]) == 0
    uas.handle_timer(0.2)
    assert uas.datagrams_to_send() == []
