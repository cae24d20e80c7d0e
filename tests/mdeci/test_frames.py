"""Application frames: validation, exact bytes, round trips, and 'frame or FrameError'."""

from __future__ import annotations

import math
from typing import Any

import cbor2
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mdeci.errors import FrameError, MdeciError
from mdeci.frames import (
    FRAME_TYPES,
    MAX_FRAME_BYTES,
    Ack,
    Calendar,
    CalendarRule,
    Device,
    Error,
    Frame,
    List,
    NetworkBest,
    Notify,
    Pub,
    PubOk,
    Renew,
    Sub,
    SubInfo,
    SubOk,
    Subs,
    Unsub,
    decode,
    encode,
)

# ---------------------------------------------------------------------------------------
# Strategies
# ---------------------------------------------------------------------------------------

ids = st.text(min_size=1, max_size=40)
reqs = st.integers(0, 2**63 - 1)
times = st.floats(0, 4e9, allow_nan=False, allow_infinity=False)
word = st.text(
    alphabet=st.characters(blacklist_characters=".*#", blacklist_categories=("Z", "C")),
    min_size=1,
    max_size=8,
)
subjects = st.lists(word, min_size=1, max_size=5).map(".".join)
patterns = st.lists(st.one_of(word, st.sampled_from(["*", "#"])), min_size=1, max_size=5).map(
    ".".join
)
attr_names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,15}", fullmatch=True)
attr_values = st.one_of(
    st.text(max_size=20),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.booleans(),
)
attrs = st.dictionaries(attr_names, attr_values, max_size=6)
filters = st.text(max_size=30)

frames: st.SearchStrategy[Frame] = st.one_of(
    st.builds(
        Sub,
        req=reqs,
        subject=patterns,
        filter=filters,
        ttl=st.none() | st.integers(1, 10**9),
        in_order=st.booleans(),
    ),
    st.builds(SubOk, req=reqs, sub_id=ids, expires_at=times, ttl=st.none() | times),
    st.builds(Unsub, req=reqs, sub_id=ids),
    st.builds(Renew, req=reqs, sub_id=ids, ttl=st.none() | st.integers(1, 10**9)),
    st.builds(List, req=reqs),
    st.builds(
        Subs,
        req=reqs,
        items=st.lists(
            st.builds(SubInfo, sub_id=ids, subject=patterns, filter=filters, expires_at=times),
            max_size=3,
        ).map(tuple),
    ),
    st.builds(
        Pub,
        req=reqs,
        msg_id=ids,
        subject=subjects,
        attrs=attrs,
        payload=st.binary(max_size=40),
        urgent=st.booleans(),
    ),
    st.builds(PubOk, req=reqs, msg_id=ids, matched=st.integers(0, 2**63 - 1)),
    st.builds(
        Notify,
        nseq=st.integers(1, 2**63 - 1),
        sub_id=ids,
        subject=subjects,
        msg_id=ids,
        published_at=times,
        attrs=attrs,
        payload=st.binary(max_size=40),
        missed=st.integers(0, 1000),
    ),
    st.builds(Ack, upto=st.integers(0, 2**63 - 1)),
    st.builds(
        Device,
        network=st.sampled_from(["", "wifi", "cellular"]),
        best=st.lists(
            st.builds(
                NetworkBest,
                network=st.sampled_from(["wifi", "cellular"]),
                latency_ms=st.floats(0.5, 1e5),
                coverage=st.floats(0.01, 1.0),
            ),
            max_size=3,
        ).map(tuple),
        battery=st.sampled_from([-1.0, 0.0, 0.5, 1.0]),
    ),
    st.builds(
        Calendar,
        req=reqs,
        rules=st.lists(
            st.one_of(
                st.builds(
                    CalendarRule,
                    channel=st.sampled_from(["wifi", "cellular", "sms"]),
                    p=st.floats(0.0, 1.0),
                    weekdays=st.integers(1, 0x7F),
                    start_hour=st.integers(0, 12),
                    end_hour=st.integers(12, 24),
                ),
                st.builds(
                    lambda ch, p, at, span: CalendarRule(
                        channel=ch, p=p, start_at=at, end_at=at + span
                    ),
                    st.sampled_from(["wifi", "cellular"]),
                    st.floats(0.0, 1.0),
                    times,
                    st.floats(1.0, 1e6),
                ),
            ),
            max_size=4,
        ).map(tuple),
        utc_offset_minutes=st.integers(-840, 840),
    ),
    st.builds(
        Error,
        req=st.none() | reqs,
        code=st.integers(100, 699),
        message=st.text(max_size=40),
    ),
)


# ---------------------------------------------------------------------------------------
# Properties
# ---------------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(frames)
def test_decode_encode_round_trip(frame: Frame) -> None:
    data = encode(frame)
    back = decode(data)
    assert back == frame
    assert type(back) is type(frame)
    # op is the first key of the map on the wire
    assert next(iter(cbor2.loads(data))) == "op"


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes_give_a_frame_or_frame_error(data: bytes) -> None:
    try:
        frame = decode(data)
    except FrameError as exc:
        assert exc.code in (400, 413)
        assert str(exc) and "\n" not in str(exc)
    else:
        assert type(frame) in FRAME_TYPES.values()


cbor_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats()
    | st.text(max_size=10)
    | st.binary(max_size=10),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(sorted(FRAME_TYPES)),
    st.dictionaries(
        st.sampled_from(
            [
                "req",
                "subject",
                "filter",
                "ttl",
                "sub_id",
                "expires_at",
                "items",
                "msg_id",
                "attrs",
                "payload",
                "urgent",
                "matched",
                "nseq",
                "published_at",
                "missed",
                "upto",
                "code",
                "message",
                "zz",
            ]
        ),
        cbor_values,
    ),
)
def test_plausible_maps_give_a_frame_or_frame_error(op: str, body: dict[str, Any]) -> None:
    """Maps with the right op and keys but random values: validation catches every type."""
    try:
        frame = decode(cbor2.dumps({"op": op, **body}))
    except FrameError:
        return
    assert frame.op == op
    assert decode(encode(frame)) == frame


@settings(max_examples=200, deadline=None)
@given(frames, st.data())
def test_truncated_frames_raise_frame_error(frame: Frame, data: st.DataObject) -> None:
    raw = encode(frame)
    cut = data.draw(st.integers(0, len(raw) - 1))
    with pytest.raises(FrameError):
        decode(raw[:cut])


# ---------------------------------------------------------------------------------------
# Exact bytes and defaults
# ---------------------------------------------------------------------------------------


def test_exact_bytes_of_a_minimal_sub() -> None:
    # {"op": "sub", "req": 1, "subject": "a.*"}: defaults (filter "", ttl None) omitted
    assert encode(Sub(req=1, subject="a.*")) == bytes.fromhex(
        "a3626f70637375626372657101677375626a65637463612e2a"
    )


def test_ack_bytes() -> None:
    assert encode(Ack(upto=7)) == bytes.fromhex("a2626f706361636b647570746f07")


def test_defaults_are_omitted_and_restored() -> None:
    pub = Pub(req=2, msg_id="m", subject="s")
    assert cbor2.loads(encode(pub)) == {"op": "pub", "req": 2, "msg_id": "m", "subject": "s"}
    assert decode(encode(pub)) == pub
    full = Sub(req=3, subject="x", filter="a == 1", ttl=60)
    assert cbor2.loads(encode(full)) == {
        "op": "sub",
        "req": 3,
        "subject": "x",
        "filter": "a == 1",
        "ttl": 60,
    }
    ordered = Sub(req=3, subject="x", in_order=True)
    assert cbor2.loads(encode(ordered))["in_order"] is True
    assert decode(encode(ordered)) == ordered


def test_notify_missed_only_on_the_wire_when_nonzero() -> None:
    n = Notify(nseq=5, sub_id="s1", subject="a.b", msg_id="m", published_at=1.5, missed=0)
    assert "missed" not in cbor2.loads(encode(n))
    n2 = Notify(nseq=5, sub_id="s1", subject="a.b", msg_id="m", published_at=1.5, missed=3)
    assert cbor2.loads(encode(n2))["missed"] == 3


def test_error_without_req() -> None:
    e = Error(code=400, message="bad")
    assert cbor2.loads(encode(e)) == {"op": "error", "code": 400, "message": "bad"}


def test_times_are_normalised_to_float() -> None:
    ok = SubOk(req=1, sub_id="s", expires_at=10)
    assert isinstance(ok.expires_at, float)
    assert decode(encode(ok)) == ok


def test_frames_are_immutable() -> None:
    src = {"a": 1}
    pub = Pub(req=1, msg_id="m", subject="s", attrs=src)
    src["a"] = 2  # the caller's dict does not leak into the frame
    assert pub.attrs["a"] == 1
    with pytest.raises(TypeError):
        pub.attrs["b"] = 3  # type: ignore[index]
    with pytest.raises(AttributeError):
        pub.req = 9  # type: ignore[misc]


def test_subs_accepts_a_list_and_stores_a_tuple() -> None:
    item = SubInfo(sub_id="1", subject="a.#", filter="", expires_at=1.0)
    subs = Subs(req=1, items=[item])  # type: ignore[arg-type]
    assert subs.items == (item,)


# ---------------------------------------------------------------------------------------
# Validation on construction
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("build", "fragment"),
    [
        (lambda: Sub(req=-1, subject="a"), "req out of range"),
        (lambda: Sub(req=True, subject="a"), "req must be an integer"),
        (lambda: Sub(req=2**63, subject="a"), "req out of range"),
        (lambda: Sub(req=1, subject="a..b"), "empty word"),
        (lambda: Sub(req=1, subject="a*"), "whole word"),
        (lambda: Sub(req=1, subject="a", ttl=0), "ttl out of range"),
        (lambda: Sub(req=1, subject="a", filter="x" * 5000), "filter must be"),
        (lambda: Pub(req=1, msg_id="m", subject="a.*"), "no wildcards"),
        (lambda: Pub(req=1, msg_id="", subject="a"), "msg_id must be 1..128"),
        (lambda: Pub(req=1, msg_id="m", subject="a", attrs={"1x": 1}), "attribute name"),
        (lambda: Pub(req=1, msg_id="m", subject="a", attrs={"x": None}), "must be text"),  # type: ignore[dict-item]
        (lambda: Pub(req=1, msg_id="m", subject="a", attrs={"x": [1]}), "must be text"),  # type: ignore[dict-item]
        (lambda: Pub(req=1, msg_id="m", subject="a", attrs={"x": math.nan}), "finite"),
        (lambda: Pub(req=1, msg_id="m", subject="a", attrs={"x": 2**64}), "64-bit"),
        (
            lambda: Pub(req=1, msg_id="m", subject="a", attrs={f"k{i}": i for i in range(65)}),
            "more than 64",
        ),
        (lambda: Pub(req=1, msg_id="m", subject="a", payload="text"), "byte string"),  # type: ignore[arg-type]
        (lambda: Pub(req=1, msg_id="m", subject="a", urgent=1), "boolean"),  # type: ignore[arg-type]
        (lambda: SubOk(req=1, sub_id="s", expires_at=-1), "finite time"),
        (lambda: SubOk(req=1, sub_id="s", expires_at=math.inf), "finite time"),
        (lambda: SubOk(req=1, sub_id="s", expires_at="x"), "number of seconds"),  # type: ignore[arg-type]
        (lambda: Notify(nseq=0, sub_id="s", subject="a", msg_id="m", published_at=0), "nseq"),
        (lambda: Ack(upto=-1), "upto out of range"),
        (lambda: Error(code=99, message="x"), "code out of range"),
        (lambda: Error(code=400, message="x" * 2000), "message must be"),
        (lambda: Subs(req=1, items=("x",)), "SubInfo"),  # type: ignore[arg-type]
        (lambda: Subs(req=1, items="x"), "must be a list"),  # type: ignore[arg-type]
    ],
)
def test_construction_validates(build: Any, fragment: str) -> None:
    with pytest.raises(FrameError, match=None) as info:
        build()
    assert fragment in str(info.value)
    assert isinstance(info.value, MdeciError)


# ---------------------------------------------------------------------------------------
# Decoding errors
# ---------------------------------------------------------------------------------------


def _bad(obj: object) -> FrameError:
    with pytest.raises(FrameError) as info:
        decode(cbor2.dumps(obj))
    return info.value


def test_unknown_op() -> None:
    exc = _bad({"op": "subscribe", "req": 4})
    assert "unknown op 'subscribe'" in str(exc)
    assert exc.code == 400
    assert exc.req == 4  # the broker can answer with the request id


def test_missing_field_names_it() -> None:
    exc = _bad({"op": "pub", "req": 9, "subject": "a"})
    assert str(exc) == "pub: missing field 'msg_id'"
    assert exc.req == 9


def test_wrong_type_names_the_field() -> None:
    exc = _bad({"op": "sub", "req": 1, "subject": 5})
    assert "subject" in str(exc)
    assert exc.req == 1


def test_missing_op_and_non_map() -> None:
    assert "op" in str(_bad({"req": 1}))
    assert "op" in str(_bad({"op": 3}))
    assert "CBOR map" in str(_bad([1, 2]))
    assert "map key" in str(_bad({1: 2, "op": "list", "req": 1}))
    assert "keys must be text" in str(_bad({b"k": 2, "op": "list", "req": 1}))


def test_invalid_req_is_not_reported() -> None:
    assert _bad({"op": "nope", "req": -5}).req is None
    assert _bad({"op": "nope", "req": True}).req is None


def test_unknown_keys_are_ignored() -> None:
    assert decode(cbor2.dumps({"op": "list", "req": 1, "future": [1, {"x": 2}]})) == List(req=1)


def test_op_need_not_be_first_on_decode() -> None:
    # Be liberal in what is accepted: only the writer promises 'op' first.
    assert decode(cbor2.dumps({"upto": 3, "op": "ack"})) == Ack(upto=3)


def test_trailing_bytes_rejected() -> None:
    with pytest.raises(FrameError, match="after the CBOR map"):
        decode(encode(Ack(upto=1)) + b"\x00")


def test_tags_rejected() -> None:
    # tag 35 (a regex cbor2 would compile), 0 (datetime), 2 (bignum), 258 (set), a private tag
    for tagged in (
        cbor2.CBORTag(35, "ab+"),
        cbor2.CBORTag(0, "2013-03-21T20:04:00Z"),
        cbor2.CBORTag(2, b"\x01" + bytes(8)),
        cbor2.CBORTag(258, [1]),
        cbor2.CBORTag(1 << 20, 1),
    ):
        with pytest.raises(FrameError):
            decode(cbor2.dumps({"op": "ack", "upto": tagged}))


@pytest.mark.parametrize(
    "tagged",
    [
        cbor2.CBORTag(2, b"\x05"),  # a bignum that would be a valid attribute value, 5
        cbor2.CBORTag(55799, 5),  # "self-described CBOR" around a valid value
        cbor2.CBORTag(1, 5),  # an epoch date
        cbor2.CBORTag(40000, 5),  # a number no decoder knows: the tag hook's
    ],
)
def test_a_tag_is_refused_even_where_its_value_would_be_valid(tagged: cbor2.CBORTag) -> None:
    frame = {"op": "pub", "req": 1, "msg_id": "m", "subject": "a", "attrs": {"n": tagged}}
    assert isinstance(decode(cbor2.dumps({**frame, "attrs": {"n": 5}})), Pub)
    with pytest.raises(FrameError, match="CBOR tags are not allowed"):
        decode(cbor2.dumps(frame))


def test_duplicate_keys_rejected() -> None:
    # {"op": "ack", "upto": 1, "upto": 2}
    data = bytes.fromhex("a3626f706361636b647570746f01647570746f02")
    with pytest.raises(FrameError):
        decode(data)


def test_deep_nesting_rejected_without_recursion_error() -> None:
    data = b"\xa2\x62op\x64list\x63req" + b"\x81" * 100_000 + b"\x00"
    with pytest.raises(FrameError):
        decode(data)


def test_oversize_rejected_before_parsing() -> None:
    with pytest.raises(FrameError) as info:
        decode(b"\x00" * (MAX_FRAME_BYTES + 1))
    assert info.value.code == 413


def test_oversize_encode_raises_413() -> None:
    pub = Pub(req=5, msg_id="m", subject="a", payload=b"x" * MAX_FRAME_BYTES)
    with pytest.raises(FrameError) as info:
        encode(pub)
    assert info.value.code == 413
    assert info.value.req == 5


def test_invalid_utf8_rejected() -> None:
    # {"op": "ack", "upto": 1} with the op text's bytes replaced by invalid UTF-8
    with pytest.raises(FrameError):
        decode(bytes.fromhex("a2626f7063fffeff647570746f01"))


def test_items_must_be_maps() -> None:
    assert "items" in str(_bad({"op": "subs", "req": 1, "items": 5}))
    assert "map" in str(_bad({"op": "subs", "req": 1, "items": [5]}))
    exc = _bad({"op": "subs", "req": 1, "items": [{"sub_id": "1"}]})
    assert "missing field 'subject'" in str(exc)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"battery": 2}, "battery must be within 0..1, or -1"),
        ({"battery": True}, "battery must be a number"),
        ({"best": [{"network": "wifi", "latency_ms": 0}]}, "best.latency_ms must be within"),
        ({"best": [{"network": "wifi", "latency_ms": 5, "coverage": 1.5}]}, "best.coverage"),
        ({"best": [{"latency_ms": 5}]}, "missing field 'network'"),
        ({"best": "wifi"}, "best must be a list"),
        ({"network": 7}, "network must be text"),
    ],
)
def test_device_frame_refuses_bad_fields(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(FrameError, match=message):
        decode(cbor2.dumps({"op": "device", **fields}))


@pytest.mark.parametrize(
    ("rule", "message"),
    [
        ({"channel": "wifi", "p": 1, "start_at": 10.0}, "needs both"),
        ({"channel": "wifi", "p": 1, "start_at": 10.0, "end_at": 10.0}, "after rules.start_at"),
        ({"channel": "wifi", "p": 1, "start_at": "now", "end_at": 20.0}, "number of seconds"),
        ({"channel": "wifi", "p": 1, "start_at": -5.0, "end_at": 20.0}, "finite time >= 0"),
    ],
)
def test_calendar_frame_refuses_bad_dated_rules(rule: dict[str, Any], message: str) -> None:
    with pytest.raises(FrameError, match=message):
        decode(cbor2.dumps({"op": "calendar", "req": 1, "rules": [rule]}))


def test_a_dated_calendar_rule_on_the_wire() -> None:
    frame = Calendar(req=3, rules=(CalendarRule(channel="wifi", p=1.0, start_at=10, end_at=20),))
    assert cbor2.loads(encode(frame))["rules"] == [
        {"channel": "wifi", "p": 1.0, "start_at": 10.0, "end_at": 20.0}
    ]
    assert decode(encode(frame)) == frame
    rule = frame.rules[0].rule()
    assert (rule.start_at, rule.end_at, rule.weekdays) == (10.0, 20.0, frozenset(range(7)))


def test_device_frame_on_the_wire() -> None:
    frame = Device(network="wifi", best=(NetworkBest(network="wifi", latency_ms=12),), battery=0.5)
    assert cbor2.loads(encode(frame)) == {
        "op": "device",
        "network": "wifi",
        "best": [{"network": "wifi", "latency_ms": 12.0}],
        "battery": 0.5,
    }
    assert decode(encode(frame)) == frame
