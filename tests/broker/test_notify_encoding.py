"""The codec's short cuts (mdeci.frames.codec) agree with its general functions: notify
frames built from stored rows (``NotifyEncoder``, ``notify_bytes``) are byte for byte
what ``encode(Notify(...))`` gives, the ack and pub fast paths decode as ``decode``, and
the pub-ok fast path encodes as ``encode``."""

from __future__ import annotations

import cbor2
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from mdeci.errors import FrameError
from mdeci.frames import (
    MAX_FRAME_BYTES,
    UINT63,
    Ack,
    Notify,
    NotifyEncoder,
    Pub,
    PubOk,
    SubOk,
    decode,
    decode_fast,
    encode,
    encode_reply,
    notify_bytes,
)
from mdeci.store.queues import DeliveryRow

NAMES = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,8}", fullmatch=True)
VALUES = st.one_of(
    st.booleans(),
    st.integers(-(2**63), UINT63),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
)
IDS = st.from_regex(r"[A-Za-z0-9_.-]{1,16}", fullmatch=True)
SUBJECTS = st.lists(st.from_regex(r"[a-z0-9]{1,6}", fullmatch=True), min_size=1, max_size=4)


def _expected(row: DeliveryRow, attrs: object, missed: int) -> bytes:
    nseq, sub_id, _, msg_id, subject, _, payload, published_at = row
    return encode(
        Notify(
            nseq=nseq,
            sub_id=str(sub_id),
            subject=subject,
            msg_id=msg_id,
            published_at=published_at,
            attrs=attrs,  # type: ignore[arg-type]
            payload=payload,
            missed=missed,
        )
    )


@settings(max_examples=400, deadline=None)
@given(
    nseq=st.integers(1, UINT63),
    sub_id=st.integers(1, UINT63),
    words=SUBJECTS,
    msg_id=st.text(min_size=1, max_size=128),
    published_at=st.floats(min_value=0.0, allow_nan=False, allow_infinity=False),
    attrs=st.dictionaries(NAMES, VALUES, max_size=5),
    payload=st.binary(max_size=300),
    missed=st.integers(0, UINT63),
    share=st.booleans(),
)
@example(1, 1, ["a"], "m", 0.0, {}, b"", 0, False)
@example(23, 24, ["a"], "m" * 23, -0.0, {}, b"p" * 23, 23, True)
@example(24, 255, ["a"], "m" * 24, 1e300, {}, b"p" * 24, 24, False)
@example(255, 256, ["a"], "\u00e9" * 128, 5e-324, {}, b"p" * 255, 255, True)
@example(256, 65535, ["a"], "m" * 128, 1.7e9, {}, b"p" * 256, 256, False)
@example(65535, 65536, ["a"], "m", 1.7e9, {}, b"p" * 65535, 65535, True)
@example(65536, 2**32 - 1, ["a"], "m", 1.7e9, {}, b"p" * 65536, 65536, False)
@example(2**32 - 1, 2**32, ["a"], "m", 1.7e9, {"k": 1}, b"", 2**32 - 1, True)
@example(2**32, UINT63, ["a"], "m", 1.7e9, {}, b"", 2**32, False)
@example(UINT63, 1, ["a"], "m", 1.7e9, {}, b"", UINT63, True)
def test_rows_encode_as_encode_does(
    nseq: int,
    sub_id: int,
    words: list[str],
    msg_id: str,
    published_at: float,
    attrs: dict[str, str | int | float | bool],
    payload: bytes,
    missed: int,
    share: bool,
) -> None:
    """Every CBOR head size (the encoder writes heads itself), both ways of sharing."""
    subject = ".".join(words)
    row = (nseq, sub_id, "sip:p@x", msg_id, subject, cbor2.dumps(attrs), payload, published_at)
    expected = _expected(row, attrs, missed)
    encoder = NotifyEncoder(share=share)
    assert encoder.encode(row, missed) == expected
    # The checked path (the core's for rows the short cut declines, the SMS side's).
    assert notify_bytes(row, missed) == expected
    assert notify_bytes(row, lambda: missed) == expected
    # The second recipient of the same publication takes the shared items.
    assert encoder.encode(row, missed) == expected
    # Another row of the same subscription and subject (the encodings kept per batch).
    other = (nseq, sub_id, "sip:p@x", msg_id + "2", subject, b"\xa0", b"", 2.5)
    if len(msg_id) < 128:
        assert encoder.encode(other, 0) == _expected(other, {}, 0)


@pytest.mark.parametrize("share", [False, True])
def test_a_row_that_is_not_ours_takes_the_checked_path(share: bool) -> None:
    good = (1, 1, "sip:p@x", "m", "a.b", b"\xa0", b"", 1.0)
    for i, value in [
        (5, b"\x01"),  # attrs that are not a map
        (5, b"\xff"),  # nor CBOR
        (5, "\xa0"),  # nor bytes
        (6, "payload"),  # a payload that is not bytes
        (6, memoryview(b"p")),
        (7, 1),  # published_at not a float
        (7, float("nan")),  # nor a time Notify takes
        (7, float("inf")),
        (7, -1.0),
        (3, "\udc80"),  # a msg_id that is not UTF-8
        (3, 5),
        (3, ""),  # a msg_id Notify refuses: empty, over 128 characters
        (3, "m" * 129),
        (0, 0),  # an nseq Notify refuses
        (0, -3),
        (4, None),
    ]:
        row = (*good[:i], value, *good[i + 1 :])
        assert NotifyEncoder(share=share).encode(row, 0) is None, (i, value)  # type: ignore[arg-type]
    assert NotifyEncoder(share=share).encode(good, 0) == _expected(good, {}, 0)


def test_a_msg_id_published_again_after_the_horizon_is_another_publication() -> None:
    """Once the sweep forgot a (publisher, msg_id) (queue.dedup_horizon), the same pair
    can be published again and both publications be queued: a fan-out batch must not
    hand the first one's subject, payload and time to the second one's rows."""
    first = (1, 1, "sip:p@x", "m1", "a.x", b"\xa0", b"old", 1_700_000_000.0)
    again = (2, 1, "sip:p@x", "m1", "a.y", b"\xa0", b"new", 1_700_000_200.0)
    encoder = NotifyEncoder(share=True)
    assert encoder.encode(first, 0) == _expected(first, {}, 0)
    assert encoder.encode(again, 0) == _expected(again, {}, 0)
    bob = (1, 2, *again[2:])  # another recipient of the second publication
    assert encoder.encode(bob, 0) == _expected(bob, {}, 0)


@pytest.mark.parametrize("share", [False, True])
def test_attrs_stored_as_another_empty_map_are_left_out_as_encode_does(share: bool) -> None:
    row = (1, 1, "sip:p@x", "m", "a.b", b"\xbf\xff", b"", 1.0)  # {} of indefinite length
    assert NotifyEncoder(share=share).encode(row, 0) == _expected(row, {}, 0)


@pytest.mark.parametrize("share", [False, True])
def test_a_frame_over_the_limit_takes_the_checked_path(share: bool) -> None:
    row = (1, 1, "sip:p@x", "m", "a.b", b"\xa0", b"p" * MAX_FRAME_BYTES, 1.0)
    assert NotifyEncoder(share=share).encode(row, 0) is None


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.integers(0, UINT63).map(lambda n: encode(Ack(upto=n))), st.binary(max_size=20)))
def test_ack_fast_path_decodes_as_decode(data: bytes) -> None:
    try:
        expected: object = decode(data)
    except FrameError as exc:
        expected = ("error", exc.code, str(exc))
    try:
        got: object = decode_fast(data)
    except FrameError as exc:
        got = ("error", exc.code, str(exc))
    assert got == expected


def test_ack_fast_path_edges() -> None:
    for n in (0, 23, 24, 255, 256, 65535, 65536, 2**32 - 1, 2**32, UINT63):
        assert decode_fast(encode(Ack(upto=n))) == Ack(upto=n)
    prefix = encode(Ack(upto=0))[:-1]
    for tail in (b"\x1b" + (2**63).to_bytes(8, "big"), b"\x18\x05", b"\x05\x00", b"\x19"):
        try:
            expected: object = decode(prefix + tail)
        except FrameError as exc:
            expected = ("error", exc.code, str(exc))
        try:
            got: object = decode_fast(prefix + tail)
        except FrameError as exc:
            got = ("error", exc.code, str(exc))
        assert got == expected


@settings(max_examples=300, deadline=None)
@given(
    req=st.integers(0, UINT63),
    msg_id=st.text(min_size=1, max_size=128),
    matched=st.integers(0, UINT63),
)
def test_pub_ok_encodes_as_encode_does(req: int, msg_id: str, matched: int) -> None:
    frame = PubOk(req=req, msg_id=msg_id, matched=matched)
    assert encode_reply(frame) == encode(frame)


def test_other_replies_take_encode() -> None:
    frame = SubOk(req=3, sub_id="7", expires_at=12.5)
    assert encode_reply(frame) == encode(frame)


def _decoded(fn: object, data: bytes) -> object:
    assert callable(fn)
    try:
        return fn(data)
    except FrameError as exc:
        return ("error", exc.code, exc.req, str(exc))


PUBS = st.builds(
    Pub,
    req=st.integers(0, UINT63),
    msg_id=IDS,
    subject=SUBJECTS.map(".".join),
    payload=st.binary(max_size=300),
    urgent=st.booleans(),
)


@settings(max_examples=300, deadline=None)
@given(pub=PUBS, cut=st.integers(0, 400), junk=st.binary(max_size=8))
def test_pub_fast_path_decodes_as_decode(pub: Pub, cut: int, junk: bytes) -> None:
    data = encode(pub)
    assert decode_fast(data) == pub
    # Cut, extended or altered in one byte: the same frame or the same error.
    for variant in (data[:cut], data + junk, data[:cut] + junk + data[cut + len(junk) :]):
        assert _decoded(decode_fast, variant) == _decoded(decode, variant)


def test_pub_fast_path_edges() -> None:
    head = encode(Pub(req=1, msg_id="m", subject="a.b"))
    good = encode(Pub(req=2**40, msg_id="m" * 128, subject="a." * 30 + "b", payload=b"x" * 70000))
    assert decode_fast(good) == decode(good)
    bad = [
        head.replace(b"\x01", b"\x18\x01", 1),  # non-minimal req: the same value
        head[:-3] + b"\x63\xed\xa0\x80",  # a surrogate in the subject
        encode(Pub(req=1, msg_id="m", subject="a.b", payload=b"p"))[:-2] + b"\x5f\x41p\xff",
        b"\xa4" + head[1:].replace(b"\x01", b"\x1b" + (2**63).to_bytes(8, "big"), 1),
        head.replace(b"a.b", b"a.*", 1),  # a pattern: refused by Pub
        head.replace(b"\x61m", b"\x60", 1),  # an empty msg_id
    ]
    for data in bad:
        assert _decoded(decode_fast, data) == _decoded(decode, data)


@pytest.mark.parametrize("attrs", [b"\x01", b"\xff", b"\xa1\x01\x02"])
def test_checked_path_refuses_rows_no_notify_can_carry(attrs: bytes) -> None:
    row = (1, 1, "sip:p@x", "m", "a.b", attrs, b"", 1.0)
    with pytest.raises(FrameError):
        notify_bytes(row)
