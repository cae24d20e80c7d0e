"""SIP messages (RFC 3261 §7, §25): parse, serialize and frame on streams.

Theory of operation: :func:`parse_message` turns one datagram (or one framed
stream message) into a :class:`Request` or :class:`Response`; every failure is
a :class:`sip.errors.SipParseError` with a position and a reason, and nothing
else escapes (the fuzz tests hold us to that). Headers stay as text in a
:class:`Headers` container; structured views (:class:`Via`, :class:`NameAddr`,
:class:`CSeq`, :class:`SipUri`) are parsed on demand. :func:`serialize` writes
a message back with a correct Content-Length. :class:`StreamFramer` cuts a TCP
byte stream into messages by Content-Length (§18.3).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field

from sip.errors import SipParseError
from sip.headers import Headers, is_token
from sip.uri import CSeq, NameAddr, SipUri, TelUri, Uri, Via, parse_uri

# A control character but HTAB in a header value (§25.1 allows none): one C-level search
# per header line rather than a Python-level test per character.
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f]")

__all__ = [
    "CSeq",
    "Headers",
    "Message",
    "NameAddr",
    "Request",
    "Response",
    "SipUri",
    "StreamFramer",
    "TelUri",
    "Uri",
    "Via",
    "parse_message",
    "serialize",
]

SIP_VERSION = "SIP/2.0"
MAX_HEADER_BYTES = 65536
# Header fields per message (after unfolding). Real requests carry 10-30; a cap keeps a
# 60 KB wall of one-byte headers from costing tens of milliseconds of parsing each.
MAX_HEADER_FIELDS = 256
# Headers every request must carry (§8.1.1); a response needs the same (§8.2.6.2).
MANDATORY = ("Via", "From", "To", "Call-ID", "CSeq")
# Headers that may appear once (§20: no comma list in their grammar).
SINGLE = ("From", "To", "Call-ID", "CSeq", "Max-Forwards")


class _HeaderViews:
    """The parsed views of the headers every request and response carries (§8.1.1)."""

    headers: Headers

    @property
    def call_id(self) -> str:
        """The Call-ID ('' if missing)."""
        return self.headers.get("Call-ID") or ""

    @property
    def cseq(self) -> CSeq:
        """The CSeq header parsed. Raises :class:`SipParseError` if missing or bad."""
        return _cseq(self.headers)

    @property
    def top_via(self) -> Via:
        """The topmost Via parsed. Raises :class:`SipParseError` if missing or bad."""
        return _top_via(self.headers)

    @property
    def from_(self) -> NameAddr:
        """The From header parsed. Raises :class:`SipParseError`."""
        return _name_addr(self.headers, "From")

    @property
    def to(self) -> NameAddr:
        """The To header parsed. Raises :class:`SipParseError`."""
        return _name_addr(self.headers, "To")


@dataclass(eq=True)
class Request(_HeaderViews):
    """A SIP request. ``uri`` is the Request-URI as text (see :attr:`parsed_uri`)."""

    method: str
    uri: str
    headers: Headers = field(default_factory=Headers)
    body: bytes = b""
    # Bytes of the UDP datagram it came in (0: another transport, or built here): what
    # an answer to an unauthenticated request may not exceed (UaConfig.max_answer_ratio).
    udp_size: int = field(default=0, compare=False, repr=False)

    @property
    def parsed_uri(self) -> Uri:
        """The Request-URI parsed. Raises :class:`SipParseError`."""
        return parse_uri(self.uri)


@dataclass(eq=True)
class Response(_HeaderViews):
    """A SIP response."""

    status: int
    reason: str
    headers: Headers = field(default_factory=Headers)
    body: bytes = b""


Message = Request | Response


def _cseq(headers: Headers) -> CSeq:
    value = headers.get("CSeq")
    if value is None:
        raise SipParseError(0, "missing CSeq")
    return CSeq.parse(value)


def _top_via(headers: Headers) -> Via:
    value = headers.get("Via")
    if value is None:
        raise SipParseError(0, "missing Via")
    return Via.parse(value)


def _name_addr(headers: Headers, name: str) -> NameAddr:
    value = headers.get(name)
    if value is None:
        raise SipParseError(0, f"missing {name}")
    return NameAddr.parse(value)


# Status line reason phrases we emit by default (§21).
REASONS = {
    100: "Trying",
    180: "Ringing",
    181: "Call Is Being Forwarded",
    182: "Queued",
    183: "Session Progress",
    200: "OK",
    202: "Accepted",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    407: "Proxy Authentication Required",
    408: "Request Timeout",
    415: "Unsupported Media Type",
    420: "Bad Extension",
    423: "Interval Too Brief",
    480: "Temporarily Unavailable",
    481: "Call/Transaction Does Not Exist",
    482: "Loop Detected",
    483: "Too Many Hops",
    486: "Busy Here",
    487: "Request Terminated",
    488: "Not Acceptable Here",
    491: "Request Pending",
    500: "Server Internal Error",
    501: "Not Implemented",
    503: "Service Unavailable",
    504: "Server Time-out",
    505: "Version Not Supported",
    603: "Decline",
}


def _split_head(data: bytes) -> tuple[bytes, bytes]:
    """Split at the empty line; accept bare LF line ends as RFC 3261 §7.5 lets us be lenient."""
    crlf = data.find(b"\r\n\r\n")
    lf = data.find(b"\n\n")
    if crlf >= 0 and (lf < 0 or crlf < lf):
        return data[:crlf], data[crlf + 4 :]
    if lf >= 0:
        return data[:lf], data[lf + 2 :]
    raise SipParseError(len(data), "no empty line after the headers")


def _lines(head: str) -> list[tuple[int, str]]:
    """Split into logical lines with their offsets, unfolding continuation lines (§7.3.1)."""
    out: list[tuple[int, str]] = []
    pos = 0
    for raw in head.split("\n"):
        line = raw[:-1] if raw.endswith("\r") else raw
        if "\r" in line:
            raise SipParseError(pos + line.index("\r"), "bare CR in header section")
        if line[:1] in (" ", "\t") and out:
            start, prev = out[-1]
            out[-1] = (start, prev.rstrip(" \t") + " " + line.strip(" \t"))
        elif line[:1] in (" ", "\t"):
            raise SipParseError(pos, "continuation line before the first header")
        else:
            out.append((pos, line))
        pos += len(raw) + 1
    return out


def _parse_start(line: str) -> Request | Response:
    if line.startswith(SIP_VERSION + " ") or line.upper().startswith("SIP/"):
        version, _, rest = line.partition(" ")
        if version.upper() != SIP_VERSION:
            raise SipParseError(0, f"unsupported version {version[:20]!r}")
        code, _, reason = rest.partition(" ")
        if len(code) != 3 or not code.isdigit() or not code.isascii() or code[0] == "0":
            raise SipParseError(len(version) + 1, f"bad status code {code[:10]!r}")
        status = int(code)
        if status > 699:
            raise SipParseError(len(version) + 1, f"status code out of range: {status}")
        return Response(status=status, reason=reason)
    parts = line.split(" ")
    if len(parts) != 3:
        raise SipParseError(0, "request line must be 'Method SP Request-URI SP SIP-Version'")
    method, uri, version = parts
    if not is_token(method):
        raise SipParseError(0, f"bad method {method[:20]!r}")
    if version.upper() != SIP_VERSION:
        raise SipParseError(
            len(method) + len(uri) + 2, f"unsupported version {version[:20]!r}", status=505
        )
    try:
        parse_uri(uri)
    except SipParseError as exc:
        raise SipParseError(
            len(method) + 1 + exc.position, f"bad Request-URI: {exc.reason}"
        ) from None
    return Request(method=method, uri=uri)


def _parse_head(head_bytes: bytes) -> Request | Response:
    head = head_bytes.decode("utf-8", errors="surrogateescape")
    # §7.5: ignore CRLFs before the start line (keep-alives on streams).
    stripped = head.lstrip("\r\n")
    skipped = len(head) - len(stripped)
    lines = _lines(stripped)
    if not lines or not lines[0][1]:
        raise SipParseError(skipped, "empty message")
    try:
        msg = _parse_start(lines[0][1])
    except SipParseError as exc:
        # A request whose method reads but whose Request-URI or version does not: its
        # readable fields let a UAS answer it (RFC 4475 §3.1.2.6-9, .15).
        method = lines[0][1].partition(" ")[0]
        if not is_token(method) or method.upper().startswith("SIP/"):
            raise
        partial = Request(method=method, uri="")
        _keep_readable(partial, lines[1:MAX_HEADER_FIELDS])
        position = skipped + exc.position
        raise SipParseError(position, exc.reason, partial, status=exc.status) from None
    if len(lines) - 1 > MAX_HEADER_FIELDS:
        # Kept readable (the first fields) so a 400 can still be answered to the source.
        _keep_readable(msg, lines[1:MAX_HEADER_FIELDS])
        raise SipParseError(skipped, f"more than {MAX_HEADER_FIELDS} header fields", msg)
    for pos, line in lines[1:]:
        name, colon, value = line.partition(":")
        name = name.rstrip(" \t")
        if not colon or not is_token(name):
            raise SipParseError(skipped + pos, f"bad header line {line[:40]!r}", msg)
        if _CONTROL.search(value) is not None and not _quoted_pairs_only(value):
            raise SipParseError(skipped + pos + len(name) + 1, "control character in header", msg)
        msg.headers.add(name, value.strip(" \t"))
    return msg


def _keep_readable(msg: Request | Response, lines: list[tuple[int, str]]) -> None:
    """Add the well-formed of ``lines`` to a message that did not parse."""
    for _pos, line in lines:
        name, colon, value = line.partition(":")
        if colon and is_token(name.rstrip(" \t")) and value.isprintable():
            msg.headers.add(name.rstrip(" \t"), value.strip(" \t"))


def _quoted_pairs_only(value: str) -> bool:
    """Whether every control character of ``value`` is escaped by a quoted-pair inside a
    quoted-string, where §25.1 allows any but CR and LF (RFC 4475 §3.1.1.2)."""
    quoted = False
    i, end = 0, len(value)
    while i < end:
        c = value[i]
        if quoted and c == "\\":
            if i + 1 == end or value[i + 1] in "\r\n":
                return False
            i += 2
            continue
        if c == '"':
            quoted = not quoted
        elif c < " " and c != "\t":
            return False
        i += 1
    return True


def _check(msg: Request | Response) -> None:
    for name in MANDATORY:
        if name not in msg.headers:
            raise SipParseError(0, f"missing {name}", msg)
    for name in SINGLE:
        if len(msg.headers.get_raw(name)) > 1:
            raise SipParseError(0, f"more than one {name} header", msg)
    try:
        cseq = CSeq.parse(msg.headers.get("CSeq") or "")
        for value in msg.headers.get_all("Via"):
            Via.parse(value)
        NameAddr.parse(msg.headers.get("From") or "")
        NameAddr.parse(msg.headers.get("To") or "")
        if isinstance(msg, Request) and cseq.method != msg.method:
            raise SipParseError(0, "CSeq method does not match the request method")
        for name in ("Max-Forwards", "Expires", "Min-Expires"):
            for value in msg.headers.get_raw(name):
                if not value.isdigit() or not value.isascii() or len(value) > 10:
                    raise SipParseError(0, f"bad {name} {value[:20]!r}")
    except SipParseError as exc:
        raise SipParseError(exc.position, exc.reason, msg) from None


def _content_length(msg: Request | Response) -> int | None:
    values = msg.headers.get_raw("Content-Length")
    if not values:
        return None
    if len(set(values)) > 1:
        raise SipParseError(0, "conflicting Content-Length headers", msg)
    value = values[0]
    if not value.isdigit() or not value.isascii() or len(value) > 9:
        raise SipParseError(0, f"bad Content-Length {value[:20]!r}", msg)
    return int(value)


def parse_message(data: bytes) -> Request | Response:
    """Parse one SIP message (a UDP datagram or a framed stream message).

    The body is cut to Content-Length (§18.3: extra bytes of a datagram are
    discarded); a body shorter than Content-Length is an error. Without
    Content-Length (allowed over UDP) the rest of the datagram is the body.
    Raises :class:`SipParseError` (with ``message`` set when the headers were
    readable, so a 400 can be answered).
    """
    if not isinstance(data, bytes | bytearray | memoryview):
        raise SipParseError(0, "not bytes")
    head, body = _split_head(bytes(data))
    if len(head) > MAX_HEADER_BYTES:
        raise SipParseError(MAX_HEADER_BYTES, "header section too large")
    msg = _parse_head(head)
    _check(msg)
    length = _content_length(msg)
    if length is not None:
        if len(body) < length:
            raise SipParseError(len(head) + len(body), "body shorter than Content-Length", msg)
        body = body[:length]
    msg.body = body
    return msg


def serialize(msg: Request | Response) -> bytes:
    """Write a message; Content-Length is set to the body length (replaced or appended)."""
    if isinstance(msg, Request):
        start = f"{msg.method} {msg.uri} {SIP_VERSION}"
    else:
        start = f"{SIP_VERSION} {msg.status:03d} {msg.reason}"
    lines = [start]
    has_length = False
    for name, value in msg.headers:
        if name == "Content-Length":
            if has_length:
                continue
            has_length = True
            value = str(len(msg.body))
        lines.append(f"{name}: {value}")
    if not has_length:
        lines.append(f"Content-Length: {len(msg.body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8", errors="surrogateescape") + msg.body


class StreamFramer:
    """Cut a stream (TCP) into SIP messages by Content-Length (§18.3).

    ``feed(data)`` appends bytes; ``next_message()`` returns the next whole
    message or None when more bytes are needed. A message that frames but
    does not parse raises :class:`SipParseError` once and is consumed, so the
    stream goes on. A missing or bad Content-Length, or a header section
    larger than ``max_header``, cannot be framed: the error is raised and
    :attr:`broken` becomes True (the caller should close the connection).
    """

    def __init__(self, max_header: int = MAX_HEADER_BYTES, max_body: int = 1 << 20) -> None:
        self._buf = bytearray()
        self._max_header = max_header
        self._max_body = max_body
        self.broken = False

    def feed(self, data: bytes) -> None:
        """Append received bytes."""
        self._buf += data

    def __iter__(self) -> Iterator[Request | Response]:
        """Yield every whole message buffered so far (raises like :meth:`next_message`)."""
        while True:
            msg = self.next_message()
            if msg is None:
                return
            yield msg

    @property
    def buffered(self) -> int:
        """Bytes waiting for the rest of a message."""
        return len(self._buf)

    def next_message(self) -> Request | Response | None:
        """The next whole message, or None. Raises :class:`SipParseError`."""
        if self.broken:
            raise SipParseError(0, "stream framing was lost")
        # Keep-alive CRLFs between messages (RFC 5626 §3.5.1) are skipped.
        skip = 0
        while skip < len(self._buf) and self._buf[skip] in (13, 10):
            skip += 1
        if skip:
            del self._buf[:skip]
        end = self._buf.find(b"\r\n\r\n")
        if end < 0:
            if len(self._buf) > self._max_header:
                self.broken = True
                raise SipParseError(len(self._buf), "header section too large")
            return None
        head = bytes(self._buf[:end])
        length = self._frame_length(head)
        total = end + 4 + length
        if len(self._buf) < total:
            return None
        data = bytes(self._buf[:total])
        del self._buf[:total]
        return parse_message(data)

    def _frame_length(self, head: bytes) -> int:
        text = head.decode("utf-8", errors="surrogateescape")
        for line in text.split("\r\n")[1:]:
            name, colon, value = line.partition(":")
            if colon and name.strip().lower() in ("content-length", "l"):
                value = value.strip()
                if (
                    not (value.isascii() and value.isdigit() and len(value) <= 10)
                    or int(value) > self._max_body
                ):
                    self.broken = True
                    raise SipParseError(0, f"bad Content-Length on stream {value[:20]!r}")
                return int(value)
        self.broken = True
        raise SipParseError(0, "missing Content-Length on stream (§18.3)")


def make_response(
    req: Request, status: int, reason: str | None = None, *, to_tag: str | None = None
) -> Response:
    """A response to ``req`` with Via, From, To, Call-ID, CSeq copied (§8.2.6.2).

    ``to_tag`` is added to To when it has no tag yet (not for 100 Trying).
    """
    headers = Headers()
    for value in req.headers.get_raw("Via"):
        headers.add("Via", value)
    headers.add("From", req.headers.get("From") or "")
    to = req.headers.get("To") or ""
    if to_tag is not None and status > 100:
        try:
            if NameAddr.parse(to).tag is None:
                to = f"{to};tag={to_tag}"
        except SipParseError:
            pass
    headers.add("To", to)
    headers.add("Call-ID", req.headers.get("Call-ID") or "")
    headers.add("CSeq", req.headers.get("CSeq") or "")
    if status == 100 and "Timestamp" in req.headers:
        headers.add("Timestamp", req.headers.get("Timestamp") or "")
    return Response(
        status=status,
        reason=reason if reason is not None else REASONS.get(status, ""),
        headers=headers,
    )
