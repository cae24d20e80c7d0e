"""Messages on a stream (docs/frames.md "On a stream"): round trips, split anywhere, and
any bytes at all give messages or StreamFramingError, never anything else."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quicdata.framing import StreamDecoder, StreamFramingError, encode

messages = st.lists(st.binary(min_size=1, max_size=300), max_size=20)


@given(messages, st.lists(st.integers(min_value=0, max_value=7000), max_size=10))
@settings(max_examples=200, deadline=None)
def test_messages_survive_any_split_of_the_stream(items: list[bytes], cuts: list[int]) -> None:
    stream = b"".join(encode(m) for m in items)
    decoder = StreamDecoder()
    out: list[bytes] = []
    start = 0
    for cut in [*sorted(c for c in cuts if c < len(stream)), len(stream)]:
        out += decoder.feed(stream[start:cut])
        start = cut
    assert out == items
    assert decoder.pending == 0


@given(st.lists(st.binary(max_size=64), max_size=12))
@settings(max_examples=500, deadline=None)
def test_any_bytes_give_messages_or_a_framing_error(pieces: list[bytes]) -> None:
    decoder = StreamDecoder(limit=100)
    try:
        for piece in pieces:
            for message in decoder.feed(piece):
                assert 0 < len(message) <= 100
    except StreamFramingError:
        with pytest.raises(StreamFramingError):
            decoder.feed(b"\x00\x00\x00\x01x")  # no resynchronising after a break


def test_a_zero_length_is_an_error() -> None:
    with pytest.raises(StreamFramingError, match="not 0"):
        StreamDecoder().feed(b"\x00\x00\x00\x00")


def test_a_length_over_the_limit_is_an_error_before_the_bytes_arrive() -> None:
    with pytest.raises(StreamFramingError, match="not 101"):
        StreamDecoder(limit=100).feed(b"\x00\x00\x00\x65")


def test_the_prefix_is_four_bytes_big_endian() -> None:
    assert encode(b"abc") == b"\x00\x00\x00\x03abc"
    with pytest.raises(StreamFramingError):
        encode(b"")
    with pytest.raises(StreamFramingError):
        encode(b"x" * 11, limit=10)
