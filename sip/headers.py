"""Header container and the grammar helpers of RFC 3261 §25 (tokens, quoted strings, parameters).

Theory of operation: a message keeps its headers as an ordered list of
``(canonical name, value)`` pairs, exactly as received (after unfolding). The
structured views (:class:`sip.uri.Via`, :class:`sip.uri.NameAddr`, ...) are
parsed on demand, so a message with an odd header we never look at still
round-trips byte for byte (modulo folding and compact names).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator

from sip.errors import SipParseError

# RFC 3261 §7.3.3 and the IANA registry: compact forms.
COMPACT = {
    "a": "Accept-Contact",
    "b": "Referred-By",
    "c": "Content-Type",
    "d": "Request-Disposition",
    "e": "Content-Encoding",
    "f": "From",
    "i": "Call-ID",
    "j": "Reject-Contact",
    "k": "Supported",
    "l": "Content-Length",
    "m": "Contact",
    "n": "Identity-Info",
    "o": "Event",
    "r": "Refer-To",
    "s": "Subject",
    "t": "To",
    "u": "Allow-Events",
    "v": "Via",
    "x": "Session-Expires",
    "y": "Identity",
}

# Names whose canonical spelling is not plain Title-Case.
_SPECIAL = {
    "call-id": "Call-ID",
    "cseq": "CSeq",
    "www-authenticate": "WWW-Authenticate",
    "mime-version": "MIME-Version",
    "rack": "RAck",
    "rseq": "RSeq",
    "sip-etag": "SIP-ETag",
    "sip-if-match": "SIP-If-Match",
}

# Headers whose grammar is NOT a comma-separated list (§7.3.1): commas inside
# them belong to the value (dates, challenges, credentials).
_NOT_LISTS = {
    "authorization",
    "proxy-authorization",
    "www-authenticate",
    "proxy-authenticate",
    "authentication-info",
    "date",
    "subject",
    "user-agent",
    "server",
    "organization",
    "call-id",
    "cseq",
    "content-length",
    "content-type",
    "from",
    "to",
    "max-forwards",
    "expires",
    "min-expires",
    "timestamp",
    "retry-after",
    "reply-to",
    "priority",
    "identity",
}

TOKEN_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-.!%*_+`'~")


#: TOKEN_CHARS as a regular expression for one token.
TOKEN_PATTERN = "[" + re.escape("".join(sorted(TOKEN_CHARS))) + "]+"
# One C-level match per name instead of a Python-level test per character: every header
# line of every message is checked.
_TOKEN = re.compile(TOKEN_PATTERN)


def is_token(text: str) -> bool:
    """True when ``text`` is a non-empty RFC 3261 ``token``."""
    return _TOKEN.fullmatch(text) is not None


@functools.lru_cache(maxsize=512)  # a message's names repeat; the cache bounds a flood of new ones
def canonical_name(name: str) -> str:
    """Canonical spelling of a header name; compact forms are expanded."""
    low = name.lower()
    if low in COMPACT:
        return COMPACT[low]
    if low in _SPECIAL:
        return _SPECIAL[low]
    return "-".join(part[:1].upper() + part[1:] for part in low.split("-"))


def quote(text: str) -> str:
    """Make ``text`` a quoted-string, escaping ``"`` and ``\\``."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def read_quoted(text: str, start: int) -> tuple[str, int]:
    """Read a quoted-string starting at ``text[start] == '"'``.

    Returns the unescaped content and the index just after the closing quote.
    Raises :class:`SipParseError` if the string is not closed or an escape is bad.
    """
    if start >= len(text) or text[start] != '"':
        raise SipParseError(start, "expected '\"'")
    out: list[str] = []
    i = start + 1
    while i < len(text):
        c = text[i]
        if c == "\\":
            if i + 1 >= len(text) or text[i + 1] in "\r\n":
                raise SipParseError(i, "bad quoted-pair")
            out.append(text[i + 1])
            i += 2
            continue
        if c == '"':
            return "".join(out), i + 1
        if c in "\r\n":
            raise SipParseError(i, "line break in quoted-string")
        out.append(c)
        i += 1
    raise SipParseError(start, "unterminated quoted-string")


def split_list(value: str) -> list[str]:
    """Split a comma-separated header value, respecting quotes and ``<...>``.

    Raises :class:`SipParseError` on an unterminated quote or angle bracket.
    """
    if "," not in value and '"' not in value and "<" not in value:
        # One element and nothing to skip over (most Via values): no scan needed.
        single = value.strip()
        return [single] if single else []
    parts: list[str] = []
    depth = 0
    i = 0
    start = 0
    while i < len(value):
        c = value[i]
        if c == '"':
            _, i = read_quoted(value, i)
            continue
        if c == "<":
            depth += 1
        elif c == ">":
            depth = max(0, depth - 1)
        elif c == "," and depth == 0:
            parts.append(value[start:i].strip())
            start = i + 1
        i += 1
    if depth:
        raise SipParseError(len(value), "unterminated '<'")
    parts.append(value[start:].strip())
    return [p for p in parts if p]


def parse_params(text: str, offset: int = 0) -> dict[str, str | None]:
    """Parse ``;name[=value]`` parameters (``text`` starts at a ``;`` or is empty).

    Names are lower-cased (parameter names are case-insensitive, §7.3.1);
    values are kept raw (quoted values keep their quotes) so they print back
    unchanged. Raises :class:`SipParseError` on a malformed parameter.
    """
    params: dict[str, str | None] = {}
    i = 0
    n = len(text)
    while i < n:
        while i < n and text[i] in " \t":
            i += 1
        if i >= n:
            break
        if text[i] != ";":
            raise SipParseError(offset + i, "expected ';' before parameter")
        i += 1
        while i < n and text[i] in " \t":
            i += 1
        j = i
        while j < n and text[j] in TOKEN_CHARS:
            j += 1
        name = text[i:j]
        if not name:
            raise SipParseError(offset + i, "empty parameter name")
        i = j
        while i < n and text[i] in " \t":
            i += 1
        value: str | None = None
        if i < n and text[i] == "=":
            i += 1
            while i < n and text[i] in " \t":
                i += 1
            if i < n and text[i] == '"':
                _, end = read_quoted(text, i)
                value = text[i:end]
                i = end
            elif i < n and text[i] == "[":
                end = text.find("]", i)
                if end < 0:
                    raise SipParseError(offset + i, "unterminated IPv6 reference")
                value = text[i : end + 1]
                i = end + 1
            else:
                j = i
                while j < n and (text[j] in TOKEN_CHARS or text[j] in ":[]/@&?="):
                    j += 1
                value = text[i:j]
                if not value:
                    raise SipParseError(offset + i, f"empty value for parameter {name!r}")
                i = j
        params[name.lower()] = value
    return params


def format_params(params: dict[str, str | None]) -> str:
    """Inverse of :func:`parse_params`."""
    return "".join(f";{k}" if v is None else f";{k}={v}" for k, v in params.items())


def unquote_param(value: str | None) -> str | None:
    """Strip the quotes of a quoted parameter value (and unescape it)."""
    if value is not None and value.startswith('"'):
        return read_quoted(value, 0)[0]
    return value


class Headers:
    """Ordered, case-insensitive multi-map of SIP headers.

    Names are stored canonically (compact forms expanded). ``get`` returns the
    first value; ``get_all`` returns every value, splitting comma-separated
    lists for headers whose grammar is a list (Via, Contact, Route, ...).
    """

    __slots__ = ("_items",)

    def __init__(self, items: list[tuple[str, str]] | None = None) -> None:
        self._items: list[tuple[str, str]] = []
        for name, value in items or []:
            self.add(name, value)

    @staticmethod
    def _check(name: str, value: str) -> None:
        if not is_token(name):
            raise ValueError(f"bad header name {name!r}")
        if "\r" in value or "\n" in value:
            raise ValueError(f"line break in value of {name}")

    def add(self, name: str, value: str) -> None:
        """Append a header (after any existing ones of that name)."""
        self._check(name, value)
        self._items.append((canonical_name(name), value.strip()))

    def insert(self, index: int, name: str, value: str) -> None:
        """Insert a header at position ``index`` (0 = top, e.g. for a new Via)."""
        self._check(name, value)
        self._items.insert(index, (canonical_name(name), value.strip()))

    def prepend(self, name: str, value: str) -> None:
        """Insert before the first header of that name (or at the top): new Via, Record-Route."""
        canon = canonical_name(name)
        for idx, (n, _) in enumerate(self._items):
            if n == canon:
                self.insert(idx, name, value)
                return
        self.insert(0, name, value)

    def set(self, name: str, value: str) -> None:
        """Replace every header of that name with one value, kept at the first one's position."""
        self._check(name, value)
        canon = canonical_name(name)
        for idx, (n, _) in enumerate(self._items):
            if n == canon:
                self._items[idx] = (canon, value.strip())
                self._items = [
                    item for j, item in enumerate(self._items) if j <= idx or item[0] != canon
                ]
                return
        self._items.append((canon, value.strip()))

    def remove(self, name: str) -> None:
        """Remove every header of that name."""
        canon = canonical_name(name)
        self._items = [item for item in self._items if item[0] != canon]

    def remove_first(self, name: str) -> str | None:
        """Remove the first list element of that header (e.g. the top Via) and return it."""
        canon = canonical_name(name)
        for idx, (n, v) in enumerate(self._items):
            if n == canon:
                parts = split_list(v) if n.lower() not in _NOT_LISTS else [v]
                if len(parts) <= 1:
                    del self._items[idx]
                else:
                    self._items[idx] = (n, ", ".join(parts[1:]))
                return parts[0] if parts else v
        return None

    def get(self, name: str, default: str | None = None) -> str | None:
        """First value of that header (first list element for list headers)."""
        values = self.get_all(name)
        return values[0] if values else default

    def get_raw(self, name: str) -> list[str]:
        """Values of that header as received, one per header line, not split."""
        canon = canonical_name(name)
        return [v for n, v in self._items if n == canon]

    def get_all(self, name: str) -> list[str]:
        """Every value of that header, comma-separated lists split (§7.3.1).

        Raises :class:`SipParseError` if a list value has unbalanced quotes or brackets.
        """
        canon = canonical_name(name)
        out: list[str] = []
        for n, v in self._items:
            if n == canon:
                if canon.lower() in _NOT_LISTS:
                    out.append(v)
                else:
                    out.extend(split_list(v))
        return out

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and any(n == canonical_name(name) for n, _ in self._items)

    def __iter__(self) -> Iterator[tuple[str, str]]:
        return iter(list(self._items))

    def __len__(self) -> int:
        return len(self._items)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Headers) and self._items == other._items

    def __hash__(self) -> int:  # mutable: not hashable
        raise TypeError("Headers is mutable and unhashable")

    def copy(self) -> Headers:
        """A shallow copy (values are strings)."""
        new = Headers()
        new._items = list(self._items)
        return new

    def __repr__(self) -> str:
        return f"Headers({self._items!r})"
