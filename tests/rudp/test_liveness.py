"""``dead_after`` and ``PeerRestarted`` on a fake clock: how soon an idle side gives up
on a silent peer, and what a new incarnation of the peer under the same key causes."""

from __future__ import annotations

import pytest

from mdeci.config.agent import AGENT_RUDP
from rudp import PeerDisconnected, PeerRestarted, RudpConfig, RudpConnection
from rudp.events import MessageReceived
from rudp.fields import Event

from .sim import KEY


def _drain(conn: RudpConnection) -> list[Event]:
    events = []
    while (event := conn.next_event()) is not None:
        events.append(event)
    return events


def _fail_time(conn: RudpConnection, limit: int = 100) -> float:
    """Run ``conn``'s timers with the peer silent; the time it went DISCONNECTED."""
    for _ in range(limit):
        when = conn.get_timer()
        assert when is not None
        conn.handle_timer(when)
        conn.datagrams_to_send(when)
        if not conn.connected:
            return when
    raise AssertionError("never gave up")


def _heard(conn: RudpConnection, peer: RudpConnection, now: float) -> None:
    """What ``conn`` has to send (a new connection's first keepalive is due at once) and
    ``peer``'s answer to it."""
    for datagram in conn.datagrams_to_send(now):
        peer.receive_datagram(datagram, now)
    for datagram in peer.datagrams_to_send(now):
        conn.receive_datagram(datagram, now)


def test_a_silent_peer_is_given_up_dead_after_seconds_after_the_keepalive() -> None:
    # The back-off alone (0.2 s doubling, 6 retries) would wait 25.4 s after the PING.
    config = RudpConfig(rto_initial=0.2, rto_min=0.2, keepalive_interval=5.0, dead_after=4.0)
    conn = RudpConnection(KEY, config, sender_id=1)
    _heard(conn, RudpConnection(KEY, config, sender_id=2), 100.0)  # then the peer dies
    assert _fail_time(conn) == pytest.approx(109.0)
    assert [type(e) for e in _drain(conn)] == [PeerDisconnected]
    config = RudpConfig(rto_initial=0.2, rto_min=0.2, keepalive_interval=5.0)
    without = RudpConnection(KEY, config, sender_id=1)
    _heard(without, RudpConnection(KEY, config, sender_id=2), 100.0)
    assert _fail_time(without) == pytest.approx(105.0 + 0.2 * (2**7 - 1))


def test_the_agents_default_bound_is_at_most_ten_seconds_for_an_idle_agent() -> None:
    conn = RudpConnection(KEY, AGENT_RUDP, sender_id=1)
    _heard(conn, RudpConnection(KEY, AGENT_RUDP, sender_id=2), 50.0)
    bound = AGENT_RUDP.keepalive_interval + AGENT_RUDP.dead_after
    assert _fail_time(conn) - 50.0 == pytest.approx(bound) and bound <= 10.0


def test_an_answering_peer_restarts_the_count_and_data_waits_count_too() -> None:
    config = RudpConfig(keepalive_interval=5.0, dead_after=4.0)
    agent = RudpConnection(KEY, config, sender_id=1)
    broker = RudpConnection(KEY, config, sender_id=2)
    for t in range(100, 160, 5):  # idling: every PING answered at once
        agent.handle_timer(float(t))
        _heard(agent, broker, float(t))
    assert agent.connected and agent.stats.pings_sent == 12
    # DATA unanswered from 161: given up at 165 (4 s), not at the back-off's end.
    agent.send_message(b"pub", 161.0)
    assert agent.datagrams_to_send(161.0)
    assert _fail_time(agent) == pytest.approx(165.0)


def test_a_new_incarnation_is_reported_once_the_old_one_is_given_up() -> None:
    """Heard while the old incarnation still counted as alive, the new one is reported
    the moment the old one is given up: its next datagram may be seconds away (its own
    back-off), and a restarted broker is reached through it."""
    config = RudpConfig(keepalive_interval=5.0, dead_after=4.0)
    agent = RudpConnection(KEY, config, sender_id=1)
    old = RudpConnection(KEY, config, sender_id=2)
    _heard(agent, old, 100.0)  # a PING answered: the agent pins the old incarnation
    assert agent.stats.pings_sent == 1 and agent.stats.packets_received == 1
    new = RudpConnection(KEY, config, sender_id=3)  # same key, another sender: restarted
    (hello,) = new.datagrams_to_send(101.0)  # its first keepalive, at once
    # Still believed alive: dropped, and the old one is probed at once.
    assert not agent.receive_datagram(hello, 101.0)
    assert agent.stats.unknown_sender == 1 and _drain(agent) == []
    assert len(agent.datagrams_to_send(101.0)) == 1 and agent.stats.pings_sent == 2
    assert _fail_time(agent) == pytest.approx(105.0)  # dead_after from that probe
    assert _drain(agent) == [PeerDisconnected(0), PeerRestarted(3)]
    assert not agent.connected  # the layer above makes the new association
    new.handle_timer(102.0)
    (again,) = new.datagrams_to_send(102.0)  # its PING again after its RTO
    assert not agent.receive_datagram(again, 106.0)
    assert _drain(agent) == [PeerRestarted(3)]  # each datagram of it, once given up


def test_another_incarnation_is_forgotten_when_the_pinned_peer_speaks_again() -> None:
    """A datagram of another sender while the pinned peer answers after all was a
    replay: a later loss of the pinned peer reports no restart."""
    config = RudpConfig(keepalive_interval=5.0, dead_after=4.0)
    agent = RudpConnection(KEY, config, sender_id=1)
    old = RudpConnection(KEY, config, sender_id=2)
    _heard(agent, old, 100.0)
    (hello,) = RudpConnection(KEY, config, sender_id=3).datagrams_to_send(101.0)
    assert not agent.receive_datagram(hello, 101.0)
    _heard(agent, old, 101.5)  # the probe it caused is answered: the old one is alive
    assert _drain(agent) == []
    assert _fail_time(agent) > 105.0
    assert _drain(agent) == [PeerDisconnected(0)]


def test_a_restored_association_is_not_taken_by_the_peers_old_one() -> None:
    """A restarted broker's restored association speaks first. The agent's association
    with the dead incarnation, still alive in its eyes, PINGs back; that association
    refuses all the new incarnation sends, so pinning it would refuse the agent's next,
    fresh association under the same key as well. Only DATA pins."""
    config = RudpConfig(keepalive_interval=5.0, dead_after=4.0)
    agent = RudpConnection(KEY, config, sender_id=1)
    _heard(agent, RudpConnection(KEY, config, sender_id=2), 100.0)  # the dead incarnation
    restored = RudpConnection(KEY, config, sender_id=3)
    restored.announce()
    for datagram in restored.datagrams_to_send(101.0):
        assert not agent.receive_datagram(datagram, 101.0)  # another sender: it probes
    (probe,) = agent.datagrams_to_send(101.0)
    assert not restored.receive_datagram(probe, 101.0)  # a bare PING pins nobody
    assert _fail_time(agent) == pytest.approx(105.0)
    assert _drain(agent) == [PeerDisconnected(0), PeerRestarted(3)]
    fresh = RudpConnection(KEY, config, sender_id=4)  # the agent's new association
    fresh.send_message(b"list", 105.0)
    assert [restored.receive_datagram(d, 105.0) for d in fresh.datagrams_to_send(105.0)] == [True]
    assert MessageReceived(b"list") in _drain(restored)
    assert restored.stats.unknown_sender == 1


def test_announce_sends_one_ping_even_without_keepalive() -> None:
    config = RudpConfig(keepalive_interval=0.0, dead_after=4.0)
    broker = RudpConnection(KEY, config, sender_id=7)
    assert broker.datagrams_to_send(100.0) == []  # no keepalive of its own
    broker.announce()
    assert len(broker.datagrams_to_send(100.0)) == 1 and broker.stats.pings_sent == 1
    assert broker.datagrams_to_send(100.0) == []  # one PING, not a keepalive


def test_dead_after_is_checked() -> None:
    with pytest.raises(ValueError, match="dead_after"):
        RudpConfig(dead_after=-1.0)
