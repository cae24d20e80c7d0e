"""Bad input is dropped and counted, never delivered, never raised."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from rudp import RudpConfig, RudpConnection
from rudp import packet as wire

from .sim import KEY

CONFIG = RudpConfig(keepalive_interval=0, ack_every=1)


def _conn(sender: int = 2) -> RudpConnection:
    return RudpConnection(KEY, CONFIG, sender_id=sender)


def _forge(
    conn: RudpConnection,
    body: bytes,
    *,
    pn: int,
    key: bytes = KEY,
    ptype: wire.PacketType = wire.PacketType.DATA,
    cid: int | None = None,
    sender: int = 1,
) -> bytes:
    header = wire.Header(ptype, conn.cid if cid is None else cid, sender, pn)
    return wire.push_tag(key, wire.push_header(header) + body)


def _data(seq: int, index: int = 0, count: int = 1, payload: bytes = b"x", base: int = 0) -> bytes:
    return wire.push_data(wire.Data(seq, base, index, count, payload))


def _events(conn: RudpConnection) -> list[object]:
    out: list[object] = []
    while (e := conn.next_event()) is not None:
        out.append(e)
    return out


def test_wrong_tag_unknown_cid_truncated_oversized() -> None:
    b = _conn()
    assert not b.receive_datagram(_forge(b, _data(0), pn=0, key=b"k" * 32), 0.0)
    assert not b.receive_datagram(_forge(b, _data(0), pn=0, cid=b.cid ^ 1), 0.0)
    assert not b.receive_datagram(b"\x01\x01" + b"\x00" * 10, 0.0)
    assert not b.receive_datagram(_forge(b, b"\x00\x00", pn=0), 0.0)  # truncated DATA body
    oversized = _forge(b, _data(0, payload=b"y" * (CONFIG.mtu)), pn=0)
    assert not b.receive_datagram(oversized, 0.0)
    s = b.stats
    assert (s.bad_tag, s.unknown_cid, s.malformed) == (1, 1, 3)
    assert _events(b) == []


def test_absurd_fragment_counts_and_reflection() -> None:
    b = _conn()
    for pn, (index, count) in enumerate([(0, 0), (5, 3), (0, 60000)]):
        b.receive_datagram(_forge(b, _data(0, index, count), pn=pn), 0.0)
    assert b.stats.bad_fragment == 3
    b.receive_datagram(_forge(b, _data(0), pn=9, sender=2), 0.0)  # our own sender id
    assert b.stats.reflected == 1
    assert _events(b) == []


def test_replays_are_dropped() -> None:
    b = _conn()
    packet = _forge(b, _data(0, payload=b"once"), pn=5)
    assert b.receive_datagram(packet, 0.0)
    assert not b.receive_datagram(packet, 0.1)  # same packet number
    # a fresh packet number but an old sequence number: a duplicate, not delivered again
    assert b.receive_datagram(_forge(b, _data(0, payload=b"once"), pn=6), 0.2)
    assert b.stats.replayed == 1 and b.stats.duplicates == 1
    assert [type(e).__name__ for e in _events(b)] == ["MessageReceived"]
    # far older than the replay window
    for pn in range(7, 7 + CONFIG.replay_window + 2):
        b.receive_datagram(_forge(b, b"", pn=pn, ptype=wire.PacketType.PING), 0.3)
    assert not b.receive_datagram(_forge(b, b"", pn=0, ptype=wire.PacketType.PING), 0.4)
    assert b.stats.replayed == 2


def test_reassembly_memory_is_capped() -> None:
    config = RudpConfig(keepalive_interval=0, window=1000, max_buffer_bytes=10_000)
    b = RudpConnection(KEY, config, sender_id=2)
    payload = b"z" * 1000
    for seq in range(1, 40):  # seq 0 never arrives: everything waits in the buffer
        b.receive_datagram(_forge(b, _data(seq, 0, 1, payload), pn=seq), 0.0)
    assert b.stats.buffer_full == 39 - 10
    assert _events(b) == []


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_fuzz_random_bytes_never_escape(data: bytes) -> None:
    b = _conn()
    assert b.receive_datagram(data, 0.0) is False
    b.handle_timer(1.0)
    b.datagrams_to_send(1.0)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300), st.sampled_from(list(wire.PacketType)), st.integers(0, 2**32 - 1))
def test_fuzz_authenticated_bodies_never_escape(
    body: bytes, ptype: wire.PacketType, pn: int
) -> None:
    b = _conn()
    b.send_message(b"q" * 3000, 0.0)
    b.datagrams_to_send(0.0)
    b.receive_datagram(_forge(b, body, pn=pn, ptype=ptype), 0.0)
    b.handle_timer(5.0)
    b.datagrams_to_send(5.0)
    _events(b)
