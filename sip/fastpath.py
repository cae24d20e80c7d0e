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
from dataclasses import dataclass

from sip.errors import SipParseError
from sip.message import REASONS
from sip.registrar import Registrar
from sip.uri import SipUri, parse_uri

__all__ = ["FastRegister", "FastRegistrar", "ResponseCache", "scan_register"]

Address = tuple[str, int]

_TOKEN = r"[A-Za-z0-9.!%*_+`'~\-]+"
_PARAMS = rf"(?:;[a-z0-9.!%*_+`'~\-]+(?:={_TOKEN})?)*"
_TOKEN_RE = re.compile(_TOKEN)
_HOST = r"[A-Za-z0-9](?:[A-Za-z0-9.\-]*[A-Za-z0-9.])?"
_PORT = r"[1-9][0-9]{0,4}"
# The user characters that SipUri prints back unescaped (so the text is its own str()).
_USER = r"[A-Za-z0-9\-_.!~*'()&=+$,/]+"
_NAME_ADDR_RE = re.compile(
    rf"(?:\"[^\"\\\x00-\x1f]*\"[ \t]*|(?:{_TOKEN}[ \t]+)*)?"
    rf"<(sip:({_USER})@({_HOST})(?::({_PORT}))?({_PARAMS}))>({_PARAMS})"
)
# Only a branch (RFC 3261's, with the magic cookie) and a bare rport, in either order.
_VIA_RE = re.compile(
    rf"SIP/2\.0/UDP ({_HOST})(?::({_PORT}))?((?:;branch=z9hG4bK{_TOKEN}|;rport(?![^;]))+)"
)
_REQUEST_URI_RE = re.compile(rf"sip:{_HOST}(?::({_PORT}))?{_PARAMS}")
_CSEQ_RE = re.compile(r"([0-9]{1,10}) REGISTER")
_CONTACT_PARAMS_RE = re.compile(r"(?:;expires=([0-9]{1,10}))?")
_DIGITS = re.compile(r"[0-9]{1,10}")
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
    # Present: the full rules must run (420, digest, the Min-Expires check).
    "require": "",
    "authorization": "",
    "proxy-authorization": "",
    "min-expires": "",
}
_MANDATORY = frozenset(("via", "from", "to", "call-id", "cseq"))
MAX_PORT = 65535


@dataclass(slots=True)
class FastRegister:
    """What the fast path needs of a REGISTER (the texts as received, stripped)."""

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


def _port(text: str | None) -> int | None:
    """A port matched by _PORT, or -1 when out of range."""
    if text is None:
        return None
    port = int(text)
    return port if port <= MAX_PORT else -1


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
    body = data[end + 4 :]
    head = data[:end].decode("ascii")
    lines = head.split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or parts[2] != "SIP/2.0":
        return None
    request_uri = _REQUEST_URI_RE.fullmatch(parts[1])
    if request_uri is None or _port(request_uri.group(1)) == -1:
        return None
    seen: dict[str, str] = {}
    for line in lines[1:]:
        # A control character, a TAB, a bare CR or LF, a folded line: the full parser
        # decides what they mean (and which 400 to answer).
        if not line.isprintable():
            return None
        name, colon, value = line.partition(":")
        name = name.rstrip(" ")
        key = _NAMES.get(name.lower())
        if key is None:
            if not colon or _TOKEN_RE.fullmatch(name) is None:
                return None
            continue  # a header the registrar never reads (User-Agent, Allow, ...)
        if not key or key in seen:
            return None
        seen[key] = value.strip(" ")
    if len(seen) < len(_MANDATORY) or not _MANDATORY.issubset(seen):
        return None
    length = seen.get("content-length")
    if length is None:
        if body:
            return None
    elif not (_DIGITS.fullmatch(length) and len(length) <= 9 and int(length) == 0):
        return None
    for name in ("max-forwards", "expires"):
        number = seen.get(name)
        if number is not None and _DIGITS.fullmatch(number) is None:
            return None
    call_id = seen["call-id"]
    cseq = _CSEQ_RE.fullmatch(seen["cseq"])
    via = _VIA_RE.fullmatch(seen["via"])
    from_ = _NAME_ADDR_RE.fullmatch(seen["from"])
    to = _NAME_ADDR_RE.fullmatch(seen["to"])
    if not call_id or cseq is None or via is None or from_ is None or to is None:
        return None
    seq = int(cseq.group(1))
    if seq >= 2**31 or _port(from_.group(4)) == -1 or _port(to.group(4)) == -1:
        return None
    if _TAG_RE.search(to.group(6)):
        return None  # a tagged To is a request inside a dialog: the full path answers it
    via_params = via.group(3)
    branch_at = via_params.find(";branch=")
    if (
        branch_at < 0
        or via_params.find(";branch=", branch_at + 1) >= 0
        or via_params.count(";rport") > 1
        or _port(via.group(2)) == -1
    ):
        return None
    contact_uri: str | None = None
    contact_expires: int | None = None
    if "contact" in seen:
        contact = _NAME_ADDR_RE.fullmatch(seen["contact"])
        if contact is None or _port(contact.group(4)) == -1:
            return None
        if contact.group(5) and not _unique_params(contact.group(5)):
            return None
        expires = _CONTACT_PARAMS_RE.fullmatch(contact.group(6))
        if expires is None:
            return None
        contact_uri = contact.group(1)
        contact_expires = int(expires.group(1)) if expires.group(1) else None
    expires_header = seen.get("expires")
    return FastRegister(
        uri=parts[1],
        via_host=via.group(1),
        via_port=_port(via.group(2)),
        via_params=via_params,
        branch=via_params[branch_at + 8 :].partition(";")[0],
        rport=";rport" in via_params,
        from_=seen["from"],
        to=seen["to"],
        call_id=call_id,
        cseq=seen["cseq"],
        seq=seq,
        aor=f"sip:{to.group(2)}@{to.group(3).lower()}",
        to_host=to.group(3).lower(),
        contact=contact_uri,
        contact_expires=contact_expires,
        expires=int(expires_header) if expires_header is not None else None,
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

    def handle(self, data: bytes, source: Address, now: float) -> tuple[bytes, Address] | None:
        """The response to send and where, or None: the full path must take it."""
        reg = scan_register(data)
        if reg is None or reg.to_host not in self._domains or not self._our_uri(reg.uri):
            self.declined += 1
            return None
        key = (reg.branch, f"{reg.via_host}:{reg.via_port or ''}".lower())
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
        via = (
            f"SIP/2.0/UDP {reg.via_host}" if reg.via_port is None
            else f"SIP/2.0/UDP {reg.via_host}:{reg.via_port}"
        )  # fmt: skip
        via += (
            reg.via_params.replace(";rport", f";rport={src_port}") if reg.rport else reg.via_params
        )
        if reg.via_host != src_host or reg.rport:
            via += f";received={src_host}"
        tag = self._random(8).hex() if self._random is not None else self.registrar.new_tag()
        lines = [
            f"SIP/2.0 {outcome.status} {REASONS.get(outcome.status, '')}",
            f"Via: {via}",
            f"From: {reg.from_}",
            f"To: {reg.to};tag={tag}",
            f"Call-ID: {reg.call_id}",
            f"CSeq: {reg.cseq}",
        ]
        lines.extend(f"{name}: {value}" for name, value in outcome.headers)
        if outcome.status < 300:  # as the full path: lean refusals (sip.ua.is_unproven)
            lines.append(f"Server: {self.server}")
        lines.append("Content-Length: 0\r\n\r\n")
        response = "\r\n".join(lines).encode("utf-8", errors="surrogateescape")
        dest = (src_host, src_port if reg.rport else (reg.via_port or 5060))
        self.cache.put(key, response, dest, now)
        if self._batch is not None:
            self._batch.append(key)
        self.answered += 1
        return response, dest
