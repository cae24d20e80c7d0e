"""RUDP wire format version 2: header, protected frames, tag (layout in docs/rudp.md §1).

Every datagram::

    0   u8   version (2)
    1   u8   flags (0; reserved)
    2   u64  connection id
    10  u32  sender id (random per connection; a packet carrying our own id is a reflection)
    14  u32  packet number (per sender, +1 per datagram, never reused)
    18  ...  frames, encrypted (AES-256-GCM; the 18 header bytes are the associated data)
    -16 16   AEAD tag

The protected payload is a sequence of frames, each starting with a type byte; a
receiver handles them in order. Senders pack the DATA frames due together, and a
due ACK, into datagrams of up to the MTU (every frame carries its own length or has
a fixed size); PATH_CHALLENGE / PATH_RESPONSE and PING go alone.

Keys: the connection's 32-byte session secret (docs/security.md) yields, through
HKDF-SHA256, one key and one IV per *sender id*: each direction, and each
incarnation of a side (a restarted connection object draws a new sender id), has
its own key, so restarting the packet numbers at 0 never reuses a nonce.
The nonce is the IV XOR the packet number (as TLS 1.3 and QUIC do).

All integers are big-endian. Decoders raise :class:`rudp.errors.PacketError` only.
"""

from __future__ import annotations

import functools
import hmac
import struct
from dataclasses import dataclass
from enum import Enum, IntEnum

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from rudp.errors import PacketError

VERSION = 2
HEADER = struct.Struct("!BBQII")
DATA_FRAME = struct.Struct("!BIIHHH")  # type, seq, base, frag index, frag count, length
ACK_FRAME = struct.Struct("!BIB")  # type, cumulative, block count
BLOCK = struct.Struct("!II")
PATH_FRAME = struct.Struct("!B8s")  # type, 8-byte token
TAG_SIZE = 16
KEY_SIZE = 32
IV_SIZE = 12
TOKEN_SIZE = 8
HEADER_SIZE = HEADER.size  # 18
DATA_OVERHEAD = HEADER_SIZE + DATA_FRAME.size + TAG_SIZE  # 49
MIN_DATAGRAM = HEADER_SIZE + 1 + TAG_SIZE  # one frame of at least its type byte
KDF_SALT = b"mdeci-rudp v2"


class FrameType(IntEnum):
    PADDING = 0
    DATA = 1
    ACK = 2
    PING = 3
    PATH_CHALLENGE = 4
    PATH_RESPONSE = 5


DATA_TYPE = int(FrameType.DATA)  # a plain int: struct packs it without the enum's lookup


class Protection(Enum):
    """How datagrams are protected. Only AEAD is ever used between peers;
    INTEGRITY_ONLY (HMAC-SHA256/16 over clear frames, the version 1 scheme) exists as
    the benchmark's reference and is not reachable from any configuration file."""

    AEAD = "aes-256-gcm"
    INTEGRITY_ONLY = "hmac-sha256"


@dataclass(frozen=True, slots=True)
class Header:
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


@dataclass(frozen=True, slots=True)
class Ping:
    pass


@dataclass(frozen=True, slots=True)
class PathChallenge:
    token: bytes  # 8 bytes, echoed in a PathResponse


@dataclass(frozen=True, slots=True)
class PathResponse:
    token: bytes


Frame = Data | Ack | Ping | PathChallenge | PathResponse


def max_sack_blocks(mtu: int) -> int:
    """SACK blocks an ACK may carry without exceeding ``mtu`` bytes."""
    return (mtu - HEADER_SIZE - ACK_FRAME.size - TAG_SIZE) // BLOCK.size


# ---------------------------------------------------------------------------- frames


def push_data(seq: int, base: int, frag_index: int, frag_count: int, payload: bytes) -> bytes:
    """A DATA frame's bytes, without building a :class:`Data` (the sender's hot path)."""
    return DATA_FRAME.pack(DATA_TYPE, seq, base, frag_index, frag_count, len(payload)) + payload


def push_frame(frame: Frame) -> bytes:
    """One frame's bytes."""
    if isinstance(frame, Data):
        return push_data(frame.seq, frame.base, frame.frag_index, frame.frag_count, frame.payload)
    if isinstance(frame, Ack):
        return ACK_FRAME.pack(FrameType.ACK, frame.cumulative, len(frame.blocks)) + b"".join(
            BLOCK.pack(s, e) for s, e in frame.blocks
        )
    if isinstance(frame, Ping):
        return bytes((FrameType.PING,))
    if isinstance(frame, PathChallenge):
        return PATH_FRAME.pack(FrameType.PATH_CHALLENGE, frame.token)
    return PATH_FRAME.pack(FrameType.PATH_RESPONSE, frame.token)


def pull_frames(payload: bytes) -> list[Frame]:
    """Every frame of a decrypted payload, in order. PADDING bytes are skipped.

    Raises PacketError on an unknown type, a truncated frame, an ACK whose blocks are
    not ascending above its cumulative point, or a payload with no frame at all.
    """
    frames: list[Frame] = []
    view = memoryview(payload)
    at, end = 0, len(payload)
    while at < end:
        kind = view[at]
        if kind == FrameType.PADDING:
            at += 1
        elif kind == FrameType.DATA:
            if end - at < DATA_FRAME.size:
                raise PacketError("truncated DATA")
            _, seq, base, index, count, length = DATA_FRAME.unpack_from(view, at)
            at += DATA_FRAME.size
            if end - at < length:
                raise PacketError("DATA length beyond the datagram")
            frames.append(Data(seq, base, index, count, bytes(view[at : at + length])))
            at += length
        elif kind == FrameType.ACK:
            if end - at < ACK_FRAME.size:
                raise PacketError("truncated ACK")
            _, cumulative, n = ACK_FRAME.unpack_from(view, at)
            at += ACK_FRAME.size
            if end - at < n * BLOCK.size:
                raise PacketError("ACK length does not match its block count")
            blocks: list[tuple[int, int]] = []
            for _ in range(n):
                start, stop = BLOCK.unpack_from(view, at)
                at += BLOCK.size
                if not cumulative < start < stop or (blocks and start <= blocks[-1][1]):
                    raise PacketError("bad SACK block")
                blocks.append((start, stop))
            frames.append(Ack(cumulative, tuple(blocks)))
        elif kind == FrameType.PING:
            at += 1
            frames.append(Ping())
        elif kind in (FrameType.PATH_CHALLENGE, FrameType.PATH_RESPONSE):
            if end - at < PATH_FRAME.size:
                raise PacketError("truncated path frame")
            _, token = PATH_FRAME.unpack_from(view, at)
            at += PATH_FRAME.size
            cls = PathChallenge if kind == FrameType.PATH_CHALLENGE else PathResponse
            frames.append(cls(bytes(token)))
        else:
            raise PacketError(f"unknown frame type {kind}")
    if not frames:
        raise PacketError("no frame")
    return frames


# ---------------------------------------------------------------------------- protection


# An AES-GCM context costs ~2.5 kB of OpenSSL memory; a broker holds two per session
# (10,000 sessions and more). The contexts of the keys in use are kept here, the least
# recently used dropped past AEAD_CONTEXTS, and an evicted key builds its context again on
# its next packet (~1 µs).
AEAD_CONTEXTS = 1024


# A sender's key and IV as one int, the key above the IV's 96 bits: a broker holds two
# keys per session, and key bytes beside an IV int cost ~50 bytes more each.
IV_BITS = IV_SIZE * 8
IV_MASK = (1 << IV_BITS) - 1


@functools.lru_cache(maxsize=AEAD_CONTEXTS)
def _aead(key_iv: int) -> AESGCM:
    return AESGCM(_key(key_iv))


def key_iv(secret: bytes, sender: int, protection: Protection) -> int:
    """The key and IV of ``sender`` under ``secret`` (module docstring) as one int."""
    material = HKDF(
        algorithm=hashes.SHA256(),
        length=KEY_SIZE + IV_SIZE,
        salt=KDF_SALT,
        info=b"mdeci-rudp sender " + sender.to_bytes(4, "big") + protection.value.encode(),
    ).derive(secret)
    return int.from_bytes(material, "big")


def _key(key_iv: int) -> bytes:
    """The key of ``key_iv`` (AES-256-GCM's, or the reference's HMAC key)."""
    return (key_iv >> IV_BITS).to_bytes(KEY_SIZE, "big")


def _nonce(key_iv: int, pn: int) -> bytes:
    """The AEAD nonce of packet ``pn``: the IV xor the packet number."""
    return ((key_iv ^ pn) & IV_MASK).to_bytes(IV_SIZE, "big")


def protect(key_iv: int, aead: bool, header: bytes, pn: int, payload: bytes) -> bytes:
    """``header`` + ``payload`` protected under ``key_iv`` + tag (``aead``: AES-256-GCM,
    the nonce the IV xor ``pn``; else HMAC-SHA-256 over the clear frames)."""
    if not aead:
        data = header + payload
        return data + hmac.digest(_key(key_iv), data, "sha256")[:TAG_SIZE]
    return header + _aead(key_iv).encrypt(_nonce(key_iv, pn), payload, header)


def unprotect(key_iv: int, aead: bool, datagram: bytes, pn: int) -> bytes | None:
    """The payload of a datagram :func:`protect` made, or None when its tag does not
    verify."""
    header = datagram[:HEADER_SIZE]
    if not aead:
        expected = hmac.digest(_key(key_iv), datagram[:-TAG_SIZE], "sha256")[:TAG_SIZE]
        if not hmac.compare_digest(expected, datagram[-TAG_SIZE:]):
            return None
        return datagram[HEADER_SIZE:-TAG_SIZE]
    try:
        return _aead(key_iv).decrypt(_nonce(key_iv, pn), datagram[HEADER_SIZE:], header)
    except InvalidTag:
        return None


class SenderKeys:
    """Key and IV of one sender id under one session secret (module docstring). A
    connection keeps the int (:func:`key_iv`) itself: a broker holds two per session,
    and this object around each costs 64 bytes."""

    __slots__ = ("aead", "key_iv", "sender")

    def __init__(self, secret: bytes, sender: int, protection: Protection) -> None:
        self.key_iv = key_iv(secret, sender, protection)
        self.sender = sender
        self.aead = protection is Protection.AEAD  # else HMAC-SHA-256 only (the reference)

    @property
    def protection(self) -> Protection:
        return Protection.AEAD if self.aead else Protection.INTEGRITY_ONLY

    def seal(self, header: bytes, pn: int, payload: bytes) -> bytes:
        """``header`` + protected ``payload`` + tag."""
        return protect(self.key_iv, self.aead, header, pn, payload)

    def open(self, datagram: bytes, pn: int) -> bytes | None:
        """The payload of an authentic datagram, or None when the tag does not verify."""
        return unprotect(self.key_iv, self.aead, datagram, pn)


def push_header(header: Header) -> bytes:
    return HEADER.pack(VERSION, 0, header.cid, header.sender, header.pn)


def seal(keys: SenderKeys, header: Header, frames: list[Frame]) -> bytes:
    """One protected datagram carrying ``frames``."""
    return keys.seal(push_header(header), header.pn, b"".join(push_frame(f) for f in frames))


def seal_encoded(
    key_iv: int, aead: bool, cid: int, sender: int, pn: int, frames: list[bytes]
) -> bytes:
    """One protected datagram from frames already encoded (``push_data``/``push_frame``):
    the same bytes as :func:`seal`, with no Header, frame or key objects on the way."""
    header = HEADER.pack(VERSION, 0, cid, sender, pn)
    return protect(key_iv, aead, header, pn, b"".join(frames))


def peek_cid(datagram: bytes) -> int:
    """The connection id of a datagram, unauthenticated (for routing to a connection)."""
    if len(datagram) < MIN_DATAGRAM:
        raise PacketError("truncated header")
    return int.from_bytes(datagram[2:10], "big")


def pull_header(datagram: bytes) -> Header:
    """The header of a datagram; no authentication here."""
    if len(datagram) < MIN_DATAGRAM:
        raise PacketError("truncated header")
    version, flags, cid, sender, pn = HEADER.unpack_from(datagram)
    if version != VERSION:
        raise PacketError(f"unknown version {version}")
    if flags != 0:
        raise PacketError(f"unknown flags {flags:#x}")
    return Header(cid, sender, pn)
