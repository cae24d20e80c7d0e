"""Messages on a byte stream: each one a 4-byte big-endian length, then that many bytes
(docs/frames.md "On a stream").

A QUIC stream is a byte stream, so the frames that RUDP carries one per message need a
boundary: the length prefix gives it. A length of 0 or above the limit is an error, as
is anything a reader cannot take: the decoder raises :class:`StreamFramingError` and
never anything else, whatever the bytes (tests/quicdata/test_framing_fuzz.py).
"""

from __future__ import annotations

import struct

__all__ = ["LENGTH_BYTES", "MAX_MESSAGE_BYTES", "StreamDecoder", "StreamFramingError", "encode"]

LENGTH_BYTES = 4
# The largest frame (docs/frames.md "Limits": MAX_FRAME_BYTES, 1 MiB).
MAX_MESSAGE_BYTES = 1 << 20
_LENGTH = struct.Struct("!I")


class StreamFramingError(ValueError):
    """The stream's bytes break the framing (a zero or oversized length)."""


def encode(message: bytes, limit: int = MAX_MESSAGE_BYTES) -> bytes:
    """``message`` with its length prefix. Raises StreamFramingError when it is empty or
    longer than ``limit``."""
    if not 0 < len(message) <= limit:
        raise StreamFramingError(f"a message is 1..{limit} bytes, not {len(message)}")
    return _LENGTH.pack(len(message)) + message


class StreamDecoder:
    """Reassembles messages from a stream's bytes, in whatever pieces they arrive."""

    __slots__ = ("_buffer", "_failed", "limit")

    def __init__(self, limit: int = MAX_MESSAGE_BYTES) -> None:
        self.limit = limit
        self._buffer = bytearray()
        self._failed = False

    @property
    def pending(self) -> int:
        """Bytes received that do not yet make a whole message."""
        return len(self._buffer)

    def feed(self, data: bytes) -> list[bytes]:
        """The messages ``data`` completes, in order. Raises StreamFramingError (and then
        on every later call: a stream that broke its framing cannot be resynchronised)."""
        if self._failed:
            raise StreamFramingError("the stream broke its framing before")
        buffer = self._buffer
        buffer += data
        messages: list[bytes] = []
        offset = 0
        while len(buffer) - offset >= LENGTH_BYTES:
            (length,) = _LENGTH.unpack_from(buffer, offset)
            if not 0 < length <= self.limit:
                self._failed = True
                raise StreamFramingError(f"a message is 1..{self.limit} bytes, not {length}")
            end = offset + LENGTH_BYTES + length
            if end > len(buffer):
                break
            messages.append(bytes(buffer[offset + LENGTH_BYTES : end]))
            offset = end
        del buffer[:offset]
        return messages
