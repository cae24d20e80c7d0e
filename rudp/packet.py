"""RUDP wire format: ``push_*`` encoders and ``pull_*`` decoders (layout in docs/rudp.md).

Every datagram::

    0   u8   version (1)
    1   u8   type (1 DATA, 2 ACK, 3 PING)
    2   u64  connection id
    10  u32  sender id (random per connection; a packet carrying our own id is a reflection)
    14  u32  packet number (per sender, +1 per datagram, never reused)
    18  ...  body
    -16 16   tag = HMAC-SHA256(session key, everything before the tag)[:16]

All integers are big-endian. Decoders raise :class:`rudp.errors.PacketError` only.
"""

from __future__ import annotations

import hmac
import struct
from dataclasses import dataclass
from enum import IntEnum

from rudp.errors import PacketError

VERSION = 1
HEADER = struct.Struct("!BBQII")
DATA_BODY = struct.Struct("!IIHH")
ACK_BODY = struct.Struct("!IB")
BLOCK = struct.Struct("!II")
TAG_SIZE = 16
HEADER_SIZE = HEADER.size  # 18
DATA_OVERHEAD = HEADER_SIZE + DATA_BODY.size + TAG_SIZE  # 46


class PacketType(IntEnum):
    DATA = 1
    ACK = 2
    PING = 3


@dataclass(frozen=True, slots=True)
class Header:
    type: PacketType
    cid: int
    sender: int
    pn: int


@dataclass(frozen=True, slots=True)
class Data:
    seq: int  # this fragment's sequence number
    base: int  # oldest sequence number the sender still retransmits; below it is abandoned
    frag_index: int
    frag_count: int
    payload: bytes


@dataclass(frozen=True, slots=True)
class Ack:
    cumulative: int  # every seq below this was received
    blocks: tuple[tuple[int, int], ...]  # received [start, end) ranges above ``cumulative``


def max_sack_blocks(mtu: int) -> int:
    """SACK blocks an ACK may carry without exceeding ``mtu`` bytes."""
    return (mtu - HEADER_SIZE - ACK_BODY.size - TAG_SIZE) // BLOCK.size


def compute_tag(key: bytes, data: bytes) -> bytes:
    """HMAC-SHA256 of ``data`` keyed by the session key, truncated to 16 bytes."""
    return hmac.digest(key, data, "sha256")[:TAG_SIZE]


def push_header(header: Header) -> bytes:
    return HEADER.pack(VERSION, header.type, header.cid, header.sender, header.pn)


def push_data(data: Data) -> bytes:
    return DATA_BODY.pack(data.seq, data.base, data.frag_index, data.frag_count) + data.payload


def push_ack(ack: Ack) -> bytes:
    return ACK_BODY.pack(ack.cumulative, len(ack.blocks)) + b"".join(
        BLOCK.pack(s, e) for s, e in ack.blocks
    )


def push_tag(key: bytes, packet: bytes) -> bytes:
    """Append the tag to a packet without one."""
    return packet + compute_tag(key, packet)


def peek_cid(datagram: bytes) -> int:
    """The connection id of a datagram, unauthenticated (for routing to a connection)."""
    if len(datagram) < HEADER_SIZE + TAG_SIZE:
        raise PacketError("truncated header")
    return int.from_bytes(datagram[2:10], "big")


def pull_header(datagram: bytes) -> tuple[Header, bytes]:
    """Split a datagram into its header and body (tag excluded); no authentication here."""
    if len(datagram) < HEADER_SIZE + TAG_SIZE:
        raise PacketError("truncated header")
    version, ptype, cid, sender, pn = HEADER.unpack_from(datagram)
    if version != VERSION:
        raise PacketError(f"unknown version {version}")
    try:
        kind = PacketType(ptype)
    except ValueError:
        raise PacketError(f"unknown type {ptype}") from None
    return Header(kind, cid, sender, pn), datagram[HEADER_SIZE:-TAG_SIZE]


def verify_tag(key: bytes, datagram: bytes) -> bool:
    """Constant-time check of the trailing tag."""
    return hmac.compare_digest(compute_tag(key, datagram[:-TAG_SIZE]), datagram[-TAG_SIZE:])


def pull_data(body: bytes) -> Data:
    if len(body) < DATA_BODY.size:
        raise PacketError("truncated DATA")
    seq, base, index, count = DATA_BODY.unpack_from(body)
    return Data(seq, base, index, count, bytes(body[DATA_BODY.size :]))


def pull_ack(body: bytes) -> Ack:
    if len(body) < ACK_BODY.size:
        raise PacketError("truncated ACK")
    cumulative, n = ACK_BODY.unpack_from(body)
    if len(body) != ACK_BODY.size + n * BLOCK.size:
        raise PacketError("ACK length does not match its block count")
    blocks = []
    for i in range(n):
        start, end = BLOCK.unpack_from(body, ACK_BODY.size + i * BLOCK.size)
        if not cumulative < start < end:
            raise PacketError("bad SACK block")
        blocks.append((start, end))
    return Ack(cumulative, tuple(blocks))
