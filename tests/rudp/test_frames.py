"""Wire format v2: several frames per datagram, encryption, path frames (docs/rudp.md §1)."""

from __future__ import annotations

from rudp import MessageReceived, RudpConfig, RudpConnection
from rudp import packet as wire

from .sim import KEY

CONFIG = RudpConfig(keepalive_interval=0, ack_every=1)


def _seal(conn: RudpConnection, frames: list[wire.Frame], pn: int, sender: int = 1) -> bytes:
    keys = wire.SenderKeys(KEY, sender, wire.Protection.AEAD)
    return wire.seal(keys, wire.Header(conn.cid, sender, pn), frames)


def _open(datagram: bytes, sender: int) -> list[wire.Frame]:
    header = wire.pull_header(datagram)
    assert header.sender == sender
    payload = wire.SenderKeys(KEY, sender, wire.Protection.AEAD).open(datagram, header.pn)
    assert payload is not None
    return wire.pull_frames(payload)


def test_several_frames_in_one_datagram_are_handled_in_order() -> None:
    b = RudpConnection(KEY, CONFIG, sender_id=2)
    frames: list[wire.Frame] = [
        wire.Data(0, 0, 0, 2, b"hel"),
        wire.Data(1, 0, 1, 2, b"lo"),
        wire.Ping(),
        wire.Data(2, 0, 0, 1, b"!"),
    ]
    assert b.receive_datagram(_seal(b, frames, pn=0), 0.0)
    events = []
    while (e := b.next_event()) is not None:
        events.append(e)
    assert events == [MessageReceived(b"hello"), MessageReceived(b"!")]
    (ack,) = b.datagrams_to_send(0.0)
    assert _open(ack, 2) == [wire.Ack(3, ())]


def test_payload_is_encrypted_and_the_header_authenticated() -> None:
    a = RudpConnection(KEY, CONFIG, sender_id=1)
    b = RudpConnection(KEY, CONFIG, sender_id=2)
    secret = b"a notification nobody on the path may read"
    a.send_message(secret, 0.0)
    (datagram,) = a.datagrams_to_send(0.0)
    assert secret not in datagram and secret[:8] not in datagram
    assert len(datagram) == wire.DATA_OVERHEAD + len(secret)
    for offset in (1, 5, 12, 17):  # flags, cid, sender id, packet number
        forged = bytearray(datagram)
        forged[offset] ^= 1
        assert not b.receive_datagram(bytes(forged), 0.0)
    assert b.stats.bad_tag + b.stats.unknown_cid + b.stats.malformed == 4
    assert b.receive_datagram(datagram, 0.0)


def test_each_sender_has_its_own_key() -> None:
    """Per-direction keys: a datagram relabelled with the other side's sender id fails."""
    a = RudpConnection(KEY, CONFIG, sender_id=1)
    b = RudpConnection(KEY, CONFIG, sender_id=2)
    a.send_message(b"x", 0.0)
    (datagram,) = a.datagrams_to_send(0.0)
    relabelled = bytearray(datagram)
    relabelled[10:14] = (3).to_bytes(4, "big")
    assert not b.receive_datagram(bytes(relabelled), 0.0)
    assert b.stats.bad_tag == 1


def test_a_path_challenge_is_answered_with_its_token() -> None:
    b = RudpConnection(KEY, CONFIG, sender_id=2)
    assert b.receive_datagram(_seal(b, [wire.PathChallenge(b"12345678")], pn=0), 0.0)
    out = b.datagrams_to_send(0.0)
    assert [_open(d, 2) for d in out] == [[wire.PathResponse(b"12345678")]]
    assert b.stats.path_responses_sent == 1
