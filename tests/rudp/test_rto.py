"""RFC 6298 step by step on a fake clock; back-off and failure times exactly."""

from __future__ import annotations

import pytest

from rudp import PeerDisconnected, PeerUnreachable, RudpConfig, RudpConnection
from rudp.rto import RtoEstimator

from .sim import KEY


def test_first_and_second_sample_follow_rfc6298() -> None:
    est = RtoEstimator(RudpConfig(rto_min=0.2, rto_initial=1.0, granularity=0.001))
    assert est.rto == 1.0  # §2.1
    # §2.2: SRTT = R, RTTVAR = R/2, RTO = SRTT + max(G, 4*RTTVAR)
    assert est.on_sample(0.5) == pytest.approx(0.5 + 4 * 0.25)
    assert (est.srtt, est.rttvar) == (0.5, 0.25)
    # §2.3: RTTVAR = 3/4*0.25 + 1/4*|0.5-0.3|; SRTT = 7/8*0.5 + 1/8*0.3
    rto = est.on_sample(0.3)
    assert est.rttvar == pytest.approx(0.2375)
    assert est.srtt == pytest.approx(0.475)
    assert rto == pytest.approx(0.475 + 4 * 0.2375)


def test_granularity_and_clamps() -> None:
    est = RtoEstimator(RudpConfig(rto_min=0.2, rto_initial=1.0, rto_max=3.0, granularity=0.5))
    est.on_sample(0.0)  # RTTVAR 0: G dominates, then the minimum clamp
    assert est.rto == pytest.approx(0.5)
    est = RtoEstimator(RudpConfig(rto_min=0.2, rto_initial=1.0, rto_max=3.0))
    assert est.on_sample(0.01) == pytest.approx(0.2)  # 0.01 + 0.02 < rto_min
    assert est.on_sample(10.0) == pytest.approx(3.0)  # clamped to rto_max
    assert est.back_off() == pytest.approx(3.0)


def test_backoff_times_and_failure_after_exactly_max_retries() -> None:
    config = RudpConfig(rto_initial=1.0, backoff=2.0, max_retries=3, keepalive_interval=0)
    conn = RudpConnection(KEY, config, sender_id=1)
    conn.send_message(b"hello", 0.0)
    assert len(conn.datagrams_to_send(0.0)) == 1
    expiries: list[float] = []
    for _ in range(10):
        when = conn.get_timer()
        if when is None:
            break
        expiries.append(when)
        conn.handle_timer(when)
        sent = conn.datagrams_to_send(when)
        assert len(sent) == (1 if conn.connected else 0)
    # RTO 1, 2, 4, 8: three retransmissions, then the fourth expiry fails at t = 15.
    assert expiries == [1.0, 3.0, 7.0, 15.0]
    assert conn.stats.retransmissions == 3
    events: list[object] = []
    while (e := conn.next_event()) is not None:
        events.append(e)
    assert [type(e).__name__ for e in events] == ["MessageFailed", "PeerDisconnected"]
    assert isinstance(events[-1], PeerDisconnected)
    with pytest.raises(PeerUnreachable):
        conn.send_message(b"again", 16.0)
    conn.reset(16.0)
    conn.send_message(b"again", 16.0)


def test_backoff_factor_is_configurable_and_capped() -> None:
    config = RudpConfig(
        rto_initial=1.0, backoff=3.0, rto_max=5.0, max_retries=3, keepalive_interval=0
    )
    conn = RudpConnection(KEY, config, sender_id=1)
    conn.send_message(b"x", 0.0)
    conn.datagrams_to_send(0.0)
    times: list[float] = []
    while (when := conn.get_timer()) is not None and len(times) < 10:
        times.append(when)
        conn.handle_timer(when)
        conn.datagrams_to_send(when)
    assert times == [1.0, 4.0, 9.0, 14.0]  # RTO 1, 3, 5 (capped), 5


def test_karn_rule_no_sample_from_retransmitted_packet() -> None:
    config = RudpConfig(rto_initial=1.0, keepalive_interval=0, ack_every=1)
    a = RudpConnection(KEY, config, sender_id=1)
    b = RudpConnection(KEY, config, sender_id=2)
    a.send_message(b"m", 0.0)
    a.datagrams_to_send(0.0)  # lost
    a.handle_timer(1.0)
    (retx,) = a.datagrams_to_send(1.0)
    b.receive_datagram(retx, 1.1)
    (ack,) = b.datagrams_to_send(1.1)
    a.receive_datagram(ack, 1.2)
    assert a.rto.srtt is None  # ambiguous sample skipped
    assert a.rto.rto == 2.0  # backed-off RTO kept until a valid sample
    a.send_message(b"n", 2.0)
    (fresh,) = a.datagrams_to_send(2.0)
    b.receive_datagram(fresh, 2.05)
    (ack,) = b.datagrams_to_send(2.05)
    a.receive_datagram(ack, 2.1)
    assert a.rto.srtt == pytest.approx(0.1)
