"""Bad input is dropped and counted (in exactly one counter), never delivered, never raised."""

from __future__ import annotations

import struct

from hypothesis import given, settings
from hypothesis import strategies as st

from rudp import RudpConfig, RudpConnection, RudpStats
from rudp import packet as wire
from rudp.events import MessageReceived

from .sim import KEY

CONFIG = RudpConfig(keepalive_interval=0, ack_every=1)


def _conn(sender: int = 2, config: RudpConfig = CONFIG) -> RudpConnection:
    return RudpConnection(KEY, config, sender_id=sender)


PING = wire.push_frame(wire.Ping())


def _forge(
    conn: RudpConnection,
    payload: bytes,
    *,
    pn: int,
    key: bytes = KEY,
    cid: int | None = None,
    sender: int = 1,
) -> bytes:
    """A datagram sealed as a peer with ``sender`` id and session secret ``key`` would."""
    header = wire.push_header(wire.Header(conn.cid if cid is None else cid, sender, pn))
    return wire.SenderKeys(key, sender, wire.Protection.AEAD).seal(header, pn, payload)


def _data(seq: int, index: int = 0, count: int = 1, payload: bytes = b"x", base: int = 0) -> bytes:
    return wire.push_frame(wire.Data(seq, base, index, count, payload))


def _events(conn: RudpConnection) -> list[object]:
    out: list[object] = []
    while (e := conn.next_event()) is not None:
        out.append(e)
    return out


def _drops(stats: RudpStats) -> dict[str, int]:
    names = [
        "bad_tag",
        "unknown_cid",
        "malformed",
        "oversized",
        "reflected",
        "unknown_sender",
        "replayed",
        "bad_fragment",
    ]
    return {name: getattr(stats, name) for name in names if getattr(stats, name)}


def test_wrong_tag_unknown_cid_truncated_oversized() -> None:
    b = _conn()
    assert not b.receive_datagram(_forge(b, _data(0), pn=0, key=b"k" * 32), 0.0)
    assert not b.receive_datagram(_forge(b, _data(0), pn=1, cid=b.cid ^ 1), 0.0)
    assert not b.receive_datagram(b"\x01\x01" + b"\x00" * 10, 0.0)  # truncated header
    assert not b.receive_datagram(_forge(b, b"\x01\x00", pn=2), 0.0)  # truncated DATA frame
    # an ACK frame announcing 200 SACK blocks that are not there
    lying_ack = _forge(b, struct.pack("!BIB", 2, 0, 200), pn=3)
    assert not b.receive_datagram(lying_ack, 0.0)
    bad_version = bytearray(_forge(b, _data(0), pn=4))
    bad_version[0] = 9
    assert not b.receive_datagram(bytes(bad_version), 0.0)
    oversized = _forge(b, _data(0, payload=b"y" * CONFIG.mtu), pn=5)  # > mtu on the wire
    assert not b.receive_datagram(oversized, 0.0)
    assert _drops(b.stats) == {"bad_tag": 1, "unknown_cid": 1, "malformed": 4, "oversized": 1}
    assert b.stats.packets_received == 0
    assert _events(b) == []


def test_absurd_fragment_counts_and_reflection() -> None:
    b = _conn()
    for pn, (index, count) in enumerate([(0, 0), (5, 3), (0, 60000)]):
        assert not b.receive_datagram(_forge(b, _data(0, index, count), pn=pn), 0.0)
    b.receive_datagram(_forge(b, _data(0, base=1), pn=3), 0.0)  # base above seq
    assert not b.receive_datagram(_forge(b, _data(0), pn=9, sender=2), 0.0)  # our own id
    assert _drops(b.stats) == {"bad_fragment": 4, "reflected": 1}
    assert _events(b) == []


def test_a_message_broken_off_is_dropped_and_the_next_one_delivered() -> None:
    """Reassembly keeps only the message in progress: a new first fragment drops it (one
    bad_fragment), a fragment out of its place drops it too, and nothing is kept between
    messages."""
    b = _conn()
    frames = [
        _data(0, 0, 3, b"a0"),
        _data(1, 1, 3, b"a1"),
        _data(2, 0, 2, b"b0"),  # a new message before "a" ended: "a" is dropped
        _data(3, 1, 2, b"b1"),
        _data(4, 1, 2, b"c1"),  # a second fragment with no first: dropped
        _data(5, 0, 1, b"d"),
    ]
    for pn, frame in enumerate(frames):
        assert b.receive_datagram(_forge(b, frame, pn=pn), 0.0)
    received = [e.data for e in _events(b) if isinstance(e, MessageReceived)]
    assert received == [b"b0b1", b"d"] and b.stats.bad_fragment == 2
    assert b._partial is None and b.buffered_bytes == 0


def test_replays_are_dropped_and_counted() -> None:
    b = _conn()
    packet = _forge(b, _data(0, payload=b"once"), pn=5)
    assert b.receive_datagram(packet, 0.0)
    assert not b.receive_datagram(packet, 0.1)  # same packet number
    # a fresh packet number but an old sequence number: a duplicate, not delivered again
    assert b.receive_datagram(_forge(b, _data(0, payload=b"once"), pn=6), 0.2)
    assert (b.stats.replayed, b.stats.duplicates) == (1, 1)
    assert [type(e).__name__ for e in _events(b)] == ["MessageReceived"]
    # far older than the replay window
    for pn in range(7, 7 + CONFIG.replay_window + 2):
        b.receive_datagram(_forge(b, PING, pn=pn), 0.3)
    assert not b.receive_datagram(_forge(b, PING, pn=0), 0.4)
    assert b.stats.replayed == 2
    assert _events(b) == []


def test_replay_from_an_earlier_connection_cannot_reset_the_window() -> None:
    b = _conn()
    old_incarnation = _forge(b, _data(0, payload=b"old"), pn=99, sender=7)
    assert b.receive_datagram(_forge(b, _data(0, payload=b"new"), pn=0, sender=1), 0.0)
    # Authenticates (same key) but comes from another sender id: dropped, not followed.
    assert not b.receive_datagram(old_incarnation, 0.1)
    assert not b.receive_datagram(_forge(b, _data(0), pn=0, sender=1), 0.2)  # still a replay
    assert _drops(b.stats) == {"unknown_sender": 1, "replayed": 1}
    assert [getattr(e, "data", None) for e in _events(b)] == [b"new"]


def test_packet_number_jump_is_bounded() -> None:
    b = _conn()
    assert b.receive_datagram(_forge(b, PING, pn=0), 0.0)
    assert b.receive_datagram(_forge(b, PING, pn=2**32 - 1), 0.0)
    assert not b.receive_datagram(_forge(b, PING, pn=1), 0.0)
    assert b.stats.replayed == 1


def test_reassembly_and_reordering_memory_is_capped() -> None:
    config = RudpConfig(
        keepalive_interval=0, window=1000, max_message_size=8000, max_buffer_bytes=10_000
    )
    b = _conn(config=config)
    payload = b"z" * 1000
    for seq in range(1, 40):  # seq 0 never arrives: everything waits in the buffer
        b.receive_datagram(_forge(b, _data(seq, 0, 1, payload), pn=seq), 0.0)
        assert b.buffered_bytes <= config.max_buffer_bytes
    assert b.stats.buffer_full == 39 - 10
    assert _events(b) == []
    # The in-order packet still gets in (evicting the highest buffered one): no deadlock.
    b.receive_datagram(_forge(b, _data(0, 0, 1, payload), pn=40), 0.0)
    assert b.buffered_bytes == 0
    assert len(_events(b)) == 10  # seqs 0..9; seq 10 was evicted and must be resent
    # A fragmented message grows the partial reassembly; the cap holds there too.
    count = 7  # 7000 bytes, max_message_size allows 7 fragments of payload_size
    for i in range(count):
        b.receive_datagram(_forge(b, _data(10 + i, i, count, payload), pn=41 + i), 0.0)
        assert b.buffered_bytes <= config.max_buffer_bytes
    assert [len(getattr(e, "data", b"")) for e in _events(b)] == [7000]


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_fuzz_random_bytes_never_escape(data: bytes) -> None:
    b = _conn()
    assert b.receive_datagram(data, 0.0) is False
    b.handle_timer(1.0)
    b.datagrams_to_send(1.0)


@settings(max_examples=300, deadline=None)
@given(st.binary(min_size=wire.HEADER_SIZE - 10, max_size=400))
def test_fuzz_authenticated_headers_never_escape(rest: bytes) -> None:
    """Any version, type, sender, packet number and body behind a valid cid and tag."""
    b = _conn()
    b.send_message(b"q" * 3000, 0.0)
    b.datagrams_to_send(0.0)
    head = rest[:2] + b.cid.to_bytes(8, "big") + rest[2:]
    if len(head) >= wire.HEADER_SIZE:
        sender, pn = int.from_bytes(head[10:14], "big"), int.from_bytes(head[14:18], "big")
        keys = wire.SenderKeys(KEY, sender, wire.Protection.AEAD)
        datagram = keys.seal(head[: wire.HEADER_SIZE], pn, head[wire.HEADER_SIZE :])
    else:
        datagram = head + bytes(wire.TAG_SIZE)
    b.receive_datagram(datagram, 0.0)
    b.handle_timer(5.0)
    b.datagrams_to_send(5.0)
    _events(b)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300), st.sampled_from(list(wire.FrameType)), st.integers(0, 2**32 - 1))
def test_fuzz_authenticated_bodies_never_escape(
    body: bytes, ftype: wire.FrameType, pn: int
) -> None:
    b = _conn()
    b.send_message(b"q" * 3000, 0.0)
    b.datagrams_to_send(0.0)
    b.receive_datagram(_forge(b, bytes((ftype,)) + body, pn=pn), 0.0)
    b.handle_timer(5.0)
    b.datagrams_to_send(5.0)
    _events(b)
