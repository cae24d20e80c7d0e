"""URIs and structured header values: SIP/SIPS/tel URIs (RFC 3261 §19.1, RFC 3966),
name-addr / addr-spec (§20.10), Via with received/rport (§18.2.1, RFC 3581), CSeq.

Every type has ``parse(text)`` (raises :class:`SipParseError`) and ``__str__``
that prints it back. The user part of a SIP URI is stored %-unescaped and
re-escaped on output, so ``sip:a%40b@h`` keeps meaning user ``a@b``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from urllib.parse import quote as _pct_quote
from urllib.parse import unquote as _pct_unquote

from sip.errors import SipParseError
from sip.headers import (
    TOKEN_CHARS,
    format_params,
    is_token,
    parse_params,
    quote,
    read_quoted,
    unquote_param,
)

# §25.1 user unreserved + unreserved + the few marks allowed unescaped in user.
_USER_SAFE = "-_.!~*'()&=+$,;/"  # '?' escaped: it would start URI headers
_PASSWORD_SAFE = "-_.!~*'()&=+$,"
_HOST_RE = re.compile(
    r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9.])?|[A-Za-z0-9])$"
)
_PCT_RE = re.compile(r"%(?![0-9A-Fa-f]{2})")


def bounded_int(text: str, max_digits: int, what: str, pos: int = 0) -> int:
    """A decimal of at most ``max_digits`` ASCII digits (leading zeros allowed up to that).

    Every numeric field the parser reads goes through here, so a 5,000-digit port or
    CSeq is a :class:`SipParseError` (400 / drop), never the ``ValueError`` that
    ``int()`` raises past Python's digit limit. Raises :class:`SipParseError`.
    """
    if not text or len(text) > max_digits or not text.isascii() or not text.isdigit():
        raise SipParseError(pos, f"bad {what} {text[:20]!r}")
    return int(text)


def _unescape(text: str, pos: int) -> str:
    bad = _PCT_RE.search(text)
    if bad:
        raise SipParseError(pos + bad.start(), "bad %-escape")
    return _pct_unquote(text, errors="surrogateescape")


def _split_hostport(text: str, pos: int) -> tuple[str, int | None]:
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            raise SipParseError(pos, "unterminated IPv6 reference")
        host, rest = text[: end + 1], text[end + 1 :]
    else:
        host, sep, port_text = text.partition(":")
        rest = ":" + port_text if sep else ""
    if not host or not _HOST_RE.match(host):
        raise SipParseError(pos, f"bad host {host!r}")
    port: int | None = None
    if rest:
        if not rest.startswith(":"):
            raise SipParseError(pos + len(host), f"bad port {rest[:20]!r}")
        port = bounded_int(rest[1:], 5, "port", pos + len(host))
        if port > 65535:
            raise SipParseError(pos + len(host), f"port out of range: {port}")
    return host, port


def format_hostport(host: str, port: int | None) -> str:
    """``host[:port]`` with IPv6 literals bracketed."""
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return host if port is None else f"{host}:{port}"


@dataclass(slots=True)
class SipUri:
    """A ``sip:`` or ``sips:`` URI (§19.1.1). ``params``/``headers`` keep their order."""

    host: str
    user: str | None = None
    password: str | None = None
    port: int | None = None
    scheme: str = "sip"
    params: dict[str, str | None] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str) -> SipUri:
        """Parse a SIP/SIPS URI. Raises :class:`SipParseError`."""
        scheme, colon, rest = text.partition(":")
        if not colon or scheme.lower() not in ("sip", "sips"):
            raise SipParseError(0, f"not a sip/sips URI: {text[:40]!r}")
        offset = len(scheme) + 1
        if any(c in rest for c in ' \t\r\n<>"'):
            raise SipParseError(offset, "whitespace or delimiter in URI")
        user: str | None = None
        password: str | None = None
        # An unescaped '@' ends the userinfo: user, password, parameters and headers may
        # hold one only escaped (§25.1), while the user may hold '?' and ';' (RFC 4475
        # §3.1.1.2), so the '@' is found before the headers are split off.
        at = rest.find("@")
        header_text = ""
        if "?" in rest[at + 1 :]:
            head, _, header_text = rest[at + 1 :].partition("?")
            rest = rest[: at + 1] + head
        if at >= 0:
            userinfo = rest[:at]
            rest_host = rest[at + 1 :]
            upart, pcolon, pw = userinfo.partition(":")
            if not upart:
                raise SipParseError(offset, "empty user part")
            user = _unescape(upart, offset)
            password = _unescape(pw, offset) if pcolon else None
            offset += at + 1
            rest = rest_host
        hostport, _, param_text = rest.partition(";")
        host, port = _split_hostport(hostport, offset)
        params = parse_params(";" + param_text, offset) if param_text or rest.endswith(";") else {}
        headers: dict[str, str] = {}
        if header_text:
            for item in header_text.split("&"):
                name, eq, value = item.partition("=")
                if not name or not eq:
                    raise SipParseError(offset, f"bad URI header {item!r}")
                headers[_unescape(name, offset)] = _unescape(value, offset)
        return cls(
            host=host,
            user=user,
            password=password,
            port=port,
            scheme=scheme.lower(),
            params=params,
            headers=headers,
        )

    def __str__(self) -> str:
        out = [self.scheme, ":"]
        if self.user is not None:
            out.append(_pct_quote(self.user, safe=_USER_SAFE, errors="surrogateescape"))
            if self.password is not None:
                out.append(":" + _pct_quote(self.password, safe=_PASSWORD_SAFE))
            out.append("@")
        out.append(format_hostport(self.host, self.port))
        out.append(format_params(self.params))
        if self.headers:
            out.append(
                "?"
                + "&".join(
                    f"{_pct_quote(k, safe='')}={_pct_quote(v, safe='-_.!~*()[]/:+$')}"
                    for k, v in self.headers.items()
                )
            )
        return "".join(out)

    @property
    def transport(self) -> str:
        """The ``transport`` parameter, lower-cased, default ``udp`` (``tls`` for sips)."""
        value = self.params.get("transport")
        if value:
            return value.lower()
        return "tls" if self.scheme == "sips" else "udp"

    @property
    def aor(self) -> str:
        """``scheme:user@host`` without port, params or headers (the address-of-record key)."""
        user = (
            _pct_quote(self.user, safe=_USER_SAFE, errors="surrogateescape") + "@"
            if self.user is not None
            else ""
        )
        return f"{self.scheme}:{user}{self.host.lower()}"


@dataclass(slots=True)
class TelUri:
    """A ``tel:`` URI (RFC 3966): the number and its parameters."""

    number: str
    params: dict[str, str | None] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str) -> TelUri:
        """Parse a tel URI. Raises :class:`SipParseError`."""
        scheme, colon, rest = text.partition(":")
        if not colon or scheme.lower() != "tel":
            raise SipParseError(0, "not a tel URI")
        number, _, param_text = rest.partition(";")
        if not number or not re.fullmatch(r"\+?[0-9A-Fa-f*#().\-]+", number):
            raise SipParseError(4, f"bad telephone number {number!r}")
        params = parse_params(";" + param_text, 4 + len(number)) if param_text else {}
        return cls(number=number, params=params)

    def __str__(self) -> str:
        return f"tel:{self.number}{format_params(self.params)}"


@dataclass(slots=True)
class AbsoluteUri:
    """Any other absolute URI (e.g. ``urn:``, ``mailto:``), kept as text."""

    text: str

    def __str__(self) -> str:
        return self.text


Uri = SipUri | TelUri | AbsoluteUri

_SCHEME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*:")


def parse_uri(text: str) -> Uri:
    """Parse any URI: SIP/SIPS and tel are structured, others kept as text.

    Raises :class:`SipParseError`.
    """
    if not _SCHEME_RE.match(text):
        raise SipParseError(0, f"not a URI: {text[:40]!r}")
    scheme = text.split(":", 1)[0].lower()
    if scheme in ("sip", "sips"):
        return SipUri.parse(text)
    if scheme == "tel":
        return TelUri.parse(text)
    if any(c in text for c in " \t\r\n<>"):
        raise SipParseError(0, "whitespace in URI")
    return AbsoluteUri(text)


@dataclass(slots=True)
class NameAddr:
    """``[display-name] <uri> *(;param)`` or ``addr-spec *(;param)`` (§20.10, §25.1).

    In addr-spec form (no ``<>``) every ``;param`` belongs to the header, never
    to the URI, and the URI may not contain ``,``, ``?`` or ``;`` (§20).
    """

    uri: Uri
    display_name: str | None = None
    params: dict[str, str | None] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str) -> NameAddr:
        """Parse one From/To/Contact/Route value. Raises :class:`SipParseError`."""
        text = text.strip()
        display: str | None = None
        i = 0
        if text.startswith('"'):
            display, i = read_quoted(text, 0)
            while i < len(text) and text[i] in " \t":
                i += 1
            if i >= len(text) or text[i] != "<":
                raise SipParseError(i, "expected '<' after display name")
        elif "<" in text:
            lt = text.index("<")
            words = text[:lt].strip()
            if words:
                if not all(is_token(w) for w in words.split()):
                    raise SipParseError(0, "bad display name")
                display = " ".join(words.split())
            i = lt
        if i < len(text) and text[i] == "<":
            end = text.find(">", i)
            if end < 0:
                raise SipParseError(i, "unterminated '<'")
            uri = parse_uri(text[i + 1 : end])
            params = parse_params(text[end + 1 :], end + 1)
            return cls(uri=uri, display_name=display, params=params)
        semi = text.find(";")
        uri_text = text if semi < 0 else text[:semi]
        if not uri_text:
            raise SipParseError(0, "empty address")
        uri = parse_uri(uri_text.strip())
        if isinstance(uri, SipUri) and uri.headers:
            raise SipParseError(0, "URI headers need the <> form")
        params = parse_params(text[semi:], semi) if semi >= 0 else {}
        return cls(uri=uri, params=params)

    def __str__(self) -> str:
        name = ""
        if self.display_name is not None:
            name = (
                self.display_name
                if all(is_token(w) for w in self.display_name.split()) and self.display_name
                else quote(self.display_name)
            ) + " "
        return f"{name}<{self.uri}>{format_params(self.params)}"

    @property
    def tag(self) -> str | None:
        """The ``tag`` parameter (From/To)."""
        return self.params.get("tag")

    @property
    def expires(self) -> int | None:
        """The Contact ``expires`` parameter or None. Raises :class:`SipParseError`."""
        value = unquote_param(self.params.get("expires"))
        if value is None:
            return None
        return bounded_int(value, 10, "expires parameter")

    @property
    def q(self) -> float:
        """The Contact ``q`` parameter, default 1.0. Raises :class:`SipParseError` if malformed."""
        value = self.params.get("q")
        if value is None:
            return 1.0
        if not re.fullmatch(r"(0(\.\d{0,3})?|1(\.0{0,3})?)", value):
            raise SipParseError(0, f"bad q value {value!r}")
        return float(value)


_VIA_SENT_RE = re.compile(
    r"^([A-Za-z0-9.!%*_+`'~\-]+)\s*/\s*([A-Za-z0-9.!%*_+`'~\-]+)\s*/\s*([A-Za-z0-9.!%*_+`'~\-]+)\s+(.*)$",
    re.S,
)


@dataclass(slots=True)
class Via:
    """One Via value (§20.42) with received/rport (RFC 3581).

    ``params`` keeps order; ``rport`` is None when absent, ``""`` when present
    without a value (the request asks for it) or the port text once filled in.
    """

    transport: str
    host: str
    port: int | None = None
    params: dict[str, str | None] = field(default_factory=dict)
    protocol: str = "SIP/2.0"

    @classmethod
    def parse(cls, text: str) -> Via:
        """Parse one Via value. Raises :class:`SipParseError`."""
        m = _VIA_SENT_RE.match(text.strip())
        if not m:
            raise SipParseError(0, "bad Via sent-protocol")
        name, version, transport, rest = m.groups()
        rest = rest.strip()
        semi = rest.find(";")
        hostport = (rest if semi < 0 else rest[:semi]).strip()
        # §25.1 allows LWS around ':' in sent-by; strip it.
        hostport = re.sub(r"\s*:\s*", ":", hostport) if not hostport.startswith("[") else hostport
        host, port = _split_hostport(hostport, 0)
        params = parse_params(rest[semi:], semi) if semi >= 0 else {}
        if "branch" in params and not params["branch"]:
            raise SipParseError(0, "empty branch")
        rport = params.get("rport")
        if rport and bounded_int(rport, 5, "rport") > 65535:
            raise SipParseError(0, f"bad rport {rport!r}")
        return cls(
            transport=transport.upper(),
            host=host,
            port=port,
            params=params,
            protocol=f"{name}/{version}".upper(),
        )

    def __str__(self) -> str:
        return (
            f"{self.protocol}/{self.transport} {format_hostport(self.host, self.port)}"
            f"{format_params(self.params)}"
        )

    @property
    def branch(self) -> str | None:
        """The branch parameter (RFC 3261 transaction id when it starts with ``z9hG4bK``)."""
        return self.params.get("branch")

    @property
    def received(self) -> str | None:
        """The received parameter."""
        return self.params.get("received")

    @property
    def rport(self) -> int | None:
        """The rport value once filled in; None when absent or still empty."""
        value = self.params.get("rport")
        return bounded_int(value, 5, "rport") if value else None

    def response_address(self, default_port: int = 5060) -> tuple[str, int]:
        """Where to send a response over UDP (§18.2.2 with RFC 3581 §4)."""
        host = self.received or self.host
        if host.startswith("["):
            host = host[1:-1]
        port = self.rport or self.port or default_port
        return host, port

    def stamp(self, source_host: str, source_port: int) -> None:
        """Add ``received`` and fill ``rport`` as a server must (§18.2.1, RFC 3581 §4)."""
        bare = self.host[1:-1] if self.host.startswith("[") else self.host
        # A received the sender wrote itself is replaced too: answers would go where it says.
        if bare != source_host or "rport" in self.params or "received" in self.params:
            self.params["received"] = source_host
        if "rport" in self.params:
            self.params["rport"] = str(source_port)


@dataclass(slots=True, frozen=True)
class CSeq:
    """The CSeq header (§20.16): sequence number and method."""

    seq: int
    method: str

    @classmethod
    def parse(cls, text: str) -> CSeq:
        """Parse a CSeq value. Raises :class:`SipParseError`."""
        parts = text.split()
        if len(parts) != 2:
            raise SipParseError(0, f"bad CSeq {text[:40]!r}")
        seq = bounded_int(parts[0], 10, "CSeq number")
        if seq >= 2**31:
            raise SipParseError(0, "CSeq number out of range")
        if not is_token(parts[1]):
            raise SipParseError(len(parts[0]) + 1, "bad CSeq method")
        return cls(seq=seq, method=parts[1])

    def __str__(self) -> str:
        return f"{self.seq} {self.method}"


__all__ = [
    "TOKEN_CHARS",
    "AbsoluteUri",
    "CSeq",
    "NameAddr",
    "SipUri",
    "TelUri",
    "Uri",
    "Via",
    "bounded_int",
    "format_hostport",
    "parse_uri",
    "unquote_param",
]
