"""RFC 6298 step by step on a fake clock; back-off and failure times exactly."""

from __future__ import annotations

import pytest

from rudp import MessageReceived, PeerDisconnected, PeerUnreachable, RudpConfig, RudpConnection
from rudp.rto import RtoEstimator

from .sim import KEY, pair


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


def _events(conn: RudpConnection) -> list[object]:
    out: list[object] = []
    while (e := conn.next_event()) is not None:
        out.append(e)
    return out


def test_rfc6298_step_by_step_on_a_connection_with_fake_clock() -> None:
    """Each ACK gives one sample; the timer armed by the next send is now + computed RTO."""
    config = RudpConfig(
        rto_initial=1.0,
        rto_min=0.2,
        granularity=0.001,
        keepalive_interval=0,
        ack_every=1,
        tail_probe=False,  # the RTO alone (RFC 6298); the probe is tested in test_recovery
    )
    a = RudpConnection(KEY, config, sender_id=1)
    b = RudpConnection(KEY, config, sender_id=2)
    # (R, SRTT, RTTVAR, RTO) computed by hand from RFC 6298 §2.2 / §2.3 / §2.4:
    steps = [
        (0.5, 0.5, 0.25, 0.5 + 4 * 0.25),  # first: SRTT = R, RTTVAR = R/2
        (0.3, 0.475, 0.2375, 0.475 + 4 * 0.2375),  # 3/4*.25 + 1/4*.2; 7/8*.5 + 1/8*.3
        (0.7, 0.503125, 0.234375, 0.503125 + 4 * 0.234375),  # 3/4*.2375 + 1/4*.225
        (0.1, 0.45274, 0.276562, 0.45274 + 4 * 0.276562),  # 3/4*.234375 + 1/4*.403125
    ]
    now = 0.0
    assert a.get_timer() is None
    for i, (r, srtt, rttvar, rto) in enumerate(steps):
        a.send_message(b"m%d" % i, now)
        (datagram,) = a.datagrams_to_send(now)
        assert a.get_timer() == pytest.approx(now + a.rto.rto)  # §5.1: armed at send
        b.receive_datagram(datagram, now + r / 2)
        (ack,) = b.datagrams_to_send(now + r / 2)
        a.receive_datagram(ack, now + r)
        assert a.rto.srtt == pytest.approx(srtt, abs=1e-5)
        assert a.rto.rttvar == pytest.approx(rttvar, abs=1e-5)
        assert a.rto.rto == pytest.approx(rto, abs=1e-5)
        assert a.get_timer() is None  # §5.2: all data acknowledged, timer off
        now += r + 1.0
    a.send_message(b"last", now)
    a.datagrams_to_send(now)
    assert a.get_timer() == pytest.approx(now + steps[-1][3], abs=1e-5)


def test_failure_at_computed_time_fails_queued_messages_in_order() -> None:
    """After samples, the peer goes silent: exactly max_retries resends, then every pending
    message (in flight or still queued behind the window) fails in order at the computed time."""
    config = RudpConfig(
        rto_initial=1.0,
        rto_min=0.2,
        backoff=2.0,
        max_retries=4,
        window=2,
        keepalive_interval=0,
        ack_every=1,
        tail_probe=False,  # the RTO's schedule alone
    )
    a = RudpConnection(KEY, config, sender_id=1)
    b = RudpConnection(KEY, config, sender_id=2)
    a.send_message(b"first", 0.0)
    (datagram,) = a.datagrams_to_send(0.0)
    b.receive_datagram(datagram, 0.05)
    (ack,) = b.datagrams_to_send(0.05)
    a.receive_datagram(ack, 0.1)  # R = 0.1: SRTT 0.1, RTTVAR 0.05, RTO 0.3
    assert a.rto.rto == pytest.approx(0.3)
    assert [type(e).__name__ for e in _events(a)] == ["MessageAcked"]
    messages = [b"m1", b"m2" * 700, b"m3", b"m4"]  # m2 has two fragments; window is 2
    ids = [a.send_message(m, 1.0) for m in messages]
    assert len(a.datagrams_to_send(1.0)) == 2  # m1 and m2's first fragment; the rest waits
    expiries = []
    while (when := a.get_timer()) is not None:
        expiries.append(when)
        a.handle_timer(when)
        resent = a.datagrams_to_send(when)
        assert len(resent) == (2 if a.connected else 0)
    rtos = [0.3 * 2.0**i for i in range(config.max_retries + 1)]
    assert expiries == pytest.approx([1.0 + sum(rtos[: i + 1]) for i in range(len(rtos))])
    assert expiries[-1] == pytest.approx(1.0 + 0.3 * 31)  # fails at t = 10.3
    assert a.stats.timeouts == config.max_retries + 1
    assert a.stats.retransmissions == 2 * config.max_retries
    events = _events(a)
    assert [(type(e).__name__, getattr(e, "message_id", None)) for e in events] == [
        *(("MessageFailed", i) for i in ids),
        ("PeerDisconnected", None),
    ]
    assert [getattr(e, "data", None) for e in events[:-1]] == messages
    assert isinstance(events[-1], PeerDisconnected) and events[-1].failed == 4
    assert a.stats.messages_failed == 4
    with pytest.raises(PeerUnreachable):
        a.send_message(b"late", 11.0)


def test_unanswered_keepalive_fails_an_idle_connection() -> None:
    # An idle side (nothing in flight) must notice a dead peer: the PING arms the
    # retransmission timer like DATA, so the agent of a dead broker goes DISCONNECTED.
    config = RudpConfig(rto_initial=1.0, backoff=2.0, max_retries=2, keepalive_interval=10.0)
    conn = RudpConnection(KEY, config, sender_id=1)
    pings: list[float] = []
    while (when := conn.get_timer()) is not None and len(pings) < 10:
        conn.handle_timer(when)
        sent = conn.datagrams_to_send(when)
        pings.extend(when for _ in sent)
    # Keepalive at 10, then RTO 1, 2 (one more PING each), and expiry 3 at 17 fails.
    assert pings == [10.0, 11.0, 13.0]
    assert conn.stats.pings_sent == 3
    assert not conn.connected
    events = _events(conn)
    assert len(events) == 1 and isinstance(events[0], PeerDisconnected)
    assert events[0].failed == 0


def test_answered_keepalive_keeps_an_idle_connection() -> None:
    config = RudpConfig(rto_initial=1.0, max_retries=2, keepalive_interval=10.0)
    net = pair(config, lambda _i: [0.01])
    net.run_until(lambda: net.now >= 100.0)
    assert net.a.connected and net.b.connected
    assert net.a.stats.pings_sent >= 9 and net.a.stats.timeouts == 0


def _sent_alone(conn: RudpConnection, message: bytes, now: float) -> bytes:
    conn.send_message(message, now)
    (datagram,) = conn.datagrams_to_send(now)
    return datagram


def test_path_change_resends_what_is_in_flight_at_once_without_back_off() -> None:
    """A new address (the peer's, or ours after a rebind): packets in flight went over the
    old path. They go again at once, the retry budget and back-off restart, and the RTT
    samples stay; packets the peer reported (SACKed) are not resent."""
    config = RudpConfig(
        rto_initial=1.0,
        rto_min=0.2,
        rto_max=10.0,
        backoff=2.0,
        max_retries=3,
        keepalive_interval=0,
        ack_every=1,
        tail_probe=False,  # the RTO's back-off alone
    )
    a = RudpConnection(KEY, config, sender_id=1)
    b = RudpConnection(KEY, config, sender_id=2)
    # One round trip of 0.1 s gives a sample: RTO = 0.1 + 4 * 0.05 = 0.3.
    a.send_message(b"m0", 0.0)
    (d0,) = a.datagrams_to_send(0.0)
    b.receive_datagram(d0, 0.05)
    (ack0,) = b.datagrams_to_send(0.05)
    a.receive_datagram(ack0, 0.1)
    assert a.rto.rto == pytest.approx(0.3)
    # Three more in flight; the peer gets only the last one (it SACKs it).
    # (One datagram each: messages due together would share one.)
    _lost1, _lost2, d3 = (_sent_alone(a, b"m%d" % i, 1.0) for i in (1, 2, 3))
    b.receive_datagram(d3, 1.05)
    (sack,) = b.datagrams_to_send(1.05)
    a.receive_datagram(sack, 1.1)
    sampled = a.rto.rto  # what the two samples give (m3 was sent once: a sample too)
    assert sampled < 0.3
    # Two timeouts without progress: backed off twice, two retries spent.
    a.handle_timer(a.get_timer() or 0.0)
    assert a.datagrams_to_send(1.4)
    a.handle_timer(a.get_timer() or 0.0)
    a.datagrams_to_send(2.0)
    assert a.rto.rto == pytest.approx(4 * sampled)
    resent_before, acks_before = a.stats.retransmissions, a.stats.acks_sent
    a.path_changed(2.5)
    sent = a.datagrams_to_send(2.5)
    # m1 and m2 at once (m3 was SACKed), and an ACK telling the peer what we hold, all
    # in one datagram.
    assert len(sent) == 1
    assert a.stats.retransmissions == resent_before + 2
    assert a.stats.acks_sent == acks_before + 1
    assert a.rto.rto == pytest.approx(sampled) and a.rto.srtt == pytest.approx(0.1)
    assert a.get_timer() == pytest.approx(2.5 + sampled)
    for datagram in sent:
        b.receive_datagram(datagram, 2.55)
    (ack,) = b.datagrams_to_send(2.55)
    a.receive_datagram(ack, 2.6)
    assert [e for e in _events(b) if isinstance(e, MessageReceived)] == [
        MessageReceived(b"m%d" % i) for i in range(4)
    ]
    assert a.get_timer() is None  # everything acknowledged
    # A fresh budget: max_retries more expiries before failing, not the one left.
    a.send_message(b"m4", 3.0)
    a.datagrams_to_send(3.0)
    for _ in range(config.max_retries):
        a.handle_timer(a.get_timer() or 0.0)
    assert a.connected


def test_path_change_while_disconnected_changes_nothing() -> None:
    config = RudpConfig(rto_initial=1.0, max_retries=0, keepalive_interval=0)
    a = RudpConnection(KEY, config, sender_id=1)
    a.send_message(b"m", 0.0)
    a.datagrams_to_send(0.0)
    a.handle_timer(1.0)
    assert not a.connected
    a.path_changed(2.0)
    assert a.datagrams_to_send(2.0) == [] and not a.connected
