"""The SMS link on a hand-stepped clock: timers double, acks match, junk is counted."""

from __future__ import annotations

import pytest

from mdeci.sms.codec import AckEntry, Sms, encode_acks
from mdeci.sms.config import SmsConfig
from mdeci.sms.dedupe import NseqGate
from mdeci.sms.errors import FrameTooLarge, NoFreeReference, SmsError
from mdeci.sms.link import BufferAcknowledged, BufferExpired, FrameReceived, SmsLink

A, B = "+1000", "+2000"
CFG = SmsConfig(ack_timeout=10.0, ack_timeout_max=40.0, first_part_ack=False)
STEPPED = SmsConfig(ack_timeout=10.0, ack_timeout_max=40.0)  # first part acked first


def _exchange(a: SmsLink, b: SmsLink, now: float) -> int:
    """Carry every SMS between ``a`` and ``b`` until both are quiet; SMS ``a`` sent."""
    sent = 0
    while True:
        out_a, out_b = a.sms_to_send(), b.sms_to_send()
        if not out_a and not out_b:
            return sent
        sent += len(out_a)
        for sms in out_a:
            b.receive_sms(sms, now)
        for sms in out_b:
            a.receive_sms(sms, now)


def _events(link: SmsLink) -> list[object]:
    out: list[object] = []
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
            link, peer = SmsLink(A, cfg), SmsLink(B, cfg)
            link.send_frame(B, bytes(size), 0.0)
            assert tariff.cost(size) == pytest.approx(0.0015 * _exchange(link, peer, 0.0))


def test_defaults_are_the_thesis_timers() -> None:
    cfg = SmsConfig()
    assert (cfg.ack_timeout, cfg.first_part_ack) == (200.0, True)


def test_first_part_is_acked_before_the_rest_is_sent() -> None:
    a, b = SmsLink(A, STEPPED), SmsLink(B, STEPPED)
    frame = bytes(range(256)) * 2  # 5 segments
    bid = a.send_frame(B, frame, 0.0)
    (first,) = a.sms_to_send()  # segment 1 alone
    # Unanswered: only segment 1 again, at 10 then +20 (doubling).
    a.handle_timer(10.0)
    assert a.sms_to_send() == [first]
    assert a.get_timer() == 30.0
    b.receive_sms(first, 12.0)
    assert _events(b) == []
    (part_ack,) = b.sms_to_send()
    a.receive_sms(part_ack, 13.0)
    rest = a.sms_to_send()
    assert len(rest) == 4 and first not in rest
    assert a.get_timer() == 23.0  # the wait starts again at ack_timeout
    a.receive_sms(part_ack, 14.0)  # a repeated part ack sends nothing more
    assert a.sms_to_send() == []
    for sms in rest:
        b.receive_sms(sms, 15.0)
    assert _events(b) == [FrameReceived(A, frame)]
    (ack,) = b.sms_to_send()
    a.receive_sms(ack, 16.0)
    assert _events(a) == [BufferAcknowledged(bid, B, 6, 0.0, 16.0)]
    assert a.get_timer() is None


def test_after_the_part_ack_a_resend_carries_every_segment() -> None:
    a, b = SmsLink(A, STEPPED), SmsLink(B, STEPPED)
    a.send_frame(B, bytes(300), 0.0)  # 3 segments
    (first,) = a.sms_to_send()
    b.receive_sms(first, 1.0)
    a.receive_sms(b.sms_to_send()[0], 2.0)
    assert len(a.sms_to_send()) == 2  # the rest, lost on the way
    a.handle_timer(12.0)
    assert len(a.sms_to_send()) == 3  # the receiver may have dropped segment 1 since
    assert a.get_timer() == 32.0


def test_a_part_ack_for_no_buffer_is_stale() -> None:
    a = SmsLink(A, STEPPED)
    udh, body = encode_acks([AckEntry(5, 0, b"abcd")], dst_port=16301, src_port=16300)[0]
    a.receive_sms(Sms(B, A, udh, body), 0.0)
    assert a.stats.stale_acks == 1 and _events(a) == []


def test_a_single_segment_frame_needs_no_part_ack() -> None:
    a, b = SmsLink(A, STEPPED), SmsLink(B, STEPPED)
    a.send_frame(B, b"short", 0.0)
    (only,) = a.sms_to_send()
    b.receive_sms(only, 1.0)
    assert _events(b) == [FrameReceived(A, b"short")]
