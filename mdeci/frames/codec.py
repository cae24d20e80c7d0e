"""The one codec of the application frames: their bytes, both ways.

Theory of operation
-------------------
:func:`encode` writes a frame as a CBOR map with ``op`` first and every other field under
its own name; a field that has a default and holds it is left out (so ``sub`` with no
filter and no TTL is just ``{op, req, subject}``). :func:`decode` is the single inbound
boundary, as h11's reader is: it returns a frame or raises
:class:`~mdeci.errors.FrameError`, never anything else, whatever the bytes. Keys it does
not know are ignored, so later versions may add fields. CBOR tags are refused: cbor2
would otherwise build datetimes, big integers, sets and even compiled regular
expressions from a peer's bytes.

The broker's hot paths have short cuts here, each giving exactly what the general
functions give (tests/broker/test_notify_encoding.py checks it byte for byte):

- :class:`NotifyEncoder` builds ``notify`` frames from queued rows (:data:`NotifyRow`)
  without a :class:`~mdeci.frames.model.Notify` per row; :func:`notify_bytes` is the
  checked path for a row the short cut declines (and for the SMS side);
- :func:`decode_fast` reads an ``ack`` and a ``pub`` without attrs (one per notification,
  one per publish) without the general decoder;
- :func:`encode_reply` writes a ``pub-ok`` without walking the dataclass.

Byte layout and codes: ``docs/frames.md``.
"""

from __future__ import annotations

import io
import math
import struct
from collections.abc import Callable, Iterator, Mapping
from dataclasses import fields
from types import MappingProxyType
from typing import Any

import cbor2

from mdeci.errors import FrameError
from mdeci.frames.model import (
    FRAME_TYPES,
    MAX_CALENDAR_RULES,
    MAX_DEPTH,
    MAX_FRAME_BYTES,
    MAX_ID_LENGTH,
    MAX_NETWORKS,
    TOO_LARGE,
    UINT63,
    Ack,
    Calendar,
    CalendarRule,
    Device,
    Frame,
    NetworkBest,
    Notify,
    Pub,
    PubOk,
    SubInfo,
    _name,
)

#: A queued notification as the store reads it for delivery: ``(nseq, sub_id,
#: publisher_uri, msg_id, subject, attrs_cbor, payload, published_at)``.
NotifyRow = tuple[int, int, str, str, str, bytes, bytes, float]

# ---------------------------------------------------------------------------------------
# Encoding and decoding
# ---------------------------------------------------------------------------------------


# Per frame class: (field name, has a default, the default or its factory, is a factory),
# in field order. Read once per class: ``fields()`` per encoded frame was a third of
# ``encode`` (an agent encodes a frame per publish and per ack).
_Plan = tuple[tuple[str, bool, Any, bool], ...]
_PLANS: dict[type, _Plan] = {}


def _plan(cls: type) -> _Plan:
    plan = _PLANS.get(cls)
    if plan is None:
        plan = _PLANS[cls] = tuple(
            (
                f.name,
                f.default is not f.default_factory,  # both MISSING when required
                f.default_factory if callable(f.default_factory) else f.default,
                callable(f.default_factory),
            )
            for f in fields(cls)
        )
    return plan


def _to_map(obj: object) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, has_default, default, factory in _plan(type(obj)):
        value = getattr(obj, name)
        if has_default and value == (default() if factory else default):
            continue  # defaults are implied on decode; keeps frames small (SMS is 140 B)
        if isinstance(value, MappingProxyType):
            value = dict(value)
        elif isinstance(value, tuple):
            value = [_to_map(v) for v in value]
        out[name] = value
    return out


def encode(frame: Frame) -> bytes:
    """Encode a frame as one CBOR map, key ``op`` first.

    Raises :class:`FrameError` (code 413) if the result exceeds :data:`MAX_FRAME_BYTES`.
    """
    data = cbor2.dumps({"op": frame.op, **_to_map(frame)})
    if len(data) > MAX_FRAME_BYTES:
        raise FrameError(
            f"{frame.op}: frame of {len(data)} bytes exceeds {MAX_FRAME_BYTES}",
            code=TOO_LARGE,
            req=getattr(frame, "req", None),
        )
    return data


def _refuse_tag(*_args: object) -> object:
    raise FrameError("CBOR tags are not allowed in frames")


class _EveryTag(Mapping[int, Any]):
    """A semantic-decoder table that answers every tag number with :func:`_refuse_tag`.

    cbor2 looks a tag up here before its own decoders, so no tag ever turns into an
    object. (A dict of the 65,536 numbers below which cbor2's own tags live did the same
    for 4.8 MB of every process's memory.)
    """

    def __getitem__(self, tag: int) -> Any:
        return _refuse_tag

    def __len__(self) -> int:
        return 0

    def __iter__(self) -> Iterator[int]:
        return iter(())


_NO_TAGS = _EveryTag()


def _from_map(cls: type[Any], m: Mapping[str, Any], op: str) -> Any:
    kwargs: dict[str, Any] = {}
    for f in fields(cls):
        if f.name in m:
            value = m[f.name]
            if f.name == "items":
                if not isinstance(value, list):
                    raise FrameError(f"{op}: items must be a list, not {_name(value)}")
                value = tuple(_item(v, op) for v in value)
            elif cls is Calendar and f.name == "rules":
                if not isinstance(value, list):
                    raise FrameError(f"{op}: rules must be a list, not {_name(value)}")
                if len(value) > MAX_CALENDAR_RULES:
                    raise FrameError(f"{op}: at most {MAX_CALENDAR_RULES} rules")
                value = tuple(_rule(v, op) for v in value)
            elif cls is Device and f.name == "best":
                if not isinstance(value, list):
                    raise FrameError(f"{op}: best must be a list, not {_name(value)}")
                if len(value) > MAX_NETWORKS:
                    raise FrameError(f"{op}: at most {MAX_NETWORKS} best entries")
                value = tuple(_best(v, op) for v in value)
            kwargs[f.name] = value
        elif f.default is f.default_factory:  # both MISSING: a required field
            raise FrameError(f"{op}: missing field '{f.name}'")
    return cls(**kwargs)


def _rule(value: object, op: str) -> CalendarRule:
    if not isinstance(value, dict):
        raise FrameError(f"{op}: each rule must be a map, not {_name(value)}")
    rule: CalendarRule = _from_map(CalendarRule, value, op)
    return rule


def _best(value: object, op: str) -> NetworkBest:
    if not isinstance(value, dict):
        raise FrameError(f"{op}: each best entry must be a map, not {_name(value)}")
    best: NetworkBest = _from_map(NetworkBest, value, op)
    return best


def _item(value: object, op: str) -> SubInfo:
    if not isinstance(value, dict):
        raise FrameError(f"{op}: each item must be a map, not {_name(value)}")
    item: SubInfo = _from_map(SubInfo, value, op)
    return item


def decode(data: bytes) -> Frame:
    """Decode one frame; unknown keys are ignored (forward compatibility).

    Raises :class:`FrameError` and nothing else for any other input: 413 when ``data``
    is longer than :data:`MAX_FRAME_BYTES`, 400 for bad CBOR, trailing bytes, a non-map,
    an unknown ``op``, a missing field, a wrong type or a value out of range. The error's
    ``req`` is set when the map had a valid request id, so the answer can name it.
    """
    if len(data) > MAX_FRAME_BYTES:
        raise FrameError(f"frame of {len(data)} bytes exceeds {MAX_FRAME_BYTES}", code=TOO_LARGE)
    buf = io.BytesIO(data)
    try:
        obj = cbor2.CBORDecoder(
            buf,
            tag_hook=_refuse_tag,
            semantic_decoders=_NO_TAGS,
            max_depth=MAX_DEPTH,
            allow_duplicate_keys=False,
            strict_hashable_types=True,
        ).decode()
    except FrameError:
        raise
    except Exception as exc:
        # cbor2 raises several types (CBORDecodeError, ValueError, UnicodeDecodeError...);
        # the boundary turns every one of them into the protocol error.
        cause = exc.__cause__ if isinstance(exc.__cause__, FrameError) else None
        text = (str(exc).splitlines() or [type(exc).__name__])[0][:200]
        raise cause or FrameError(f"bad CBOR: {text}") from None
    if buf.tell() != len(data):
        raise FrameError(f"{len(data) - buf.tell()} bytes after the CBOR map")
    if not isinstance(obj, dict):
        raise FrameError(f"a frame is a CBOR map, not {_name(obj)}")
    if any(not isinstance(k, str) for k in obj):
        raise FrameError("frame keys must be text")
    req = obj.get("req")
    valid_req = req if isinstance(req, int) and not isinstance(req, bool) else None
    if valid_req is not None and not 0 <= valid_req <= UINT63:
        valid_req = None
    op = obj.get("op")
    if not isinstance(op, str):
        raise FrameError("missing or non-text 'op'", req=valid_req)
    cls = FRAME_TYPES.get(op)
    if cls is None:
        raise FrameError(f"unknown op {op[:32]!r}", req=valid_req)
    try:
        frame: Frame = _from_map(cls, obj, op)
    except FrameError as exc:
        exc.req = valid_req
        raise
    return frame


# ---------------------------------------------------------------------------------------
# Notify frames from queued rows
# ---------------------------------------------------------------------------------------

# The CBOR items of a notify frame that never change (see NotifyEncoder).
_K_OP_NOTIFY_NSEQ = cbor2.dumps("op") + cbor2.dumps(Notify.op) + cbor2.dumps("nseq")
_K_SUB_ID = cbor2.dumps("sub_id")
_K_SUBJECT = cbor2.dumps("subject")
_K_MSG_ID = cbor2.dumps("msg_id")
_K_PUBLISHED_AT = cbor2.dumps("published_at")
_K_ATTRS = cbor2.dumps("attrs")
_K_PAYLOAD = cbor2.dumps("payload")
_K_MISSED = cbor2.dumps("missed")
#: The stored attrs of a publication without attrs (what ``cbor2.dumps({})`` gives).
EMPTY_ATTRS = cbor2.dumps({})


def notify_bytes(row: NotifyRow, missed: int | Callable[[], int] = 0) -> bytes:
    """``encode(Notify(...))`` of ``row``, every field checked; ``missed`` (or what it
    returns, asked only once the row's attrs decoded) is the frame's ``missed``.

    Raises :class:`FrameError` for a row no ``Notify`` can carry (a row written by
    something else than a publish): bad attrs, a value of another type, a frame over
    the limit.
    """
    nseq, sub_id, _, msg_id, subject, attrs_cbor, payload, published_at = row
    try:
        attrs = cbor2.loads(attrs_cbor)
        frame = Notify(
            nseq=nseq,
            sub_id=str(sub_id),
            subject=subject,
            msg_id=msg_id,
            published_at=published_at,
            attrs=attrs,
            payload=payload,
            missed=missed if isinstance(missed, int) else missed(),
        )
        return encode(frame)
    except FrameError:
        raise
    except (ValueError, TypeError, cbor2.CBORDecodeError) as exc:
        raise FrameError(f"notify: {exc}") from None


_ONE_BYTE = [bytes((i,)) for i in range(256)]
_HEAD8 = struct.Struct(">BB").pack
_HEAD16 = struct.Struct(">BH").pack
_HEAD32 = struct.Struct(">BI").pack
_HEAD64 = struct.Struct(">BQ").pack
# published_at's key, then its value as a double (its head byte, then the number).
_PUBLISHED_AT = struct.Struct(f">{len(_K_PUBLISHED_AT)}sBd").pack
_MAJOR_BYTES = 0x40  # CBOR major types 2 and 3 in a head's top three bits
_MAJOR_TEXT = 0x60


def _cbor_head(major: int, n: int) -> bytes:
    """The CBOR head of major type ``major`` (its top three bits: 0 for an unsigned
    integer, ``_MAJOR_BYTES``, ``_MAJOR_TEXT``) with argument ``n``, 0 <= n < 2**64, in
    the shortest form, as cbor2 writes it."""
    if n < 24:
        return _ONE_BYTE[major | n]
    if n < 0x100:
        return _HEAD8(major | 24, n)
    if n < 0x10000:
        return _HEAD16(major | 25, n)
    if n < 0x100000000:
        return _HEAD32(major | 26, n)
    return _HEAD64(major | 27, n)


class NotifyEncoder:
    """Builds ``notify`` frames from queued rows, byte for byte what
    ``encode(Notify(...))`` gives, without a ``Notify`` per row (building and validating one,
    and decoding the stored attrs to encode them again, is the largest Python cost of a
    delivery).

    ``encode`` writes a frame as a CBOR map, ``op`` first, then the fields in their
    order, leaving out those at their default; CBOR concatenates a map's items as they
    are, so the frame is its head byte followed by each item's own encoding, and each
    item is a head (:func:`_cbor_head`) and the value's bytes: the encoder writes them
    itself rather than through one ``cbor2.dumps`` per value (four per row cost half
    the encoding). The attrs go as stored (the publish encoded them with the same
    ``cbor2.dumps``). With ``share``, what all recipients of one publication share
    (subject to payload) is built once per publication and kept for the rest of the
    batch (a fan-out's hundred rows): only ``nseq``, ``sub_id`` and ``missed`` are per
    row; without it (one user's rows: no two share a publication but for overlapping
    subscriptions) each frame is written in one piece, with no key and no entry per row.
    ``tests/broker/test_notify_encoding.py`` checks the equality against ``encode``.
    """

    __slots__ = ("_shared", "_sub_ids", "_subjects")

    def __init__(self, *, share: bool = True) -> None:
        # (publisher_uri, msg_id, published_at) -> (items after sub_id, how many items in
        # all), or None for a publication that must take the checked path (see encode).
        # published_at is part of the key: a msg_id published again after the sweep
        # forgot it (queue.dedup_horizon) is another publication, and both may be queued.
        self._shared: dict[tuple[str, str, float], tuple[bytes, int] | None] | None = (
            {} if share else None
        )
        # The encodings a drain's rows share although their publications differ: their
        # subscription's id and (mostly) their subject, each encoded once per batch.
        self._sub_ids: dict[int, bytes] = {}
        self._subjects: dict[str, bytes] = {}

    def encode(self, row: NotifyRow, missed: int) -> bytes | None:
        """The frame, or None when the row needs ``encode``'s checks (a row this broker's
        publish did not write: attrs that are not a map, a value of another type, an
        nseq < 1, a msg_id of no or over 128 characters, a frame over the limit).

        Only those: the subject's syntax and the attrs' names and values are not checked
        again (the publish that queued the row checked them), so a row written by hand
        with a bad subject goes out as stored, where ``encode`` would refuse it."""
        nseq = row[0]
        if nseq < 1:  # never written by publish; encode refuses it
            return None
        shared = self._shared
        if shared is None:
            built = self._tail(row)
        else:
            key = (row[2], row[3], row[7])  # (publisher_uri, msg_id, published_at)
            if key in shared:
                built = shared[key]
            else:
                built = shared[key] = self._tail(row)
        if built is None:
            return None
        tail, items = built
        sub_id = row[1]
        sub = self._sub_ids.get(sub_id)
        if sub is None:
            sub = self._sub_ids[sub_id] = _K_SUB_ID + cbor2.dumps(str(sub_id))
        # The map's head (fewer than 24 items), op and nseq, sub_id, the rest, missed.
        # _cbor_head's shortest forms, inline for the common sizes (a call per row else).
        if nseq < 24:
            nseq_head = _ONE_BYTE[nseq]
        elif nseq < 0x10000:
            nseq_head = _HEAD8(24, nseq) if nseq < 0x100 else _HEAD16(25, nseq)
        else:
            nseq_head = _cbor_head(0, nseq)
        parts: tuple[bytes, ...]
        if missed:
            parts = (_ONE_BYTE[0xA1 + items], _K_OP_NOTIFY_NSEQ, nseq_head, sub, tail,
                     _K_MISSED, _cbor_head(0, missed))  # fmt: skip
        else:
            parts = (_ONE_BYTE[0xA0 + items], _K_OP_NOTIFY_NSEQ, nseq_head, sub, tail)
        data = b"".join(parts)
        return data if len(data) <= MAX_FRAME_BYTES else None

    def _tail(self, row: NotifyRow) -> tuple[bytes, int] | None:
        """The frame's items from ``subject`` to ``payload``, each key and value, and how
        many items the frame has without ``missed`` (op, nseq and sub_id included: encode
        writes those, which vary per row); None, see encode."""
        _, _, _, msg_id, subject, attrs, payload, published_at = row
        if not (
            type(msg_id) is str
            and 0 < len(msg_id) <= MAX_ID_LENGTH
            and type(subject) is str
            and type(attrs) is bytes
            and type(payload) is bytes
            and type(published_at) is float
            and 0.0 <= published_at < math.inf  # what Notify takes (not NaN)
        ):
            return None
        has_attrs = False
        if attrs != EMPTY_ATTRS:  # most publications carry no attrs: no decoding for them
            try:
                decoded = cbor2.loads(attrs)
            except (ValueError, cbor2.CBORDecodeError):
                return None
            if not isinstance(decoded, dict):
                return None
            has_attrs = bool(decoded)  # an empty map however written: no attrs item
        # subject's key and value and msg_id's key, encoded once per subject and batch.
        around = self._subjects.get(subject)
        try:
            if around is None:
                around = self._subjects[subject] = _K_SUBJECT + cbor2.dumps(subject) + _K_MSG_ID
            text = msg_id.encode()
        except UnicodeEncodeError:  # a lone surrogate: encode() refuses it too
            return None
        size = len(text)
        parts = [
            around,
            _ONE_BYTE[_MAJOR_TEXT | size] if size < 24 else _cbor_head(_MAJOR_TEXT, size),
            text,
            _PUBLISHED_AT(_K_PUBLISHED_AT, 0xFB, published_at),  # cbor2: a double, always
        ]
        items = 6  # op, nseq, sub_id, subject, msg_id, published_at
        if has_attrs:
            parts += (_K_ATTRS, attrs)
            items += 1
        if payload:
            n = len(payload)
            head = _HEAD8(_MAJOR_BYTES | 24, n) if 24 <= n < 0x100 else _cbor_head(_MAJOR_BYTES, n)
            parts += (_K_PAYLOAD, head, payload)
            items += 1
        return b"".join(parts), items


# ---------------------------------------------------------------------------------------
# The commonest inbound frames and replies
# ---------------------------------------------------------------------------------------

# An ``ack`` frame as every agent encodes it (``encode``: op first), less its integer.
_ACK_PREFIX = encode(Ack(upto=0))[:-1]
_UINT_SIZES = {24: 1, 25: 2, 26: 4, 27: 8}  # CBOR unsigned heads with a following integer


# A ``pub`` frame as every agent encodes it without attrs, urgent or qclass (``encode``:
# op, req, msg_id, subject, then payload unless empty): its fixed items.
_PUB_HEAD = cbor2.dumps("op") + cbor2.dumps(Pub.op) + cbor2.dumps("req")
_PUB_MAPS = (0xA4, 0xA5)  # CBOR maps of 4 and 5 items


def _head(data: bytes, pos: int, major: int) -> tuple[int, int]:
    """The argument of the definite-length CBOR head of type ``major`` at ``pos`` and the
    position after it; ValueError or IndexError for anything else."""
    byte = data[pos]
    if byte >> 5 != major:
        raise ValueError("another type")
    info = byte & 0x1F
    if info < 24:
        return info, pos + 1
    size = _UINT_SIZES[info]  # KeyError (a LookupError) for indefinite or reserved
    end = pos + 1 + size
    if end > len(data):
        raise IndexError("short")
    return int.from_bytes(data[pos + 1 : end], "big"), end


def _decode_pub(data: bytes) -> Pub | None:
    """The ``pub`` frame of ``data`` if it has exactly the usual shape (see _PUB_HEAD),
    built by ``Pub`` itself (so with all its checks); None for anything else, including
    a frame ``Pub`` refuses: the general decoder then gives the frame or the error."""
    try:
        pos = 1 + len(_PUB_HEAD)
        req, pos = _head(data, pos, 0)
        if not data.startswith(_K_MSG_ID, pos):
            return None
        size, pos = _head(data, pos + len(_K_MSG_ID), 3)
        msg_id = data[pos : pos + size].decode("utf-8")
        pos += size
        if not data.startswith(_K_SUBJECT, pos):
            return None
        size, pos = _head(data, pos + len(_K_SUBJECT), 3)
        subject = data[pos : pos + size].decode("utf-8")
        pos += size
        payload = b""
        if data[0] == 0xA5:
            if not data.startswith(_K_PAYLOAD, pos):
                return None
            size, pos = _head(data, pos + len(_K_PAYLOAD), 2)
            payload = data[pos : pos + size]
            pos += size
        if pos != len(data) or len(data) > MAX_FRAME_BYTES:
            return None
        return Pub(req=req, msg_id=msg_id, subject=subject, payload=payload)
    except (ValueError, LookupError, FrameError):  # UnicodeDecodeError is a ValueError
        return None


def decode_fast(data: bytes) -> Frame:
    """``decode(data)``, with short cuts for the commonest frames, an ``ack`` (one per
    notification; the general decoder's checks cost as much as handling it) and a
    ``pub`` without attrs (one per publish): the same frame or :class:`FrameError` for
    any input (tests/broker/test_notify_encoding.py)."""
    if data[:1] and data[0] in _PUB_MAPS and data.startswith(_PUB_HEAD, 1):
        pub = _decode_pub(data)
        if pub is not None:
            return pub
        return decode(data)
    start = len(_ACK_PREFIX)
    if data.startswith(_ACK_PREFIX) and len(data) > start:
        head = data[start]
        if head < 24 and len(data) == start + 1:
            return Ack(upto=head)
        size = _UINT_SIZES.get(head)
        if size is not None and len(data) == start + 1 + size:
            value = int.from_bytes(data[start + 1 :], "big")
            if value <= UINT63:
                return Ack(upto=value)
    return decode(data)


def encode_reply(frame: Frame) -> bytes:
    """``encode(frame)``, with a short cut for the commonest reply, a ``pub-ok`` (one per
    publish; the general encoder walks the dataclass's fields and defaults): the same
    bytes (tests/broker/test_notify_encoding.py). A ``pub-ok`` has no field with a
    default, so ``encode`` writes all three after ``op``, in this order."""
    if type(frame) is PubOk:
        # Far below MAX_FRAME_BYTES: msg_id is at most MAX_ID_LENGTH characters.
        return cbor2.dumps(
            {"op": "pub-ok", "req": frame.req, "msg_id": frame.msg_id, "matched": frame.matched}
        )
    return encode(frame)
