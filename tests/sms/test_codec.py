"""SMS codec: UDH byte layout, split/reassemble round-trips (Hypothesis), bad input."""

from __future__ import annotations

import contextlib
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mdeci.sms.codec import (
    SMS_OCTETS,
    AckEntry,
    Sms,
    encode_acks,
    encode_frame,
    max_frame_size,
    parse_acks,
    parse_segment,
    parse_udh,
    segment_payload,
    segments_needed,
)
from mdeci.sms.errors import FrameTooLarge, PduError
from mdeci.sms.reassembly import Completed, Corrupt, Duplicate, Reassembler

DATA, SRC = 16300, 16301


def test_udh_bytes_8bit_reference() -> None:
    pieces = encode_frame(b"x" * 200, ref=0xAB, dst_port=DATA, src_port=SRC)
    assert len(pieces) == 2
    udh, body = pieces[0]
    # UDHL=11; IEI 00 len 3: ref, total, seq; IEI 05 len 4: dst port, src port.
    assert udh == bytes.fromhex("0b 00 03 ab 02 01 05 04 3f ac 3f ad".replace(" ", ""))
    assert len(udh) + len(body) == SMS_OCTETS
    assert pieces[1][0][5] == 2  # seq of the second piece
    assert len(pieces[1][1]) == 204 - 128  # CRC-32 tag (4) + 200, minus the first 128


def test_udh_bytes_16bit_reference() -> None:
    udh, body = encode_frame(b"hi", ref=0x1234, ref16=True, dst_port=DATA, src_port=SRC)[0]
    assert udh == bytes.fromhex("0c08041234010105043fac3fad")
    seg = parse_segment(udh, body)
    assert (seg.ref, seg.ref16, seg.total, seg.seq, seg.dst_port, seg.src_port) == (
        0x1234,
        True,
        1,
        1,
        DATA,
        SRC,
    )


def test_sizes() -> None:
    assert segment_payload(False) == 128 and segment_payload(True) == 127
    assert segments_needed(124) == 1 and segments_needed(125) == 2
    assert segments_needed(0) == 1
    assert max_frame_size() == 255 * 128 - 4
    assert max_frame_size(ref16=True, key=b"k") == 255 * 127 - 8
    encode_frame(b"x" * max_frame_size(), ref=1, dst_port=DATA, src_port=SRC)
    with pytest.raises(FrameTooLarge):
        encode_frame(b"x" * (max_frame_size() + 1), ref=1, dst_port=DATA, src_port=SRC)


def _feed(r: Reassembler, pieces: list[tuple[bytes, bytes]], now: float = 0.0) -> list[object]:
    outcomes: list[object] = []
    for udh, body in pieces:
        out = r.add("+15550001", parse_segment(udh, body), now)
        if out is not None:
            outcomes.append(out)
    return outcomes


@settings(max_examples=60, deadline=None)
@given(
    data=st.data(),
    nseg=st.integers(min_value=1, max_value=255),
    ref16=st.booleans(),
    keyed=st.booleans(),
)
def test_round_trip_any_size_any_order_with_duplicates(
    data: st.DataObject, nseg: int, ref16: bool, keyed: bool
) -> None:
    key = b"k" * 32 if keyed else None
    per = segment_payload(ref16)
    tl = 8 if keyed else 4
    # A frame that needs exactly nseg segments (any length within that count).
    low = max(0, (nseg - 1) * per + 1 - tl)
    size = data.draw(st.integers(min_value=low, max_value=nseg * per - tl), label="size")
    frame = random.Random(size).randbytes(size)
    ref = data.draw(st.integers(0, 0xFFFF if ref16 else 0xFF), label="ref")
    pieces = encode_frame(frame, ref=ref, ref16=ref16, dst_port=DATA, src_port=SRC, key=key)
    assert len(pieces) == nseg
    order = data.draw(st.permutations(range(nseg)), label="order")
    dups = data.draw(st.lists(st.integers(0, nseg - 1), max_size=20), label="dups")
    stream = [pieces[i] for i in order]
    for i, d in enumerate(dups):  # copies anywhere, also after completion
        stream.insert(data.draw(st.integers(0, len(stream)), label=f"at{i}"), pieces[d])
    r = Reassembler(key=key)
    outcomes = _feed(r, stream)
    completed = [o for o in outcomes if isinstance(o, Completed)]
    assert len(completed) == 1
    assert completed[0].frame == frame and completed[0].ref == ref
    assert all(isinstance(o, Duplicate) for o in outcomes if o is not completed[0])
    assert len(r) == 0


def test_reused_reference_is_a_new_buffer_and_mixing_is_caught() -> None:
    r = Reassembler()
    a = encode_frame(b"A" * 300, ref=7, dst_port=DATA, src_port=SRC)
    b = encode_frame(b"B" * 300, ref=7, dst_port=DATA, src_port=SRC)
    assert [type(o) for o in _feed(r, a)] == [Completed]
    # A late copy of a's piece 2 is a duplicate; b's pieces start a new buffer.
    assert [type(o) for o in _feed(r, [a[1]])] == [Duplicate]
    out = _feed(r, [b[0], a[2], b[1]])  # a[2] (old) mixes into b: the tag catches it
    assert [type(o) for o in out] == [Corrupt]
    out = _feed(r, b)  # the sender's retransmission repairs it
    assert [o.frame for o in out if isinstance(o, Completed)] == [b"B" * 300]


def test_incomplete_buffers_expire_and_memory_is_bounded() -> None:
    r = Reassembler(timeout=10, memory=10, max_assemblies=2)
    pieces = [encode_frame(bytes(300), ref=i, dst_port=DATA, src_port=SRC) for i in range(3)]
    for p in pieces:
        _feed(r, p[:1])
    assert len(r) == 2 and r.dropped_incomplete == 1
    assert r.next_expiry() == 10
    r.expire(10)
    assert len(r) == 0 and r.next_expiry() is None


def test_acks_round_trip_and_pack() -> None:
    entries = [AckEntry(i, 3, bytes((i, 1, 2, 3))) for i in range(40)]
    sms = encode_acks(entries, dst_port=SRC, src_port=DATA)
    assert len(sms) == 3  # 18 entries of 7 octets fit behind a 7-octet UDH
    assert all(len(u) + len(b) <= SMS_OCTETS for u, b in sms)
    assert [e for _, b in sms for e in parse_acks(b)] == entries
    with pytest.raises(PduError):
        parse_acks(b"\x00\x01")


@pytest.mark.parametrize(
    "udh",
    [
        b"",
        b"\x05\x00\x03\x01",  # UDHL too long
        b"\x03\x00\x05\x01",  # IE overruns
        b"\x01\x00",  # truncated IE
        bytes.fromhex("0b0003ab020305043fac3fad"),  # seq 3 of 2
        bytes.fromhex("0b0003ab000105043fac3fad"),  # total 0
        bytes.fromhex("06050400010002"),  # port but no concatenation
        bytes.fromhex("050003ab0101"),  # concatenation but no port
        bytes.fromhex("0b0002ab0205043fac3fad00"),  # bad concat IE length
    ],
)
def test_bad_headers_raise_pdu_error(udh: bytes) -> None:
    with pytest.raises(PduError):
        parse_segment(udh, b"data")


@given(st.binary(max_size=40), st.binary(max_size=20))
def test_parse_or_pdu_error(udh: bytes, body: bytes) -> None:
    with contextlib.suppress(PduError):
        parse_segment(udh, body)
    with contextlib.suppress(PduError):
        parse_udh(udh)


def test_sms_is_at_most_140_octets() -> None:
    Sms("a", "b", b"", bytes(140))
    with pytest.raises(PduError):
        Sms("a", "b", b"\x00", bytes(140))
