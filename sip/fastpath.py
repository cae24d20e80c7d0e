"""The REGISTER fast path, sans-IO: plain REGISTERs over UDP answered without
building a :class:`~sip.message.Request` or a server transaction.

Theory of operation: :func:`scan_register` reads one datagram with a few string
operations and returns a :class:`FastRegister` only when the request is of the simple
shape phones and load generators send (the grammar below); for anything else it
returns None and the caller hands the datagram to the full stack (parser, transaction
layer, :meth:`sip.registrar.Registrar.handle`), which answers it, errors included.
The fast path therefore never answers a request the full path would answer
differently: it takes only requests whose full-path answer it can compute (the rules
themselves are :meth:`Registrar.register`, shared by both paths), and it prints the
response exactly as the full path does (the tests compare the two byte for byte, but
for the random To tag).

Retransmissions (RFC 3261 §17.2.2, §8.2.7): a stateless UAS regenerates its answer for
a retransmitted request, which §8.2.7 says rules out stateless registrars: the second
copy of a REGISTER would fail step 7 (same Call-ID, CSeq not higher) and get a 500. So
:class:`FastRegistrar` keeps what a non-INVITE server transaction keeps in its
Completed state and nothing else: the response bytes, keyed by the transaction key
(branch, sent-by; §17.2.3), for Timer J (64·T1 = 32 s over UDP). A retransmission gets
the identical bytes. The cache is bounded (:attr:`ResponseCache.limit`); at a load
that would keep more than that many answers for 32 s, the oldest leave early and a
retransmission later than that is processed as a new request (the full path's server
transaction forgets after 32 s in the same way).

The grammar the fast path takes (else the full path):

- request line ``REGISTER <sip: Request-URI of one of our domains> SIP/2.0``;
  ASCII only; no folded lines; no body (``Content-Length`` absent or 0);
- exactly one each of Via, From, To, Call-ID, CSeq; at most one each of Contact,
  Expires, Max-Forwards, Content-Length; no Require, Authorization,
  Proxy-Authorization or Min-Expires (the registrar must then run its full rules);
- Via ``SIP/2.0/UDP host[:port]`` with a ``z9hG4bK`` branch and optionally a bare
  ``rport``, no other parameter;
- From/To/Contact ``[display] <sip:user@host[:port][;params]>[;params]`` with plain
  user characters, lower-case parameter names; To without tag, of one of our domains;
  the Contact's only header parameter is ``expires``.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Callable
from typing import NamedTuple

from sip.errors import SipParseError
from sip.headers import TOKEN_PATTERN
from sip.message import REASONS
from sip.registrar import Registrar
from sip.uri import SipUri, parse_uri

__all__ = ["FastRegister", "FastRegistrar", "ResponseCache", "scan_register"]

Address = tuple[str, int]

_TOKEN = TOKEN_PATTERN
_PARAMS = rf"(?:;[a-z0-9.!%*_+`'~\-]+(?:={_TOKEN})?)*"
_TOKEN_RE = re.compile(_TOKEN)
_HOST = r"[A-Za-z0-9](?:[A-Za-z0-9.\-]*[A-Za-z0-9.])?"
# 1..65535 in the regex itself: a port out of range is no match, and no match is the
# full path's turn.
_PORT = r"(?:6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[1-9][0-9]{0,3})"
# The user characters that SipUri prints back unescaped (so the text is its own str()).
_USER = r"[A-Za-z0-9\-_.!~*'()&=+$,/]+"
_NAME_ADDR_RE = re.compile(
    rf"(?:\"[^\"\\\x00-\x1f]*\"[ \t]*|(?:{_TOKEN}[ \t]+)*)?"
    rf"<(sip:({_USER})@({_HOST})(?::{_PORT})?({_PARAMS}))>({_PARAMS})"
)
# Only a branch (RFC 3261's, with the magic cookie) and a bare rport, in either order.
_VIA_RE = re.compile(
    rf"SIP/2\.0/UDP ({_HOST})(?::({_PORT}))?((?:;branch=z9hG4bK{_TOKEN}|;rport(?![^;]))+)"
)
_REQUEST_LINE_RE = re.compile(rf"REGISTER (sip:{_HOST}(?::{_PORT})?{_PARAMS}) SIP/2\.0")
# Printable ASCII: what is left of a head once these are deleted must be the CRLFs
# between its lines, else (a control character, a TAB, a bare CR or LF) the full parser
# decides what the datagram means and which 400 to answer.
_PRINTABLE = bytes(range(0x20, 0x7F))
_CONTACT_PARAMS_RE = re.compile(r";expires=([0-9]{1,10})")
_TAG_RE = re.compile(r";tag(?:[=;]|$)")

# Lower-cased header names (and compact forms, §7.3.3) the fast path reads.
_NAMES = {
    "via": "via",
    "v": "via",
    "from": "from",
    "f": "from",
    "to": "to",
    "t": "to",
    "call-id": "call-id",
    "i": "call-id",
    "cseq": "cseq",
    "contact": "contact",
    "m": "contact",
    "expires": "expires",
    "content-length": "content-length",
    "l": "content-length",
    "max-forwards": "max-forwards",
}
# Present: the full rules must run (420, digest, the Min-Expires check).
_FULL_RULES = ("require", "authorization", "proxy-authorization", "min-expires")
# To tags drawn per call of the random source.
TAGS_PER_DRAW = 64
_MANDATORY = frozenset(("via", "from", "to", "call-id", "cseq"))
# What a header name as received stands for: one of _NAMES' values, "" for a header the
# registrar never reads (User-Agent, Allow, ...), "!" when the full path must take the
# request (a header of _FULL_RULES, a name that is no token). Filled as names are seen,
# at most _NAME_CACHE_LIMIT of them (the rest are worked out each time).
_NAME_KEYS: dict[str, str] = {}
_NAME_CACHE_LIMIT = 512


def _name_key(name: str) -> str:
    """The _NAME_KEYS entry for a header name as received."""
    key = _NAME_KEYS.get(name)
    if key is not None:
        return key
    lower = name.rstrip(" ").lower()
    key = _NAMES.get(lower)
    if key is None:
        key = "!" if lower in _FULL_RULES or _TOKEN_RE.fullmatch(lower) is None else ""
    if len(_NAME_KEYS) < _NAME_CACHE_LIMIT:
        _NAME_KEYS[name] = key
    return key


class FastRegister(NamedTuple):
    """What the fast path needs of a REGISTER (the texts as received, stripped). A
    tuple: built once per request, it costs less than a class's attribute stores."""

    uri: str
    via_host: str
    via_port: int | None
    via_params: str  # ";branch=...;rport" as received (either order)
    branch: str
    rport: bool
    from_: str
    to: str
    call_id: str
    cseq: str
    seq: int
    aor: str
    to_host: str
    contact: str | None  # the Contact URI text
    contact_expires: int | None
    expires: int | None


def _unique_params(text: str) -> bool:
    names = [item.partition("=")[0] for item in text[1:].split(";")] if text else []
    return len(names) == len(set(names))


def scan_register(data: bytes) -> FastRegister | None:
    """Read a plain REGISTER (module docstring); None: not for the fast path."""
    if not data.startswith(b"REGISTER ") or not data.isascii():
        return None
    end = data.find(b"\r\n\r\n")
    if end < 0:
        return None
    head = data[:end]
    lines = head.decode("ascii").split("\r\n")
    if head.translate(None, _PRINTABLE) != b"\r\n" * (len(lines) - 1):
        return None
    request_line = _REQUEST_LINE_RE.fullmatch(lines[0])
    if request_line is None:
        return None
    seen: dict[str, str] = {}
    keys = _NAME_KEYS
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        if not colon:
            return None
        key = keys.get(name)
        if key is None:
            key = _name_key(name)
        if key:
            if key in seen:
                return None
            seen[key] = value.strip(" ")
    if "!" in seen or len(seen) < len(_MANDATORY) or not _MANDATORY.issubset(seen):
        return None
    # Numbers are 1 to 10 digits (isdigit() takes only 0-9 here: the datagram is ASCII).
    length = seen.get("content-length")
    if length is None:
        if end + 4 < len(data):
            return None
    elif length != "0" and not (length.isdigit() and len(length) <= 9 and int(length) == 0):
        return None
    number = seen.get("max-forwards")
    if number is not None and not (number.isdigit() and len(number) <= 10):
        return None
    expires_header = seen.get("expires")
    if expires_header is not None and not (expires_header.isdigit() and len(expires_header) <= 10):
        return None
    call_id = seen["call-id"]
    cseq = seen["cseq"]
    seq_text, _, method = cseq.partition(" ")
    if method != "REGISTER" or not seq_text.isdigit() or len(seq_text) > 10:
        return None
    via = _VIA_RE.fullmatch(seen["via"])
    from_ = _NAME_ADDR_RE.fullmatch(seen["from"])
    to = _NAME_ADDR_RE.fullmatch(seen["to"])
    if not call_id or via is None or from_ is None or to is None:
        return None
    seq = int(seq_text)
    if seq >= 2**31:
        return None
    to_params = to.group(5)
    if to_params and _TAG_RE.search(to_params):
        return None  # a tagged To is a request inside a dialog: the full path answers it
    via_params = via.group(3)
    branch_at = via_params.find(";branch=")
    if (
        branch_at < 0
        or via_params.find(";branch=", branch_at + 1) >= 0
        or via_params.count(";rport") > 1
    ):
        return None
    contact_uri: str | None = None
    contact_expires: int | None = None
    contact_text = seen.get("contact")
    if contact_text is not None:
        contact = _NAME_ADDR_RE.fullmatch(contact_text)
        if contact is None:
            return None
        if contact.group(4) and not _unique_params(contact.group(4)):
            return None
        contact_uri = contact.group(1)
        contact_params = contact.group(5)
        if contact_params:
            expires = _CONTACT_PARAMS_RE.fullmatch(contact_params)
            if expires is None:
                return None
            contact_expires = int(expires.group(1))
    via_port = via.group(2)
    to_host = to.group(3).lower()
    return FastRegister(
        request_line.group(1),
        via.group(1),
        int(via_port) if via_port else None,
        via_params,
        via_params[branch_at + 8 :].partition(";")[0],
        ";rport" in via_params,
        seen["from"],
        seen["to"],
        call_id,
        cseq,
        seq,
        f"sip:{to.group(2)}@{to_host}",
        to_host,
        contact_uri,
        contact_expires,
        int(expires_header) if expires_header is not None else None,
    )


class ResponseCache:
    """Responses by transaction key for ``lifetime`` seconds, at most ``limit`` of them
    (the oldest leave first)."""

    def __init__(self, lifetime: float = 32.0, limit: int = 65536) -> None:
        self.lifetime = lifetime
        self.limit = limit
        self._entries: OrderedDict[tuple[str, str], tuple[float, bytes, Address]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: tuple[str, str], now: float) -> tuple[bytes, Address] | None:
        """The response kept for ``key`` (and where it went), or None."""
        entry = self._entries.get(key)
        if entry is None or entry[0] <= now:
            return None
        return entry[1], entry[2]

    def put(self, key: tuple[str, str], response: bytes, dest: Address, now: float) -> None:
        """Keep a response; drop those past their time or over the limit."""
        entries = self._entries
        entries[key] = (now + self.lifetime, response, dest)
        while entries:
            oldest = next(iter(entries.values()))
            if oldest[0] > now and len(entries) <= self.limit:
                break
            entries.popitem(last=False)

    def forget(self, key: tuple[str, str]) -> None:
        """Drop one entry (its answer was never sent)."""
        self._entries.pop(key, None)


class FastRegistrar:
    """Answers plain REGISTERs over UDP with :meth:`Registrar.register` (module
    docstring). ``server`` is the Server header the full path adds (the UA's
    ``user_agent``); ``random`` gives To tags."""

    def __init__(
        self,
        registrar: Registrar,
        server: str,
        *,
        cache: ResponseCache | None = None,
        random: Callable[[int], bytes] | None = None,
    ) -> None:
        self.registrar = registrar
        self.server = server
        self.cache = cache if cache is not None else ResponseCache()
        self._random = random
        self._domains = {d.lower() for d in registrar.config.domains}
        self._uris: dict[str, bool] = {}  # Request-URI text -> one of ours (bounded)
        self.answered = 0
        self.retransmissions = 0
        self.declined = 0
        self._batch: list[tuple[str, str]] | None = None
        self._tags: list[str] = []
        self._server_line = f"Server: {server}\r\n"

    def begin(self) -> None:
        """Start a batch whose answers :meth:`abort` can take back (the store failed)."""
        self._batch = []

    def abort(self) -> None:
        """Forget the answers of the batch: they were never sent."""
        for key in self._batch or ():
            self.cache.forget(key)
        self._batch = None

    def _our_uri(self, text: str) -> bool:
        known = self._uris.get(text)
        if known is None:
            try:
                uri = parse_uri(text)
            except SipParseError:
                uri = None
            known = (
                isinstance(uri, SipUri)
                and uri.scheme == "sip"
                and uri.host.lower() in self._domains
                and str(uri) == text
            )
            if len(self._uris) < 1024:
                self._uris[text] = known
        return known

    def _tag(self) -> str:
        """A fresh To tag, from random bytes drawn :data:`TAGS_PER_DRAW` tags at a time
        (one system call for many answers)."""
        tags = self._tags
        if not tags:
            draw = self._random or self.registrar.random
            text = draw(8 * TAGS_PER_DRAW).hex()
            tags.extend(text[i : i + 16] for i in range(0, len(text), 16))
        return tags.pop()

    def handle(self, data: bytes, source: Address, now: float) -> tuple[bytes, Address] | None:
        """The response to send and where, or None: the full path must take it."""
        reg = scan_register(data)
        if (
            reg is None
            or reg.to_host not in self._domains
            or not (self._uris.get(reg.uri) or self._our_uri(reg.uri))
        ):
            self.declined += 1
            return None
        via_host, via_port, rport = reg.via_host, reg.via_port, reg.rport
        key = (reg.branch, f"{via_host}:{via_port or ''}".lower())
        cached = self.cache.get(key, now)
        if cached is not None:
            self.retransmissions += 1
            return cached
        src_host, src_port = source
        contacts = [(reg.contact, reg.contact_expires, 1.0)] if reg.contact is not None else []
        outcome = self.registrar.register(
            reg.aor, reg.call_id, reg.seq, contacts, reg.expires, now,
            source=f"{src_host}:{src_port}",
        )  # fmt: skip
        # §18.2.1 and RFC 3581, as the transaction layer stamps the Via: received when the
        # packet came from elsewhere than sent-by (or rport asks), rport filled in.
        via = f"{via_host}:{via_port}" if via_port is not None else via_host
        params = reg.via_params
        if rport:
            params = params.replace(";rport", f";rport={src_port}") + f";received={src_host}"
        elif via_host != src_host:
            params += f";received={src_host}"
        status = outcome.status
        extra = "".join([f"{name}: {value}\r\n" for name, value in outcome.headers])
        if status < 300:  # as the full path: lean refusals (sip.ua.is_unproven)
            extra += self._server_line
        response = (
            f"SIP/2.0 {status} {REASONS.get(status, '')}\r\nVia: SIP/2.0/UDP {via}{params}\r\n"
            f"From: {reg.from_}\r\nTo: {reg.to};tag={self._tag()}\r\n"
            f"Call-ID: {reg.call_id}\r\nCSeq: {reg.cseq}\r\n{extra}Content-Length: 0\r\n\r\n"
        ).encode("utf-8", errors="surrogateescape")
        dest = (src_host, src_port if rport else (via_port or 5060))
        self.cache.put(key, response, dest, now)
        if self._batch is not None:
            self._batch.append(key)
        self.answered += 1
        return response, dest
