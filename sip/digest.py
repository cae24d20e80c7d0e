"""Digest computation and grammar for SIP (RFC 3261 §22, RFC 7616, RFC 8760), sans-IO:
the hashes, the ``WWW-Authenticate``/``Authorization`` parameter syntax, and the
:class:`Challenge` and :class:`Credentials` views. The server's nonces and the client's
nonce-counts, which keep state, are :mod:`sip.auth`'s.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from sip.errors import (
    AuthHeaderError,
    AuthUnsupportedError,
    SipParseError,
)
from sip.headers import TOKEN_CHARS, quote, read_quoted

RandomSource = Callable[[int], bytes]


# RFC 8760 §2 / RFC 7616 §3.2: algorithm name -> hashlib name. The "-sess"
# variants and SHA-512-256 are not offered (see docs/sip-auth-registrar-sdp.md).
ALGORITHMS: Mapping[str, str] = {"MD5": "md5", "SHA-256": "sha256"}
_HEX_LEN = {"MD5": 32, "SHA-256": 64}
_HEX = frozenset("0123456789abcdefABCDEF")

# Header names by role (RFC 3261 §22.2 for UAS/registrar, §22.3 for proxies).
CHALLENGE_HEADER = {False: "WWW-Authenticate", True: "Proxy-Authenticate"}
CREDENTIALS_HEADER = {False: "Authorization", True: "Proxy-Authorization"}
STATUS = {False: 401, True: 407}


def canonical_algorithm(name: str) -> str | None:
    """Our spelling of an algorithm name (names are case-insensitive, RFC 7616 §3.3)."""
    for known in ALGORITHMS:
        if known.lower() == name.lower():
            return known
    return None


def _hash(algorithm: str, text: str) -> str:
    return hashlib.new(ALGORITHMS[algorithm], text.encode("utf-8")).hexdigest()


def compute_ha1(username: str, realm: str, password: str, algorithm: str = "MD5") -> str:
    """``H(username ":" realm ":" password)`` in lower-case hex (RFC 7616 §3.4.2).

    Raises :class:`KeyError` for an algorithm not in :data:`ALGORITHMS`.
    """
    return _hash(algorithm, f"{username}:{realm}:{password}")


def compute_response(
    *,
    algorithm: str,
    ha1: str,
    nonce: str,
    method: str,
    uri: str,
    qop: str | None = None,
    nc: str = "",
    cnonce: str = "",
) -> str:
    """The ``response`` value (RFC 7616 §3.4.1; RFC 2069 form when ``qop`` is None).

    ``HA2 = H(method ":" uri)`` (qop=auth, so the body is not needed) and
    ``response = KD(HA1, nonce ":" nc ":" cnonce ":" qop ":" HA2)`` with
    ``KD(s, d) = H(s ":" d)``. Raises :class:`KeyError` for an unknown algorithm.
    """
    ha2 = _hash(algorithm, f"{method}:{uri}")
    if qop is None:
        return _hash(algorithm, f"{ha1.lower()}:{nonce}:{ha2}")
    return _hash(algorithm, f"{ha1.lower()}:{nonce}:{nc}:{cnonce}:{qop}:{ha2}")


# ------------------------------------------------------------------ grammar


def _skip_lws(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t":
        i += 1
    return i


def _read_token(text: str, i: int) -> tuple[str, int]:
    j = i
    while j < len(text) and text[j] in TOKEN_CHARS:
        j += 1
    return text[i:j], j


def parse_auth_header(value: str) -> tuple[str, dict[str, str]]:
    """Split a challenge or credentials value into (scheme, params).

    Grammar (RFC 3261 §25.1, RFC 7235 §2.1): ``scheme LWS auth-param *(COMMA
    auth-param)`` with ``auth-param = token EQUAL (token / quoted-string)``.
    Parameter names are lower-cased; quoted values are unescaped; empty list
    elements are skipped (RFC 7230 §7). The scheme keeps its spelling.
    Raises :class:`AuthHeaderError` on anything else (also on a repeated
    parameter, which RFC 7616 §3.3 forbids).
    """
    if not isinstance(value, str):
        raise AuthHeaderError(0, "not text")
    i = _skip_lws(value, 0)
    scheme, i = _read_token(value, i)
    if not scheme:
        raise AuthHeaderError(i, "missing auth scheme")
    params: dict[str, str] = {}
    if i < len(value) and value[i] not in " \t":
        raise AuthHeaderError(i, "expected whitespace after the auth scheme")
    expect_param = True
    while True:
        i = _skip_lws(value, i)
        if i >= len(value):
            break
        if value[i] == ",":
            i += 1
            expect_param = True
            continue
        if not expect_param:
            raise AuthHeaderError(i, "expected ',' between parameters")
        name, i = _read_token(value, i)
        if not name:
            raise AuthHeaderError(i, "expected a parameter name")
        i = _skip_lws(value, i)
        if i >= len(value) or value[i] != "=":
            raise AuthHeaderError(i, f"expected '=' after {name[:20]!r}")
        i = _skip_lws(value, i + 1)
        if i < len(value) and value[i] == '"':
            try:
                param, i = read_quoted(value, i)
            except SipParseError as exc:
                raise AuthHeaderError(exc.position, exc.reason) from None
        else:
            param, i = _read_token(value, i)
            if not param:
                raise AuthHeaderError(i, f"empty value for {name[:20]!r}")
        key = name.lower()
        if key in params:
            raise AuthHeaderError(i, f"repeated parameter {key[:20]!r}")
        params[key] = param
        expect_param = False
    return scheme, params


# Parameters RFC 7616 sends as tokens, never quoted: in challenges (§3.3)
# and in credentials (§3.4, where ``qop`` is a token too; in a challenge it
# is a quoted list).
CHALLENGE_TOKENS = frozenset({"algorithm", "stale"})
CREDENTIAL_TOKENS = frozenset({"algorithm", "nc", "qop"})


def format_auth_params(
    scheme: str,
    params: Iterable[tuple[str, str]],
    *,
    tokens: frozenset[str] = CREDENTIAL_TOKENS,
) -> str:
    """Write ``scheme name="value", ...``: every value quoted except the names in ``tokens``.

    Raises :class:`ValueError` if a token value is not a token (it could not
    be read back).
    """
    parts: list[str] = []
    for name, value in params:
        if name in tokens:
            if not value or any(c not in TOKEN_CHARS for c in value):
                raise ValueError(f"{name} value {value!r} is not a token")
            parts.append(f"{name}={value}")
        else:
            parts.append(f"{name}={quote(value)}")
    return f"{scheme} " + ", ".join(parts)


# ------------------------------------------------------------------ views


@dataclass(frozen=True, slots=True)
class Challenge:
    """One parsed Digest challenge (RFC 7616 §3.3). ``proxy`` is True for 407."""

    realm: str
    nonce: str
    algorithm: str = "MD5"
    qop: tuple[str, ...] = ()
    opaque: str | None = None
    stale: bool = False
    proxy: bool = False


def parse_challenge(value: str, *, proxy: bool = False) -> Challenge:
    """Parse a ``WWW-Authenticate``/``Proxy-Authenticate`` value.

    Raises :class:`AuthHeaderError` if it does not parse or lacks realm or
    nonce, and :class:`AuthUnsupportedError` if it is not a Digest challenge
    or names an algorithm we do not implement.
    """
    scheme, params = parse_auth_header(value)
    if scheme.lower() != "digest":
        raise AuthUnsupportedError(f"auth scheme {scheme[:20]!r} not supported")
    if "realm" not in params or "nonce" not in params:
        raise AuthHeaderError(0, "challenge without realm or nonce")
    algorithm = canonical_algorithm(params.get("algorithm", "MD5"))
    if algorithm is None:
        raise AuthUnsupportedError(f"algorithm {params['algorithm'][:20]!r} not supported")
    qop = tuple(q.strip().lower() for q in params.get("qop", "").split(",") if q.strip())
    return Challenge(
        realm=params["realm"],
        nonce=params["nonce"],
        algorithm=algorithm,
        qop=qop,
        opaque=params.get("opaque"),
        stale=params.get("stale", "").lower() == "true",
        proxy=proxy,
    )


@dataclass(frozen=True, slots=True)
class Credentials:
    """One parsed Digest answer (RFC 7616 §3.4). ``qop`` None means RFC 2069 style."""

    username: str
    realm: str
    nonce: str
    uri: str
    response: str
    algorithm: str = "MD5"
    qop: str | None = None
    nc: str = ""
    cnonce: str = ""
    opaque: str | None = None

    @property
    def nc_value(self) -> int:
        """The nonce-count as a number (0 when absent)."""
        return int(self.nc, 16) if self.nc else 0


def parse_credentials(value: str) -> Credentials:
    """Parse an ``Authorization``/``Proxy-Authorization`` value.

    Checks the shape RFC 7616 §3.4 requires: username, realm, nonce, uri and
    response present; ``response`` is hex of the algorithm's length; with
    ``qop`` also ``nc`` (8 hex digits) and ``cnonce``. Raises
    :class:`AuthHeaderError` (also for a non-Digest scheme or an unknown
    algorithm: we never challenged for those).
    """
    scheme, params = parse_auth_header(value)
    if scheme.lower() != "digest":
        raise AuthHeaderError(0, f"auth scheme {scheme[:20]!r} not supported")
    for name in ("username", "realm", "nonce", "uri", "response"):
        if name not in params:
            raise AuthHeaderError(0, f"credentials without {name}")
    algorithm = canonical_algorithm(params.get("algorithm", "MD5"))
    if algorithm is None:
        raise AuthHeaderError(0, f"unknown algorithm {params['algorithm'][:20]!r}")
    response = params["response"]
    if len(response) != _HEX_LEN[algorithm] or not set(response) <= _HEX:
        raise AuthHeaderError(0, "response is not a digest of the named algorithm")
    qop = params.get("qop")
    nc = params.get("nc", "")
    cnonce = params.get("cnonce", "")
    if qop is not None:
        qop = qop.lower()
        if len(nc) != 8 or not set(nc) <= _HEX:
            raise AuthHeaderError(0, "nc must be 8 hex digits (RFC 7616 §3.4)")
        if not cnonce:
            raise AuthHeaderError(0, "qop without cnonce")
    return Credentials(
        username=params["username"],
        realm=params["realm"],
        nonce=params["nonce"],
        uri=params["uri"],
        response=response.lower(),
        algorithm=algorithm,
        qop=qop,
        nc=nc,
        cnonce=cnonce,
        opaque=params.get("opaque"),
    )
