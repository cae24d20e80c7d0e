"""The ``limit`` frame (LimitReached): round trip, bad fields, fuzz."""

from __future__ import annotations

import cbor2
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mdeci.errors import FrameError
from mdeci.frames import LimitReached, decode, encode

texts = st.text(min_size=1, max_size=128)


@given(
    channel=texts,
    limit=st.text(min_size=1, max_size=1024),
    qclass=texts,
    until=st.floats(min_value=0, max_value=4e9, allow_nan=False),
)
def test_round_trip(channel: str, limit: str, qclass: str, until: float) -> None:
    frame = LimitReached(channel=channel, limit=limit, qclass=qclass, until=until)
    assert decode(encode(frame)) == frame


@pytest.mark.parametrize(
    "fields",
    [
        {"channel": "", "limit": "x", "qclass": "urgent", "until": 1.0},
        {"channel": "sms", "limit": "", "qclass": "urgent", "until": 1.0},
        {"channel": "sms", "limit": "x" * 1025, "qclass": "urgent", "until": 1.0},
        {"channel": "sms", "limit": "x", "qclass": "urgent", "until": float("nan")},
        {"channel": "sms", "limit": "x", "qclass": 3, "until": 1.0},
        {"channel": "sms", "limit": "x", "qclass": "urgent"},
    ],
)
def test_bad_limit_frames_are_frame_errors(fields: dict[str, object]) -> None:
    with pytest.raises(FrameError):
        decode(cbor2.dumps({"op": "limit", **fields}))


values = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=1100), st.binary()
)


@given(st.dictionaries(st.sampled_from(["channel", "limit", "qclass", "until"]), values))
def test_fuzz_gives_a_frame_or_a_frame_error(fields: dict[str, object]) -> None:
    """Any field values: a valid frame or FrameError, nothing else."""
    try:
        frame = decode(cbor2.dumps({"op": "limit", **fields}))
    except FrameError:
        return
    assert isinstance(frame, LimitReached)
