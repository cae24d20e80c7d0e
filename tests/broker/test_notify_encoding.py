"""The broker's notify frames built from stored rows (core._NotifyEncoder) are byte for
byte what ``encode(Notify(...))`` gives, the ack fast path decodes as ``decode``, and the
pub-ok fast path encodes as ``encode``."""

from __future__ import annotations

import cbor2
from hypothesis import given, settings
from hypothesis import strategies as st

from mdeci.broker.core import _NotifyEncoder
from mdeci.broker.service import decode_fast, encode_reply
from mdeci.errors import FrameError
from mdeci.frames import UINT63, Ack, Notify, Pub, PubOk, SubOk, decode, encode
from mdeci.store.queues import QueuedNotification

NAMES = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,8}", fullmatch=True)
VALUES = st.one_of(
    st.booleans(),
    st.integers(-(2**63), UINT63),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
)
IDS = st.from_regex(r"[A-Za-z0-9_.-]{1,16}", fullmatch=True)
SUBJECTS = st.lists(st.from_regex(r"[a-z0-9]{1,6}", fullmatch=True), min_size=1, max_size=4)


@settings(max_examples=300, deadline=None)
@given(
    nseq=st.integers(1, UINT63),
    sub_id=st.integers(1, UINT63),
    words=SUBJECTS,
    msg_id=IDS,
    published_at=st.floats(0, 4e9, allow_nan=False),
    attrs=st.dictionaries(NAMES, VALUES, max_size=5),
    payload=st.binary(max_size=300),
    missed=st.integers(0, UINT63),
)
def test_rows_encode_as_encode_does(
    nseq: int,
    sub_id: int,
    words: list[str],
    msg_id: str,
    published_at: float,
    attrs: dict[str, str | int | float | bool],
    payload: bytes,
    missed: int,
) -> None:
    subject = ".".join(words)
    row = QueuedNotification(
        "sip:u@x", nseq, sub_id, "sip:p@x", msg_id, subject, cbor2.dumps(attrs), payload,
        False, published_at,
    )  # fmt: skip
    expected = encode(
        Notify(
            nseq=nseq,
            sub_id=str(sub_id),
            subject=subject,
            msg_id=msg_id,
            published_at=published_at,
            attrs=attrs,
            payload=payload,
            missed=missed,
        )
    )
    encoder = _NotifyEncoder()
    assert encoder.encode(row, missed) == expected
    # The second recipient of the same publication takes the shared items.
    again = QueuedNotification(
        "sip:v@x", nseq, sub_id, "sip:p@x", msg_id, subject, cbor2.dumps(attrs), payload,
        False, published_at,
    )  # fmt: skip
    assert encoder.encode(again, missed) == expected


def test_a_row_that_is_not_ours_takes_the_checked_path() -> None:
    row = QueuedNotification(
        "sip:u@x", 1, 1, "sip:p@x", "m", "a.b", b"\x01", b"", False, 1.0
    )  # attrs that are not a map
    assert _NotifyEncoder().encode(row, 0) is None


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
