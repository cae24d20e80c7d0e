"""The mdeci SDP profile (docs/protocol.md §3): offers, answers (RFC 3264) and their reading.

Theory of operation: a session description is read with ``sdp_transform``
into its dict form and written back from one; this module only decides what
goes in. Our data channel is one media line::

    m=application <port> UDP/MDECI-RUDP mdeci
    a=mdeci-version:2
    a=mdeci-kx:<base64url of 32 bytes>      (X25519 public value; offer, and answer
                                             when it starts new keys)
    a=mdeci-msisdn:<E.164>                  (optional; the broker ignores it)
    a=sendrecv

The QUIC data channel (``quicdata``) is the same line with proto ``UDP/MDECI-QUIC``;
the answer that accepts it adds ``a=fingerprint:sha-256 <AB:CD:...>`` (RFC 8122), the
broker certificate's. An offer may carry both lines, in the order of its preference;
the answer accepts the first one of a transport the answerer takes and refuses every
other with port 0.

No key material travels in SDP: ``a=mdeci-kx`` is an ephemeral public value; the
RUDP keys come from it through :mod:`rudp.keys` (docs/security.md). An offer
with the version 1 ``a=mdeci-key`` (a session key in clear) is refused.

:func:`build_offer` writes it (after an optional inactive audio placeholder,
which PJSIP's pjsua needs, see docs/pjsip.md). :func:`build_answer` answers an
offer line by line as RFC 3264 §6 asks: same number and order of m-lines;
the first usable mdeci line accepted; audio accepted as ``a=inactive`` with a
non-zero port; anything else refused with port 0. :func:`parse_session`
reads the mdeci line of an offer or answer into :class:`MdeciMedia`.

Every failure to read or answer is a :class:`sip.errors.SdpError` (status
488, RFC 3261 §21.4.26), and nothing else escapes: the fuzz tests hold us to
that.

Two places where ``sdp_transform`` loses information are re-read from the
raw lines: its ``m=`` grammar (``[\\w/]*``) stops at the ``-`` of
``UDP/MDECI-RUDP`` and drops the format list, and it turns numeric-looking
``o=`` fields into numbers (``1e5`` becomes ``100000.0``).
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import sdp_transform

from sip.errors import SdpError

__all__ = [
    "MDECI_FORMAT",
    "MDECI_PROTO",
    "MDECI_QUIC_PROTO",
    "MDECI_VERSION",
    "TRANSPORTS",
    "MdeciMedia",
    "SessionDescription",
    "build_answer",
    "build_offer",
    "decode_key",
    "encode_key",
    "parse_session",
    "read_description",
    "stored_key",
]

MDECI_PROTO = "UDP/MDECI-RUDP"
MDECI_QUIC_PROTO = "UDP/MDECI-QUIC"
#: Each data channel's name (configs, ``MdeciMedia.transport``) and its m-line proto.
TRANSPORTS = {"rudp": MDECI_PROTO, "quic": MDECI_QUIC_PROTO}
_TRANSPORT_OF = {proto: name for name, proto in TRANSPORTS.items()}
FINGERPRINT_BYTES = 32  # SHA-256
MDECI_FORMAT = "mdeci"
MDECI_VERSION = 2
KEY_BYTES = 32  # of an X25519 public value
MAX_SDP_BYTES = 65536
_KX_LINE = "a=mdeci-kx:"  # what stored_key looks for
# Port of the inactive audio line in our answers: RFC 3264 §6 wants a
# non-zero port to accept a stream; 9 (discard) is the usual "no media here"
# port (RFC 8840 §4.1 uses it for the same reason).
AUDIO_PLACEHOLDER_ANSWER_PORT = 9

_B64URL = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
_E164 = re.compile(r"\+[1-9][0-9]{1,14}")
# RFC 8866 §5.14: m=<media> <port>[/<number of ports>] <proto> <fmt> ...
_M_LINE = re.compile(r"([A-Za-z0-9_.!%*+`'~-]+) ([0-9]{1,5})(?:/[0-9]{1,5})? (\S+)((?: \S+)*) *")
# RFC 8866 §5.2: o=<username> <sess-id> <sess-version> <nettype> <addrtype> <address>
_O_LINE = re.compile(r"(\S+) ([0-9]{1,20}) ([0-9]{1,20}) IN (IP4|IP6) (\S+) *")


def encode_key(key: bytes) -> str:
    """The ``a=mdeci-kx`` text: base64url without padding. Raises :class:`ValueError`."""
    if len(key) != KEY_BYTES:
        raise ValueError(f"a public value is {KEY_BYTES} bytes, not {len(key)}")
    return base64.urlsafe_b64encode(key).rstrip(b"=").decode("ascii")


def decode_key(text: str) -> bytes:
    """Read a base64url key (padded or not). Raises :class:`SdpError` unless it is 32 bytes."""
    body = text.rstrip("=")
    if len(text) - len(body) > 2 or not set(body) <= _B64URL:
        raise SdpError("mdeci-kx is not base64url")
    try:
        key = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
    except (binascii.Error, ValueError):
        raise SdpError("mdeci-kx is not base64url") from None
    if len(key) != KEY_BYTES:
        raise SdpError(f"mdeci-kx must be {KEY_BYTES} bytes, got {len(key)}")
    return key


@dataclass(frozen=True, slots=True)
class MdeciMedia:
    """The mdeci data channel of a session description.

    ``addr``/``port``: where the peer receives RUDP (media-level ``c=`` if
    any, else session-level); ``key``: the peer's X25519 public value
    (``a=mdeci-kx``; None in an answer that keeps the keys); ``msisdn``: SMS
    fallback number or None; ``version``: the ``o=``
    sess-version (it grows on every re-INVITE, RFC 3264 §8); ``sess_id`` and
    ``user``: the rest of ``o=``; ``index``: position of our m-line;
    ``ip_version``: 4 or 6; ``transport``: ``"rudp"`` or ``"quic"`` (the line's proto);
    ``fingerprint``: the SHA-256 certificate fingerprint of ``a=fingerprint:sha-256``
    (a QUIC answer's), or None.
    """

    addr: str
    port: int
    key: bytes | None
    msisdn: str | None
    version: int
    sess_id: str = "0"
    user: str = "-"
    index: int = 0
    ip_version: int = 4
    mdeci_version: int = MDECI_VERSION
    transport: str = "rudp"
    fingerprint: bytes | None = None


@dataclass(frozen=True, slots=True)
class _MLine:
    media: str
    port: int
    proto: str
    formats: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class _Origin:
    user: str
    sess_id: str
    version: int
    ip_version: int
    addr: str


# ------------------------------------------------------------------ helpers


def _ip_version(addr: str) -> int:
    """4 or 6 for an IP literal. Raises :class:`ValueError` otherwise."""
    return ipaddress.ip_address(addr).version


def _check_port(port: int, *, allow_zero: bool = False) -> None:
    if not isinstance(port, int) or not (0 if allow_zero else 1) <= port <= 65535:
        raise ValueError(f"bad port {port!r}")


def _attributes(media: dict[str, Any]) -> list[tuple[str, str]]:
    """The a= lines sdp_transform did not understand, as (name, value) pairs."""
    out: list[tuple[str, str]] = []
    for item in media.get("invalid", []):
        text = str(item.get("value", "")) if isinstance(item, dict) else ""
        name, _, value = text.partition(":")
        out.append((name.strip(), value.strip()))
    return out


def _as_text(data: str | bytes) -> str:
    if isinstance(data, bytes | bytearray):
        if len(data) > MAX_SDP_BYTES:
            raise SdpError("session description too large")
        try:
            return bytes(data).decode("utf-8")
        except UnicodeDecodeError:
            raise SdpError("session description is not UTF-8") from None
    if not isinstance(data, str):
        raise SdpError("session description must be text")
    if len(data) > MAX_SDP_BYTES:
        raise SdpError("session description too large")
    return data


def _read(text: str) -> tuple[dict[str, Any], list[_MLine], _Origin]:
    """Parse with sdp_transform plus our re-reading of ``m=`` and ``o=``.

    Raises :class:`SdpError` for anything that is not an RFC 8866 session
    description we can work with.
    """
    lines = text.splitlines()
    if not lines or lines[0].strip() != "v=0":
        raise SdpError("session description must start with v=0")
    try:
        session: dict[str, Any] = sdp_transform.parse(text)
    except Exception as exc:  # a third-party parser: any failure is bad SDP
        raise SdpError(f"unreadable session description: {type(exc).__name__}") from None
    # sdp_transform makes one media dict per line starting with "m=", in order.
    raw_m = [line[2:] for line in lines if line.startswith("m=")]
    media = session.get("media")
    if not isinstance(media, list) or len(media) != len(raw_m):
        raise SdpError("media sections could not be read")
    mlines: list[_MLine] = []
    for idx, raw in enumerate(raw_m):
        match = _M_LINE.fullmatch(raw)
        if not match:
            raise SdpError(f"bad m= line {idx}: {raw[:60]!r}")
        port = int(match.group(2))
        if port > 65535:
            raise SdpError(f"bad port in m= line {idx}")
        formats = tuple(match.group(4).split())
        if not formats:
            raise SdpError(f"m= line {idx} has no format")
        mlines.append(_MLine(match.group(1), port, match.group(3), formats))
    raw_o = [line[2:] for line in lines if line.startswith("o=")]
    if len(raw_o) != 1:
        raise SdpError("exactly one o= line is required (RFC 8866 §5.2)")
    omatch = _O_LINE.fullmatch(raw_o[0])
    if not omatch:
        raise SdpError(f"bad o= line {raw_o[0][:60]!r}")
    origin = _Origin(
        user=omatch.group(1),
        sess_id=omatch.group(2),
        version=int(omatch.group(3)),
        ip_version=4 if omatch.group(4) == "IP4" else 6,
        addr=omatch.group(5),
    )
    return session, mlines, origin


def _connection(session: dict[str, Any], media: dict[str, Any]) -> tuple[str, int]:
    """The ``c=`` address of a media section (§5.7: media level wins). Raises SdpError."""
    conn = media.get("connection") or session.get("connection")
    if not isinstance(conn, dict) or "ip" not in conn:
        raise SdpError("no c= line for the mdeci media")
    addr = str(conn.get("ip"))
    declared = conn.get("version")
    try:
        version = _ip_version(addr)
    except ValueError:
        raise SdpError(f"c= address is not an IP literal: {addr[:60]!r}") from None
    if declared != version:
        raise SdpError(f"c= says IP{declared} but the address is IPv{version}")
    return addr, version


def _direction(session: dict[str, Any], media: dict[str, Any]) -> str:
    value = media.get("direction") or session.get("direction") or "sendrecv"
    return str(value)


def _check_transports(transports: Sequence[str]) -> None:
    unknown = [t for t in transports if t not in TRANSPORTS]
    if unknown or not transports:
        raise ValueError(f"transports are some of {sorted(TRANSPORTS)}, not {list(transports)}")


def _is_usable(
    mline: _MLine, media: dict[str, Any], session: dict[str, Any], transports: Sequence[str]
) -> bool:
    """An mdeci line we can accept: enabled, the proto of one of ``transports`` and our
    format, our version, both ways."""
    if mline.media.lower() != "application" or mline.port == 0:
        return False
    if _TRANSPORT_OF.get(mline.proto.upper()) not in transports:
        return False
    if MDECI_FORMAT not in mline.formats:
        return False
    versions = [v for n, v in _attributes(media) if n == "mdeci-version"]
    if versions and str(MDECI_VERSION) not in versions:
        return False
    # RUDP needs both directions; RFC 3264 §6.1 would let us answer a
    # sendonly offer recvonly, but a one-way channel is of no use to us.
    return _direction(session, media) == "sendrecv"


def _fingerprint(session: dict[str, Any], media: dict[str, Any]) -> bytes | None:
    """The ``a=fingerprint:sha-256`` value (media level wins, RFC 8122 §5), or None. Raises
    SdpError when it is malformed."""
    value = media.get("fingerprint") or session.get("fingerprint")
    if not isinstance(value, dict) or str(value.get("type", "")).lower() != "sha-256":
        return None
    parts = str(value.get("hash", "")).split(":")
    if len(parts) != FINGERPRINT_BYTES or any(
        len(p) != 2 or not set(p) <= set("0123456789abcdefABCDEF") for p in parts
    ):
        raise SdpError("a=fingerprint:sha-256 is not 32 colon-separated hex bytes")
    return bytes(int(p, 16) for p in parts)


def _mdeci(
    session: dict[str, Any],
    mlines: Sequence[_MLine],
    origin: _Origin,
    *,
    require_key: bool,
    transports: Sequence[str] = ("rudp",),
) -> MdeciMedia:
    for idx, (mline, media) in enumerate(zip(mlines, session["media"], strict=True)):
        if not _is_usable(mline, media, session, transports):
            continue
        addr, ip_version = _connection(session, media)
        attrs = _attributes(media)
        if any(n == "mdeci-key" for n, _ in attrs):
            raise SdpError("a=mdeci-key (a session key in clear) is refused; use a=mdeci-kx")
        keys = [v for n, v in attrs if n == "mdeci-kx"]
        if len(keys) > 1:
            raise SdpError("more than one mdeci-kx")
        key = decode_key(keys[0]) if keys else None
        if require_key and key is None:
            raise SdpError("offer without mdeci-kx")
        numbers = [v for n, v in attrs if n == "mdeci-msisdn"]
        if len(numbers) > 1:
            raise SdpError("more than one mdeci-msisdn")
        msisdn = numbers[0] if numbers else None
        if msisdn is not None and not _E164.fullmatch(msisdn):
            raise SdpError(f"mdeci-msisdn is not an E.164 number: {msisdn[:30]!r}")
        return MdeciMedia(
            addr=addr,
            port=mline.port,
            key=key,
            msisdn=msisdn,
            version=origin.version,
            sess_id=origin.sess_id,
            user=origin.user,
            index=idx,
            ip_version=ip_version,
            transport=_TRANSPORT_OF[mline.proto.upper()],
            fingerprint=_fingerprint(session, media),
        )
    protos = " or ".join(TRANSPORTS[t] for t in transports)
    raise SdpError(f"no usable m=application <port> {protos} {MDECI_FORMAT} line")


# ------------------------------------------------------------------ public


@dataclass(frozen=True, slots=True)
class SessionDescription:
    """A session description read once (:func:`read_description`), so that reading its
    mdeci line (:func:`parse_session`) and answering it (:func:`build_answer`) do not
    parse the text twice: parsing is most of what either costs."""

    session: dict[str, Any]
    mlines: tuple[_MLine, ...]
    origin: _Origin


def read_description(sdp_text: str | bytes) -> SessionDescription:
    """Parse a session description. Raises :class:`SdpError` (488) when it is not one we
    can work with."""
    session, mlines, origin = _read(_as_text(sdp_text))
    return SessionDescription(session, tuple(mlines), origin)


def _described(sdp: str | bytes | SessionDescription) -> SessionDescription:
    return sdp if isinstance(sdp, SessionDescription) else read_description(sdp)


def parse_session(
    sdp_text: str | bytes | SessionDescription,
    *,
    require_key: bool = False,
    transports: Sequence[str] = ("rudp",),
) -> MdeciMedia:
    """Read the first usable mdeci line of one of ``transports`` in an offer or answer.

    With ``require_key`` an offer without ``a=mdeci-kx`` is refused. Raises
    :class:`SdpError` (status 488) when the text is not a session
    description, has no usable mdeci line, or carries a malformed key,
    address or MSISDN.
    """
    _check_transports(transports)
    sdp = _described(sdp_text)
    return _mdeci(
        sdp.session, sdp.mlines, sdp.origin, require_key=require_key, transports=transports
    )


def stored_key(sdp_text: str, transport: str = "rudp") -> bytes | None:
    """The ``a=mdeci-kx`` value of a description this side accepted before (a restarted
    broker reads back thousands of stored offers): when every such line carries the same
    value, read without parsing the rest; otherwise :func:`parse_session` decides, for
    the line of ``transport``. Raises :class:`SdpError` as :func:`parse_session` does."""
    values = {
        line[len(_KX_LINE) :].strip() for line in sdp_text.splitlines() if line.startswith(_KX_LINE)
    }
    if len(values) == 1:
        return decode_key(values.pop())
    return parse_session(sdp_text, transports=(transport,)).key


def _session_dict(user: str, sess_id: int | str, version: int, addr: str) -> dict[str, Any]:
    if not user or any(c.isspace() for c in user):
        raise ValueError(f"bad o= username {user!r}")
    if not str(sess_id).isdigit() or not str(sess_id).isascii():
        raise ValueError(f"sess-id must be digits, not {sess_id!r}")
    if not isinstance(version, int) or version < 0:
        raise ValueError(f"bad sess-version {version!r}")
    ip_version = _ip_version(addr)
    return {
        "version": 0,
        "origin": {
            "username": user,
            "sessionId": str(sess_id),
            "sessionVersion": version,
            "netType": "IN",
            "ipVer": ip_version,
            "address": addr,
        },
        "name": "mdeci",
        "connection": {"version": ip_version, "ip": addr},
        "timing": {"start": 0, "stop": 0},
        "media": [],
    }


def _mdeci_media(
    port: int,
    key: bytes | None,
    msisdn: str | None,
    transport: str = "rudp",
    fingerprint: bytes | None = None,
) -> dict[str, Any]:
    attrs = [f"mdeci-version:{MDECI_VERSION}"]
    if key is not None:
        attrs.append(f"mdeci-kx:{encode_key(key)}")
    if msisdn is not None:
        if not _E164.fullmatch(msisdn):
            raise ValueError(f"msisdn must be E.164 (+ and up to 15 digits), not {msisdn!r}")
        attrs.append(f"mdeci-msisdn:{msisdn}")
    # Direction is written as a plain attribute so it comes last, as docs/protocol.md shows.
    attrs.append("sendrecv")
    line: dict[str, Any] = {
        "type": "application",
        "port": port,
        "protocol": TRANSPORTS[transport],
        "payloads": MDECI_FORMAT,
        "invalid": [{"value": a} for a in attrs],
    }
    if fingerprint is not None:
        if len(fingerprint) != FINGERPRINT_BYTES:
            raise ValueError("a sha-256 fingerprint is 32 bytes")
        line["fingerprint"] = {
            "type": "sha-256",
            "hash": ":".join(f"{b:02X}" for b in fingerprint),
        }
    return line


def build_offer(
    user: str,
    sess_id: int | str,
    version: int,
    addr: str,
    port: int,
    key: bytes,
    msisdn: str | None = None,
    audio_placeholder_port: int | None = None,
    *,
    transports: Sequence[str] = ("rudp",),
    quic_port: int | None = None,
) -> str:
    """Our offer: optional inactive PCMU audio placeholder, then one mdeci line per
    transport, in the order of ``transports`` (our preference): RUDP's on ``port``,
    QUIC's on ``quic_port``.

    ``version`` is the ``o=`` sess-version (bump it on every re-INVITE,
    RFC 3264 §8); ``addr`` an IPv4 or IPv6 literal. Raises
    :class:`ValueError` on a bad argument (port, address, key length, MSISDN,
    transports, no ``quic_port`` for QUIC).
    """
    _check_port(port)
    _check_transports(transports)
    if "quic" in transports:
        if quic_port is None:
            raise ValueError("a QUIC line needs quic_port")
        _check_port(quic_port)
    session = _session_dict(user, sess_id, version, addr)
    if audio_placeholder_port is not None:
        _check_port(audio_placeholder_port, allow_zero=True)
        session["media"].append(
            {
                "type": "audio",
                "port": audio_placeholder_port,
                "protocol": "RTP/AVP",
                "payloads": "0",
                "rtp": [{"payload": 0, "codec": "PCMU", "rate": 8000}],
                "direction": "inactive",
            }
        )
    for transport in dict.fromkeys(transports):
        line_port = port if transport == "rudp" else quic_port
        assert line_port is not None
        session["media"].append(_mdeci_media(line_port, key, msisdn, transport))
    return str(sdp_transform.write(session))


def build_answer(
    offer_text: str | bytes | SessionDescription,
    user: str,
    sess_id: int | str,
    version: int,
    addr: str,
    port: int,
    msisdn: str | None = None,
    key: bytes | None = None,
    *,
    accept: Sequence[str] = ("rudp",),
    quic_port: int | None = None,
    fingerprint: bytes | None = None,
) -> str:
    """Answer an offer (RFC 3264 §6): every offered m-line, in order.

    The first usable mdeci line of a transport in ``accept`` (the offer's order is the
    offerer's preference) gets ``key`` (our X25519 public value, ``a=mdeci-kx``; None
    keeps the session's keys) and ``port`` for RUDP, or ``quic_port`` and the
    certificate ``fingerprint`` (``a=fingerprint:sha-256``) for QUIC; an audio line with
    a non-zero port is accepted ``a=inactive`` (port
    :data:`AUDIO_PLACEHOLDER_ANSWER_PORT`, the offer's first format); every
    other line, including further mdeci lines, is refused with port 0
    (§6: same media type, proto and a format of the offer). Raises
    :class:`SdpError` (488) when the offer is unreadable, has no usable mdeci
    line of an accepted transport or that line has no valid key;
    :class:`ValueError` on a bad argument of ours (QUIC accepted without
    ``quic_port`` and ``fingerprint``).
    """
    _check_port(port)
    _check_transports(accept)
    if "quic" in accept:
        if quic_port is None or fingerprint is None:
            raise ValueError("accepting QUIC needs quic_port and fingerprint")
        _check_port(quic_port)
    answer = _session_dict(user, sess_id, version, addr)
    described = _described(offer_text)
    offer, mlines = described.session, described.mlines
    chosen = _mdeci(offer, mlines, described.origin, require_key=True, transports=accept)
    timing = offer.get("timing")
    if isinstance(timing, dict) and isinstance(timing.get("start"), int):
        # RFC 3264 §6: "The t= line in the answer MUST equal that of the offer."
        answer["timing"] = {"start": timing["start"], "stop": timing.get("stop", 0)}
    for idx, (mline, media) in enumerate(zip(mlines, offer["media"], strict=True)):
        if idx == chosen.index and chosen.transport == "quic":
            assert quic_port is not None
            answer["media"].append(_mdeci_media(quic_port, key, msisdn, "quic", fingerprint))
        elif idx == chosen.index:
            answer["media"].append(_mdeci_media(port, key, msisdn))
        elif mline.media.lower() == "audio" and mline.port != 0:
            answer["media"].append(_inactive_audio(mline, media))
        else:
            answer["media"].append(
                {
                    "type": mline.media,
                    "port": 0,
                    "protocol": mline.proto,
                    "payloads": mline.formats[0],
                }
            )
    try:
        return str(sdp_transform.write(answer))
    except (TypeError, ValueError, KeyError) as exc:  # offer-derived values it cannot print
        raise SdpError(f"cannot write an answer to this offer: {exc}") from None


def _inactive_audio(mline: _MLine, media: dict[str, Any]) -> dict[str, Any]:
    fmt = mline.formats[0]
    out: dict[str, Any] = {
        "type": mline.media,
        "port": AUDIO_PLACEHOLDER_ANSWER_PORT,
        "protocol": mline.proto,
        "payloads": fmt,
        "direction": "inactive",
    }
    rtpmaps = [
        r
        for r in media.get("rtp", [])
        if isinstance(r, dict) and str(r.get("payload")) == fmt and r.get("codec")
    ]
    if rtpmaps:
        r = rtpmaps[0]
        out["rtp"] = [
            {k: r[k] for k in ("payload", "codec", "rate", "encoding") if r.get(k) is not None}
        ]
    return out
