"""Frames to SMS and back: concatenation and application-port UDH (3GPP TS 23.040).

Theory of operation. An SMS carries 140 octets of user data (8-bit coding, TS 23.040
§9.2.3.24); with the UDHI flag set, the first octets are a user data header: UDHL (the
length of what follows) and information elements (IEI, length, data). Every mdeci SMS
carries two IEs:

- concatenation, 8-bit reference (IEI 0x00, §9.2.3.24.1: ref, total, seq) or 16-bit
  reference (IEI 0x08, §9.2.3.24.8: ref hi, ref lo, total, seq), seq counting from 1;
  present even when total is 1, so every buffer has a reference to acknowledge;
- 16-bit application port addressing (IEI 0x05, §9.2.3.24.4: destination port, source
  port), which tells mdeci data and mdeci acks apart from each other and from a person's
  text messages on the same number.

A frame travels as a *buffer*: an integrity tag (CRC-32, or HMAC-SHA256 truncated to 8
octets when a key is shared) followed by the frame, cut into ``140 - len(UDH)`` octet
pieces (128 with an 8-bit reference, 127 with a 16-bit one). The tag catches a buffer
mixed from two buffers that reused one reference. Byte layouts: docs/sms.md.
"""

from __future__ import annotations

import hashlib
import hmac
import zlib
from dataclasses import dataclass

from mdeci.sms.errors import FrameTooLarge, PduError

SMS_OCTETS = 140
MAX_SEGMENTS = 255
IEI_CONCAT8 = 0x00
IEI_CONCAT16 = 0x08
IEI_PORT16 = 0x05


@dataclass(frozen=True, slots=True)
class Sms:
    """One short message as gateways carry it: binary user data split into UDH and body.

    ``udh`` includes its length octet (UDHL) and is empty for a message without one.
    """

    sender: str
    recipient: str
    udh: bytes
    body: bytes

    def __post_init__(self) -> None:
        if len(self.udh) + len(self.body) > SMS_OCTETS:
            raise PduError(f"SMS user data is {len(self.udh) + len(self.body)} > 140 octets")


@dataclass(frozen=True, slots=True)
class Segment:
    """A parsed mdeci data segment."""

    ref: int
    ref16: bool
    total: int
    seq: int  # 1-based
    dst_port: int
    src_port: int
    data: bytes


def udh_length(ref16: bool) -> int:
    """Octets of an mdeci data segment's UDH, UDHL included (12 or 13)."""
    return 1 + (6 if ref16 else 5) + 6


def segment_payload(ref16: bool) -> int:
    """Buffer octets per segment: 128 (8-bit reference) or 127 (16-bit)."""
    return SMS_OCTETS - udh_length(ref16)


def tag_length(key: bytes | None) -> int:
    return 4 if key is None else 8


def integrity_tag(frame: bytes, key: bytes | None) -> bytes:
    """CRC-32 (big-endian) of ``frame``, or HMAC-SHA256(key, frame)[:8]."""
    if key is None:
        return zlib.crc32(frame).to_bytes(4, "big")
    return hmac.new(key, frame, hashlib.sha256).digest()[:8]


def segments_needed(
    frame_size: int, *, ref16: bool = False, key: bytes | None = None, overhead: int | None = None
) -> int:
    """How many SMS a frame of ``frame_size`` octets takes (what a tariff bills).

    ``overhead``: octets the buffer adds to the frame, if not the tag ``key`` selects.
    """
    size = frame_size + (tag_length(key) if overhead is None else overhead)
    per = segment_payload(ref16)
    return max(1, -(-size // per))


def max_frame_size(*, ref16: bool = False, key: bytes | None = None) -> int:
    return MAX_SEGMENTS * segment_payload(ref16) - tag_length(key)


def encode_udh(ies: list[tuple[int, bytes]]) -> bytes:
    """UDHL followed by the information elements."""
    body = b"".join(bytes((iei, len(data))) + data for iei, data in ies)
    return bytes((len(body),)) + body


def parse_udh(udh: bytes) -> dict[int, bytes]:
    """Information elements of a UDH (UDHL included); a repeated IE keeps its last value.

    Raises :class:`PduError` if the lengths do not add up.
    """
    if not udh:
        raise PduError("no user data header")
    if udh[0] != len(udh) - 1:
        raise PduError(f"UDHL {udh[0]} does not match {len(udh) - 1} header octets")
    ies: dict[int, bytes] = {}
    i = 1
    while i < len(udh):
        if i + 2 > len(udh):
            raise PduError("truncated information element")
        iei, length = udh[i], udh[i + 1]
        if i + 2 + length > len(udh):
            raise PduError(f"information element {iei:#04x} overruns the header")
        ies[iei] = udh[i + 2 : i + 2 + length]
        i += 2 + length
    return ies


def port_ie(dst_port: int, src_port: int) -> tuple[int, bytes]:
    return IEI_PORT16, dst_port.to_bytes(2, "big") + src_port.to_bytes(2, "big")


def split(
    buffer: bytes, *, ref: int, ref16: bool, dst_port: int, src_port: int
) -> list[tuple[bytes, bytes]]:
    """Cut a buffer (tag + frame) into (udh, body) pairs, in order.

    Raises :class:`FrameTooLarge` beyond 255 segments.
    """
    per = segment_payload(ref16)
    total = max(1, -(-len(buffer) // per))
    if total > MAX_SEGMENTS:
        raise FrameTooLarge(f"{len(buffer)} octets need {total} > 255 segments")
    if not 0 <= ref < (1 << 16 if ref16 else 1 << 8):
        raise ValueError(f"reference {ref} out of range")
    out = []
    for seq in range(1, total + 1):
        if ref16:
            concat = (IEI_CONCAT16, ref.to_bytes(2, "big") + bytes((total, seq)))
        else:
            concat = (IEI_CONCAT8, bytes((ref, total, seq)))
        udh = encode_udh([concat, port_ie(dst_port, src_port)])
        out.append((udh, buffer[(seq - 1) * per : seq * per]))
    return out


def ports(udh: bytes) -> tuple[int, int]:
    """(destination, source) port of an SMS; raises :class:`PduError` without one."""
    ie = parse_udh(udh).get(IEI_PORT16)
    if ie is None or len(ie) != 4:
        raise PduError("no 16-bit application port element")
    return int.from_bytes(ie[:2], "big"), int.from_bytes(ie[2:], "big")


def parse_segment(udh: bytes, body: bytes) -> Segment:
    """Parse an mdeci data segment; raises :class:`PduError` if it is not one."""
    ies = parse_udh(udh)
    dst, src = ports(udh)
    if IEI_CONCAT16 in ies:
        ie = ies[IEI_CONCAT16]
        if len(ie) != 4:
            raise PduError("bad 16-bit concatenation element")
        ref, total, seq, ref16 = int.from_bytes(ie[:2], "big"), ie[2], ie[3], True
    elif IEI_CONCAT8 in ies:
        ie = ies[IEI_CONCAT8]
        if len(ie) != 3:
            raise PduError("bad 8-bit concatenation element")
        ref, total, seq, ref16 = ie[0], ie[1], ie[2], False
    else:
        raise PduError("no concatenation element")
    if total == 0 or not 1 <= seq <= total:
        raise PduError(f"segment {seq} of {total}")  # TS 23.040: receiver ignores the IE
    return Segment(ref, ref16, total, seq, dst, src, body)


@dataclass(frozen=True, slots=True)
class AckEntry:
    """One acknowledged buffer: its reference, segment count and the tag's first 4 octets."""

    ref: int
    total: int
    tag4: bytes


ACK_ENTRY = 7  # ref (2) + total (1) + tag (4)


def encode_acks(
    entries: list[AckEntry], *, dst_port: int, src_port: int, overhead: int = 0
) -> list[tuple[bytes, bytes]]:
    """Ack SMS (udh, body) pairs carrying ``entries``, as many per SMS as fit while
    leaving ``overhead`` octets of each body free (for sealing, :mod:`mdeci.sms.auth`)."""
    udh = encode_udh([port_ie(dst_port, src_port)])
    per = (SMS_OCTETS - len(udh) - overhead) // ACK_ENTRY
    out = []
    for i in range(0, len(entries), per):
        body = b"".join(
            e.ref.to_bytes(2, "big") + bytes((e.total,)) + e.tag4 for e in entries[i : i + per]
        )
        out.append((udh, body))
    return out


def parse_acks(body: bytes) -> list[AckEntry]:
    """Entries of an ack SMS body; raises :class:`PduError` on a ragged body."""
    if not body or len(body) % ACK_ENTRY:
        raise PduError(f"ack body of {len(body)} octets")
    return [
        AckEntry(int.from_bytes(body[i : i + 2], "big"), body[i + 2], body[i + 3 : i + 7])
        for i in range(0, len(body), ACK_ENTRY)
    ]


def encode_frame(
    frame: bytes,
    *,
    ref: int,
    ref16: bool = False,
    dst_port: int,
    src_port: int,
    key: bytes | None = None,
) -> list[tuple[bytes, bytes]]:
    """(udh, body) pairs carrying ``frame`` behind its integrity tag.

    Raises :class:`FrameTooLarge` if it needs more than 255 segments.
    """
    buffer = integrity_tag(frame, key) + frame
    return split(buffer, ref=ref, ref16=ref16, dst_port=dst_port, src_port=src_port)
