"""The QUIC wrapper, sans-IO: a client and a server core paired in memory."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import pytest

from quicdata.binding import ProofKeys
from quicdata.connection import DEFAULT_CONFIG, QuicDataClosed, QuicDataConfig
from quicdata.events import Connected, MessageReceived, PathValidated, PeerDisconnected
from quicdata.framing import StreamFramingError
from tests.quicdata.net import CLIENT, SECRET, Net, pair


def connected(config: QuicDataConfig = DEFAULT_CONFIG) -> Net:
    net = pair(config=config)
    net.pump()
    assert net.client.connected and net.peer.connected
    return net


def received(events: Sequence[object]) -> list[bytes]:
    return [e.data for e in events if isinstance(e, MessageReceived)]


def test_both_ends_report_connected_with_the_session_id() -> None:
    net = connected()
    session_id = net.client.session_id
    assert session_id is not None and len(session_id) == 8
    assert net.client_events == [Connected(session_id)]
    assert net.server_events == [Connected(session_id)]
    assert net.peer.session_id == session_id


def test_messages_go_both_ways_in_order() -> None:
    net = connected()
    up = [f"up {i}".encode() * (1 + i % 7) for i in range(200)]
    down = [bytes([i % 256]) * (1 + 37 * i) for i in range(100)]
    for message in up:
        net.client.send_message(message)
    for message in down:
        net.peer.send_message(message)
    net.advance(2.0)
    assert received(net.server_events) == up
    assert received(net.client_events) == down


def test_a_large_message_arrives_whole() -> None:
    net = connected()
    big = bytes(range(256)) * 4096  # 1 MiB, the limit
    net.client.send_message(big)
    net.advance(2.0)
    assert received(net.server_events) == [big]


def test_messages_sent_before_the_proofs_wait_for_them() -> None:
    net = pair()
    net.client.send_message(b"early")
    net.advance(1.0)
    assert net.server_events[0] == Connected(net.client.session_id or b"")
    assert received(net.server_events) == [b"early"]


def test_an_empty_or_oversized_message_is_refused_before_sending() -> None:
    net = connected()
    with pytest.raises(StreamFramingError):
        net.client.send_message(b"")
    with pytest.raises(StreamFramingError):
        net.client.send_message(b"x" * ((1 << 20) + 1))


def test_a_silent_peer_is_disconnected_by_the_idle_timeout() -> None:
    net = pair(config=QuicDataConfig(idle_timeout=5.0, keepalive=1.0))
    net.pump()
    net.advance(20.0)  # keepalives keep it up
    assert net.client.connected
    net.cut_down = net.cut_up = True
    net.advance(10.0)
    assert net.client_events[-1] == PeerDisconnected("idle timeout")
    assert net.server_events[-1] == PeerDisconnected("idle timeout")
    with pytest.raises(QuicDataClosed):
        net.client.send_message(b"late")


def test_a_client_that_moves_keeps_its_connection_and_the_server_validates_the_path() -> None:
    net = connected()
    net.client_addr = ("203.0.113.9", 40000)
    net.client.migrate(net.now)
    net.client.send_message(b"from the new address")
    net.advance(1.0)
    paths = [e for e in net.server_events if isinstance(e, PathValidated)]
    assert paths == [PathValidated(("203.0.113.9", 40000), CLIENT)]
    assert net.peer.peer_address == ("203.0.113.9", 40000)
    assert received(net.server_events) == [b"from the new address"]
    net.peer.send_message(b"to the new address")
    net.advance(1.0)
    assert received(net.client_events) == [b"to the new address"]
    assert len(net.server.connections) == 1


def test_a_moved_client_pings_while_the_server_is_silent_within_the_watch() -> None:
    # After a move the server may have given the new path up (a lost PATH_CHALLENGE or
    # PATH_RESPONSE on an amplification-limited path) and be sending to the old address:
    # the client, with nothing in flight, would be silent until its keepalive.
    config = QuicDataConfig(migration_probe=0.1, migration_watch=1.0)
    net = connected(config)
    net.client_addr = ("203.0.113.9", 40000)
    net.client.migrate(net.now)
    net.advance(0.05)  # validated
    assert [e for e in net.server_events if isinstance(e, PathValidated)]
    net.cut_down = True  # the server is heard no more
    sent = net.delivered_up
    net.advance(0.5, step=0.01)
    assert net.delivered_up - sent >= 4  # a PING per quiet 0.1 s
    net.advance(1.0, step=0.01)  # the watch is over: only QUIC's own probes of those PINGs
    quiet = net.delivered_up
    net.cut_down = False
    net.advance(0.3, step=0.01)
    net.advance(2.0, step=0.05)
    assert net.delivered_up - quiet <= 3  # acks of what the server sent, no PINGs


def test_the_watch_stops_once_the_server_sends_what_only_a_validated_path_allows() -> None:
    net = connected()
    net.client_addr = ("203.0.113.9", 40000)
    net.client.migrate(net.now)
    net.advance(0.05)
    for i in range(20):  # 20 KB: far more than three times the client's PING and acks
        net.peer.send_message(bytes([i]) * 1000)
    net.advance(0.2, step=0.01)
    assert len(received(net.client_events)) == 20
    sent = net.delivered_up
    net.advance(1.0, step=0.01)  # idle, the server still heard: no PING per 0.1 s
    assert net.delivered_up - sent <= 2


def test_a_wrong_key_proof_closes_the_connection_with_one_log_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    net = pair(server_secret=bytes(32))  # the server holds another secret for the session
    net.client.send_message(b"must not arrive")
    with caplog.at_level(logging.WARNING, logger="quicdata"):
        net.advance(1.0)
    assert received(net.server_events) == []
    reason = "the agent's key proof failed (it does not hold the session key)"
    assert net.server_events == [PeerDisconnected(reason)]
    assert not net.client.connected and net.client.closed
    assert isinstance(net.client_events[-1], PeerDisconnected)
    assert reason in net.client_events[-1].reason
    lines = [r.getMessage() for r in caplog.records]
    assert sum(reason in line for line in lines) == 2  # once at each end
    assert any(line.startswith("quic server") for line in lines)
    assert any(line.startswith("quic client") and "before the key proofs" in line for line in lines)


def test_a_proof_naming_no_session_is_refused() -> None:
    net = pair(server_secret=None)
    net.advance(1.0)
    assert net.server_events == [PeerDisconnected("the agent's key proof names no session of ours")]
    assert net.client.closed


def test_a_certificate_other_than_the_sdp_fingerprint_is_refused(
    caplog: pytest.LogCaptureFixture,
) -> None:
    net = pair(fingerprint=bytes(32))
    with caplog.at_level(logging.WARNING, logger="quicdata"):
        net.advance(1.0)
    assert len(net.client_events) == 1
    event = net.client_events[0]
    assert isinstance(event, PeerDisconnected)
    assert "is not the one the SDP answer names" in event.reason
    assert not any(isinstance(e, Connected) for e in net.server_events)
    assert any("the SDP answer names" in r.getMessage() for r in caplog.records)


def test_no_proof_in_time_closes_the_connection() -> None:
    net = pair(config=QuicDataConfig(proof_timeout=2.0))
    net.cut_down = True  # the handshake never completes
    net.advance(3.0)
    assert net.client_events == [PeerDisconnected("no key proof within 2 s")]


def test_no_marker_and_no_key_material_on_the_wire() -> None:
    net = connected()
    marker = b"marker-51e3-on-the-wire"
    for i in range(100):
        net.client.send_message(marker + b" %d" % i)
        net.peer.send_message(marker + b" back %d" % i)
    net.advance(2.0)
    assert len(received(net.server_events)) == len(received(net.client_events)) == 100
    keys = ProofKeys(SECRET)
    needles = [marker, SECRET, keys.client, keys.server, keys.session_id]
    assert len(net.wire) >= 8  # the handshake and the messages both ways
    assert not [n for n in needles for datagram in net.wire if n in datagram]


def test_what_the_peer_has_not_acknowledged_is_counted_until_it_is() -> None:
    net = connected()
    net.advance(0.5)  # the client's delayed ACK of the server's proof
    assert net.peer.unacked_bytes == 0
    net.cut_down = True  # the client hears nothing: it acknowledges nothing
    for _ in range(10):
        net.peer.send_message(b"x" * 1000)
    net.pump()
    assert net.peer.unacked_bytes == 10 * (4 + 1000)  # length prefix and message
    net.cut_down = False
    net.advance(2.0)  # retransmitted, received, acknowledged
    assert net.peer.unacked_bytes == 0
    assert received(net.client_events) == [b"x" * 1000] * 10
