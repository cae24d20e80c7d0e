"""Whatever reaches the server's socket: dropped and counted, or taken by its connection;
never an exception, and never a connection for less than a client's Initial."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from quicdata.endpoint import ServerCore
from quicdata.events import MessageReceived
from tests.quicdata.net import certificate, pair


def core() -> ServerCore:
    return ServerCore(certificate(), lambda sid: None)


@given(st.binary(max_size=1500))
@settings(max_examples=300, deadline=None)
def test_random_datagrams_are_dropped_without_an_exception(data: bytes) -> None:
    server = core()
    connection, new = server.receive(data, ("198.51.100.1", 1), 0.0)
    stats = server.stats
    if connection is None:
        assert stats.malformed + stats.unknown_cid == 1
    else:
        assert new and len(data) >= 1200  # a connection only for an Initial's size


def initial() -> bytes:
    net = pair()
    datagrams = net.client.datagrams_to_send(net.now)
    assert datagrams
    return datagrams[0][0]


@given(st.lists(st.tuples(st.integers(min_value=0, max_value=1199), st.integers(0, 255))))
@settings(max_examples=200, deadline=None)
def test_a_corrupted_initial_never_raises(flips: list[tuple[int, int]]) -> None:
    data = bytearray(initial())
    for where, value in flips:
        data[where % len(data)] = value
    server = core()
    connection, _ = server.receive(bytes(data), ("198.51.100.1", 1), 0.0)
    if connection is not None:
        assert not connection.connected


def test_garbage_to_a_live_connection_changes_nothing() -> None:
    net = pair()
    net.pump()
    assert net.client.connected
    live = net.peer
    for garbage in (b"", b"\x40" + bytes(40), b"\xc0" + bytes(1300), bytes(range(256)) * 5):
        net.server.receive(garbage, ("203.0.113.1", 9), net.now)
    net.client.send_message(b"still here")
    net.advance(1.0)
    assert live.connected and len(net.server.connections) == 1
    assert net.server_events[-1] == MessageReceived(b"still here")


def test_the_server_caps_connections_that_have_not_proved_a_key() -> None:
    server = ServerCore(certificate(), lambda sid: None, max_unproved=3)
    made = []
    for i in range(5):
        _, new = server.receive(initial(), ("198.51.100.1", 1000 + i), 0.0)
        made.append(new)
    assert made == [True, True, True, False, False]
    assert server.stats.refused == 2
    for connection in server.connections:  # their proof did not come in time
        connection.handle_timer(100.0)
        server.track(connection)
    _, new = server.receive(initial(), ("198.51.100.1", 2000), 100.0)
    assert new
