"""The SMS link on a hand-stepped clock: timers double, acks match, junk is counted."""

from __future__ import annotations

import pytest

from mdeci.sms.codec import AckEntry, Sms, encode_acks
from mdeci.sms.config import SmsConfig
from mdeci.sms.dedupe import NseqGate
from mdeci.sms.errors import FrameTooLarge, NoFreeReference, SmsError
from mdeci.sms.link import BufferAcknowledged, BufferExpired, FrameReceived, SmsLink

A, B = "+1000", "+2000"
CFG = SmsConfig(ack_timeout=10.0, ack_timeout_max=40.0)


def _events(link: SmsLink) -> list[object]:
    out = []
    while (ev := link.next_event()) is not None:
        out.append(ev)
    return out


def test_resend_timer_doubles_up_to_max_then_ttl_expires() -> None:
    a = SmsLink(A, CFG)
    bid = a.send_frame(B, b"x" * 300, 0.0, ttl=200.0)
    assert len(a.sms_to_send()) == 3
    fire_times = []
    now = 0.0
    while (t := a.get_timer()) is not None:
        now = t
        a.handle_timer(now)
        fire_times.append(now)
        assert len(a.sms_to_send()) in (0, 3)
    # 10, then +20, +40, +40 (capped) ... until the TTL at 200.
    assert fire_times == [10.0, 30.0, 70.0, 110.0, 150.0, 190.0, 200.0]
    assert _events(a) == [BufferExpired(bid, B, 3 * 7)]
    assert a.pending() == []


def test_frame_ack_and_duplicate_reack() -> None:
    a, b = SmsLink(A, CFG), SmsLink(B, CFG)
    bid = a.send_frame(B, b"hello", 0.0)
    (seg,) = a.sms_to_send()
    assert (seg.sender, seg.recipient) == (A, B)
    b.receive_sms(seg, 1.0)
    assert _events(b) == [FrameReceived(A, b"hello")]
    (ack,) = b.sms_to_send()
    b.receive_sms(seg, 2.0)  # a copy: acknowledged again, not delivered again
    assert _events(b) == [] and b.stats.duplicates == 1
    (ack2,) = b.sms_to_send()
    assert ack2 == ack
    a.receive_sms(ack, 3.0)
    assert _events(a) == [BufferAcknowledged(bid, B, 1, 0.0, 3.0)]
    a.receive_sms(ack2, 4.0)
    assert _events(a) == [] and a.stats.stale_acks == 1
    assert a.get_timer() is None


def test_ack_for_an_older_buffer_with_the_same_reference_is_ignored() -> None:
    a = SmsLink(A, SmsConfig(ack_timeout=10.0))
    first = a.send_frame(B, b"one", 0.0)
    a.sms_to_send()
    a.cancel(first)
    a.send_frame(B, b"two", 0.0)
    (seg,) = a.sms_to_send()
    # An ack naming reference 0 with the first buffer's tag (CRC-32 of b"one").
    import zlib

    ((udh, body),) = encode_acks(
        [AckEntry(0, 1, zlib.crc32(b"one").to_bytes(4, "big"))],
        dst_port=CFG.ack_port,
        src_port=CFG.data_port,
    )
    a.receive_sms(Sms(B, A, udh, body), 1.0)
    assert _events(a) == [] and a.stats.stale_acks == 1
    assert seg.udh[3] == 1  # the second buffer took the next reference


def test_references_run_out_and_frames_too_large() -> None:
    a = SmsLink(A, CFG)
    for _ in range(256):
        a.send_frame(B, b"x", 0.0)
    with pytest.raises(NoFreeReference):
        a.send_frame(B, b"x", 0.0)
    a.send_frame("+3000", b"x", 0.0)  # another peer has its own references
    with pytest.raises(FrameTooLarge):
        a.send_frame(B, bytes(40000), 0.0)


def test_foreign_sms_are_counted_and_dropped() -> None:
    b = SmsLink(B, CFG)
    b.receive_sms(Sms(A, B, b"", b"Hi, dinner at 8?"), 0.0)
    b.receive_sms(Sms(A, B, b"\x06\x05\x04\x00\x01\x00\x02", b"other app"), 0.0)
    b.receive_sms(Sms(A, B, b"\x07", b"junk"), 0.0)
    assert b.stats.foreign == 3 and _events(b) == [] and b.sms_to_send() == []


def test_keyed_links_refuse_unkeyed_frames() -> None:
    key = bytes(range(32))
    a, b = SmsLink(A, SmsConfig(key=key)), SmsLink(B, SmsConfig(key=key))
    evil = SmsLink(A)
    evil.send_frame(B, b"forged", 0.0)
    for sms in evil.sms_to_send():
        b.receive_sms(sms, 0.0)
    assert _events(b) == [] and b.stats.corrupt == 1
    a.send_frame(B, b"real", 0.0)
    for sms in a.sms_to_send():
        b.receive_sms(sms, 0.0)
    assert _events(b) == [FrameReceived(A, b"real")]


def test_config_validation() -> None:
    with pytest.raises(SmsError):
        SmsConfig(data_port=1, ack_port=1)
    with pytest.raises(SmsError):
        SmsConfig(ack_timeout=10, ack_timeout_max=5)


def test_nseq_gate_strict_and_windowed() -> None:
    strict = NseqGate()
    assert [strict.accept(n) for n in (1, 3, 2, 3, 4)] == [True, True, False, False, True]
    gate = NseqGate(window=4)
    assert [gate.accept(n) for n in (1, 3, 2, 3, 8, 5, 4, 4, 9)] == [
        True,
        True,
        True,
        False,
        True,
        True,
        False,
        False,
        True,
    ]
    # 4 is at the window edge once 8 arrived (8 - 4); the state to persist:
    assert (gate.highest == 9 and gate.recent == (8, 9)) or gate.recent == (5, 8, 9)
    again = NseqGate(gate.highest, window=4, recent=gate.recent)
    assert not again.accept(8) and again.accept(7) and not again.accept(7)
    with pytest.raises(ValueError):
        NseqGate(window=-1)


def test_sms_tariff_bills_what_the_link_sends() -> None:
    from mdeci.sms import sms_tariff

    for key in (None, b"k" * 32):
        cfg = SmsConfig(key=key)
        tariff = sms_tariff(0.0015, cfg)
        for size in (0, 1, 100, 124, 125, 300, 5000):
            link = SmsLink(A, cfg)
            link.send_frame(B, bytes(size), 0.0)
            assert tariff.cost(size) == pytest.approx(0.0015 * len(link.sms_to_send()))
