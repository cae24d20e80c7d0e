"""Digest authentication for SIP (RFC 3261 §22 with RFC 7616 and RFC 8760), sans-IO.

Theory of operation
-------------------

Server side (:class:`DigestServer`): a request without usable credentials gets
an :class:`AuthChallenge` to send as 401 (``WWW-Authenticate``) or 407
(``Proxy-Authenticate``). As RFC 8760 §2.4 asks, one challenge is offered per
algorithm, each in its own header value, in order of preference (SHA-256
first, then MD5, so old MD5-only clients still get in). :meth:`DigestServer.verify`
checks the ``Authorization`` (or ``Proxy-Authorization``) answer and returns
:class:`AuthOk` or a new :class:`AuthChallenge` (with ``stale=true`` when only
the nonce was too old, RFC 7616 §3.3). A header that does not parse raises
:class:`sip.errors.AuthHeaderError` (the caller answers 400); nothing else
escapes.

Nonces are stateless: ``base64url(issue time || random || HMAC(secret,
realm || issue time || random))``, so a server can hand out nonces to anyone
without storing them (a flood of unauthenticated REGISTERs costs no memory)
and still tells its own, unexpired nonces from forged ones. The only state is
the highest nonce-count seen per nonce (RFC 7616 §3.4: replay protection),
kept only for nonces that authenticated a request and dropped once they
expire.

Client side (:class:`DigestClient`): given a 401/407 and the request that
got it, pick the first challenge we can answer (the server lists them in its
order of preference, RFC 8760 §2.4) and build the ``Authorization`` value for
the retry; later requests may reuse the nonce pre-emptively with the next
nonce-count (RFC 7616 §3.4.5: ``nc`` counts requests per nonce).

The hashes and the header grammar are :mod:`sip.digest`'s (re-exported here).

Time comes in as ``now`` (float seconds, any clock, the same one on every
call); random bytes from an injected ``Callable[[int], bytes]``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from dataclasses import dataclass
from typing import Protocol

from sip.digest import (
    ALGORITHMS,
    CHALLENGE_HEADER,
    CHALLENGE_TOKENS,
    CREDENTIAL_TOKENS,
    CREDENTIALS_HEADER,
    STATUS,
    Challenge,
    Credentials,
    RandomSource,
    canonical_algorithm,
    compute_ha1,
    compute_response,
    format_auth_params,
    parse_auth_header,
    parse_challenge,
    parse_credentials,
)
from sip.errors import (
    AuthHeaderError,
    AuthRejectedError,
    AuthUnsupportedError,
    SipParseError,
)
from sip.message import Request, Response
from sip.uri import parse_uri

__all__ = [
    "ALGORITHMS",
    "CHALLENGE_TOKENS",
    "CREDENTIAL_TOKENS",
    "AuthChallenge",
    "AuthOk",
    "Challenge",
    "CredentialStore",
    "Credentials",
    "DigestClient",
    "DigestConfig",
    "DigestServer",
    "MemoryCredentialStore",
    "Verifier",
    "compute_ha1",
    "compute_response",
    "format_auth_params",
    "parse_auth_header",
    "parse_challenge",
    "parse_credentials",
]

# ------------------------------------------------------------------ server


class CredentialStore(Protocol):
    """Where a server finds a user's secret: HA1 in hex for (username, realm, algorithm).

    Returning HA1, not the password, lets a store keep only hashes (RFC 7616
    §5.2). ``None`` means no such user (the server then challenges again and
    never says which part was wrong).
    """

    def ha1(self, username: str, realm: str, algorithm: str) -> str | None: ...


class MemoryCredentialStore:
    """In-memory :class:`CredentialStore` holding plaintext passwords and/or HA1 values."""

    def __init__(self) -> None:
        self._passwords: dict[tuple[str, str], str] = {}
        self._ha1: dict[tuple[str, str, str], str] = {}

    def add_password(self, username: str, realm: str, password: str) -> None:
        """Store a plaintext password (HA1 of any algorithm is computed on demand)."""
        self._passwords[(username, realm)] = password

    def add_ha1(self, username: str, realm: str, algorithm: str, ha1: str) -> None:
        """Store a precomputed HA1. Raises :class:`ValueError` for an unknown algorithm."""
        canon = canonical_algorithm(algorithm)
        if canon is None:
            raise ValueError(f"unknown algorithm {algorithm!r}")
        self._ha1[(username, realm, canon)] = ha1.lower()

    def ha1(self, username: str, realm: str, algorithm: str) -> str | None:
        """HA1 in hex, or None when the user (or that algorithm's hash) is unknown."""
        canon = canonical_algorithm(algorithm)
        if canon is None:
            return None
        stored = self._ha1.get((username, realm, canon))
        if stored is not None:
            return stored
        password = self._passwords.get((username, realm))
        return None if password is None else compute_ha1(username, realm, password, canon)


@dataclass(frozen=True, kw_only=True, slots=True)
class DigestConfig:
    """Server-side Digest settings.

    ``realm``: the protection domain, usually the SIP domain (§22.1).
    ``algorithms``: offered in this order of preference, one challenge each
    (RFC 8760 §2.4), default SHA-256 then MD5.
    ``nonce_lifetime``: seconds a nonce stays good; older ones get
    ``stale=true`` (default 300).
    ``allow_rfc2069``: accept answers without ``qop`` from old clients (RFC
    2069); off by default because they carry no cnonce/nc, so no replay
    protection beyond the nonce lifetime.
    ``max_tracked_nonces``: bound on the nonce-count table (default 10000).
    ``retarget_uris``: URIs a proxy may have replaced with our contact (location
    lookup, §16.5): a digest ``uri`` naming one of them is accepted although the
    Request-URI now differs (RFC 3261 §22.4 leaves the comparison to the server; the
    response hash still covers the ``uri`` the client sent, so nothing is weakened
    beyond accepting our own address-of-record as the target).
    """

    realm: str
    algorithms: tuple[str, ...] = ("SHA-256", "MD5")
    nonce_lifetime: float = 300.0
    allow_rfc2069: bool = False
    max_tracked_nonces: int = 10000
    retarget_uris: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.algorithms or any(a not in ALGORITHMS for a in self.algorithms):
            raise ValueError(f"algorithms must be a non-empty subset of {list(ALGORITHMS)}")
        if self.nonce_lifetime <= 0 or self.max_tracked_nonces < 1:
            raise ValueError("nonce_lifetime and max_tracked_nonces must be positive")


@dataclass(frozen=True, slots=True)
class AuthOk:
    """The request carried valid credentials of ``username`` (in ``realm``)."""

    username: str
    realm: str = ""
    algorithm: str = "MD5"


@dataclass(frozen=True, slots=True)
class AuthChallenge:
    """Answer the request with ``status`` (401 or 407) carrying ``headers``.

    ``reason`` says why (for logs and a Warning header), e.g. ``"no
    credentials"``, ``"stale nonce"``, ``"wrong credentials"``.
    """

    headers: tuple[tuple[str, str], ...]
    status: int = 401
    reason: str = ""
    stale: bool = False


class Verifier(Protocol):
    """What checks a request's Digest credentials: :class:`DigestServer`, or a wrapper
    bound to one request's context (its source, for a login throttle)."""

    def verify(
        self, request: Request, now: float, *, proxy: bool = False
    ) -> AuthOk | AuthChallenge: ...


_NONCE_RANDOM = 12
_B64URL = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
_NONCE_MAC = 16


class DigestServer:
    """Issue challenges and verify answers for one realm (RFC 3261 §22.2-22.4).

    ``secret`` keys the nonce MAC; give the same secret to every process of a
    cluster (and across restarts) so nonces stay valid; by default a fresh
    one is drawn from ``random``.
    """

    def __init__(
        self,
        config: DigestConfig,
        store: CredentialStore,
        random: RandomSource,
        *,
        secret: bytes | None = None,
    ) -> None:
        self.config = config
        self._store = store
        self._random = random
        self._secret = secret if secret is not None else random(32)
        # The highest nonce-count seen of each nonce in use (its issue time is in the
        # nonce itself: a record per nonce would cost ~100 bytes more, per login).
        self._uses: dict[str, int] = {}
        # Nonces issued at or before this time that are not in _uses were
        # evicted from the table: treat them as stale, never as fresh.
        self._evicted_upto = float("-inf")

    # -------------------------------------------------------------- nonces

    def _mac(self, stamp: bytes, rand: bytes) -> bytes:
        data = self.config.realm.encode("utf-8") + b"\0" + stamp + rand
        return hmac.new(self._secret, data, hashlib.sha256).digest()[:_NONCE_MAC]

    def make_nonce(self, now: float) -> str:
        """A fresh nonce carrying its issue time (milliseconds) under our MAC."""
        ms = max(-(2**63), min(2**63 - 1, int(now * 1000)))
        stamp = ms.to_bytes(8, "big", signed=True)
        rand = self._random(_NONCE_RANDOM)
        raw = stamp + rand + self._mac(stamp, rand)
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")

    def _nonce_time(self, nonce: str) -> float | None:
        """Issue time of one of our nonces, or None if it is not ours."""
        if len(nonce) != 48 or not set(nonce) <= _B64URL:
            return None
        try:
            raw = base64.urlsafe_b64decode(nonce)
        except (binascii.Error, ValueError):
            return None
        stamp, rand, mac = raw[:8], raw[8:20], raw[20:]
        if not hmac.compare_digest(mac, self._mac(stamp, rand)):
            return None
        return _issued(raw)

    # -------------------------------------------------------------- challenge

    def challenge(
        self, now: float, *, proxy: bool = False, stale: bool = False, reason: str = ""
    ) -> AuthChallenge:
        """A 401 (407 with ``proxy``) offering every configured algorithm, in order.

        One header value per algorithm (RFC 8760 §2.4), all with the same
        nonce; ``qop="auth"`` only (we never need the body, §22.4 allows it).
        """
        nonce = self.make_nonce(now)
        name = CHALLENGE_HEADER[proxy]
        headers: list[tuple[str, str]] = []
        for algorithm in self.config.algorithms:
            params = [
                ("realm", self.config.realm),
                ("nonce", nonce),
                ("algorithm", algorithm),
                ("qop", "auth"),
            ]
            if stale:
                params.append(("stale", "true"))
            headers.append((name, format_auth_params("Digest", params, tokens=CHALLENGE_TOKENS)))
        return AuthChallenge(
            headers=tuple(headers), status=STATUS[proxy], reason=reason, stale=stale
        )

    # -------------------------------------------------------------- verify

    def verify(
        self, request: Request, now: float, *, proxy: bool = False
    ) -> AuthOk | AuthChallenge:
        """Check a request's credentials for our realm.

        Returns :class:`AuthOk` or the :class:`AuthChallenge` to answer with.
        Credentials for other realms are ignored (§22.3: they may be meant for
        another proxy). Raises :class:`AuthHeaderError` if the credentials
        value for our realm (or one whose realm cannot be read) is malformed.
        """
        name = CREDENTIALS_HEADER[proxy]
        for value in request.headers.get_raw(name):
            scheme, params = parse_auth_header(value)
            if scheme.lower() != "digest" or params.get("realm") != self.config.realm:
                continue
            return self.verify_value(value, request.method, request.uri, now, proxy=proxy)
        return self.challenge(now, proxy=proxy, reason="no credentials for our realm")

    def verify_value(
        self, value: str, method: str, request_uri: str, now: float, *, proxy: bool = False
    ) -> AuthOk | AuthChallenge:
        """Check one credentials value against ``method`` and ``request_uri``.

        The checks, in the order RFC 7616 §3.4 and RFC 3261 §22.4 imply:
        realm is ours; the algorithm is one we offer; ``uri`` names the
        Request-URI; qop is ``auth`` (or absent when RFC 2069 answers are
        allowed); the response matches HA1 from the store; then the nonce is
        ours, unexpired and its count grew (else ``stale=true``: the password
        was right). Raises :class:`AuthHeaderError` if ``value`` is malformed.
        """
        creds = parse_credentials(value)

        def again(reason: str, stale: bool = False) -> AuthChallenge:
            return self.challenge(now, proxy=proxy, stale=stale, reason=reason)

        if creds.realm != self.config.realm:
            return again("credentials for another realm")
        if creds.algorithm not in self.config.algorithms:
            return again(f"algorithm {creds.algorithm} not offered")
        if not self._same_uri(creds.uri, request_uri) and not any(
            self._same_uri(creds.uri, uri) for uri in self.config.retarget_uris
        ):
            # RFC 7616 §3.4.6: the uri must name the request's target; a
            # mismatch may be a replay against another resource: 400.
            raise AuthHeaderError(0, "digest uri does not match the Request-URI")
        if creds.qop is None:
            if not self.config.allow_rfc2069:
                return again("answer without qop (RFC 2069) not accepted")
        elif creds.qop != "auth":
            return again(f"qop {creds.qop[:20]!r} not offered")
        ha1 = self._store.ha1(creds.username, creds.realm, creds.algorithm)
        expected = (
            None
            if ha1 is None
            else compute_response(
                algorithm=creds.algorithm,
                ha1=ha1,
                nonce=creds.nonce,
                method=method,
                uri=creds.uri,
                qop=creds.qop,
                nc=creds.nc,
                cnonce=creds.cnonce,
            )
        )
        # Same answer for unknown user and wrong password: say nothing about which.
        if expected is None or not hmac.compare_digest(expected, creds.response):
            return again("wrong credentials")
        # Only now, with a proven password, is the nonce judged: RFC 7616 §3.3 sets
        # stale=true when the digest was valid but the nonce is not (old, not ours, its
        # count used), so a client that sent credentials ahead with a nonce we forgot
        # (a restart, another node, an evicted count) retries at once and is no failed
        # login; a replayer learns nothing it could answer.
        issued = self._nonce_time(creds.nonce)
        if issued is None or issued > now + 1.0:
            return again("nonce not issued by us", stale=True)
        if now - issued > self.config.nonce_lifetime:
            self._uses.pop(creds.nonce, None)
            return again("stale nonce", stale=True)
        if not self._count(creds.nonce, issued, creds.nc_value if creds.qop else None, now):
            return again("nonce-count replayed", stale=True)
        return AuthOk(username=creds.username, realm=creds.realm, algorithm=creds.algorithm)

    @staticmethod
    def _same_uri(digest_uri: str, request_uri: str) -> bool:
        if digest_uri == request_uri:
            return True
        try:
            return parse_uri(digest_uri) == parse_uri(request_uri)
        except SipParseError:
            return False

    def _count(self, nonce: str, issued: float, nc: int | None, now: float) -> bool:
        """Record a use of ``nonce``; False if its nonce-count did not grow (replay).

        RFC 2069 answers (``nc`` None) have no count: each nonce is good once.
        """
        highest = self._uses.get(nonce)
        if highest is None:
            if issued <= self._evicted_upto:
                return False
            self._prune(now)
            self._uses[nonce] = nc or 0
            return True
        if nc is None or nc <= highest:
            return False
        self._uses[nonce] = nc
        return True

    def _prune(self, now: float) -> None:
        if len(self._uses) < self.config.max_tracked_nonces:
            return
        horizon = now - self.config.nonce_lifetime
        issued = {n: _issued(base64.urlsafe_b64decode(n)) for n in self._uses}
        self._uses = {n: nc for n, nc in self._uses.items() if issued[n] >= horizon}
        excess = len(self._uses) - self.config.max_tracked_nonces + 1
        if excess > 0:
            # Evict the oldest tenth (at least the excess); remember their age
            # so they can never count as unused again.
            victims = sorted(self._uses, key=issued.__getitem__)
            victims = victims[: max(excess, len(victims) // 10)]
            for nonce in victims:
                self._evicted_upto = max(self._evicted_upto, issued[nonce])
                del self._uses[nonce]

    @property
    def tracked_nonces(self) -> int:
        """How many nonces have a nonce-count on record (for metrics)."""
        return len(self._uses)


def _issued(raw: bytes) -> float:
    """The issue time (seconds) a decoded nonce of ours carries."""
    return int.from_bytes(raw[:8], "big", signed=True) / 1000.0


# ------------------------------------------------------------------ client


@dataclass(slots=True)
class _ClientNonce:
    challenge: Challenge
    nc: int = 0


class DigestClient:
    """The UAC side of Digest (RFC 3261 §22.2-22.3) for one set of credentials.

    ``random`` gives the cnonce bytes. One client may hold nonces for several
    realms (a registrar and a proxy); each nonce keeps its own count.
    """

    def __init__(self, username: str, password: str, random: RandomSource) -> None:
        self.username = username
        self.password = password
        self._random = random
        self._nonces: dict[tuple[bool, str], _ClientNonce] = {}

    def respond(self, response: Response, request: Request) -> tuple[str, str]:
        """The (header name, value) to add to the retry of ``request`` after ``response``.

        ``response`` is the 401/407; every challenge it carries is parsed and
        the first one we can answer is used (the server's order of
        preference, RFC 8760 §2.4); unparseable or unsupported ones are
        skipped. Raises :class:`AuthUnsupportedError` when none is usable and
        :class:`AuthRejectedError` when ``request`` already carried our
        answer for that realm and the new challenge is not ``stale`` (the
        password was refused: retrying would loop, §22.2).
        """
        proxy = response.status == 407
        name = CHALLENGE_HEADER[proxy]
        chosen: Challenge | None = None
        for value in response.headers.get_raw(name):
            try:
                challenge = parse_challenge(value, proxy=proxy)
            except (AuthHeaderError, AuthUnsupportedError):
                continue
            if challenge.qop and "auth" not in challenge.qop:
                continue  # auth-int only: we do not hash bodies
            chosen = challenge
            break
        if chosen is None:
            raise AuthUnsupportedError(f"no usable Digest challenge in {name}")
        if not chosen.stale and self._answered(request, chosen):
            self._nonces.pop((proxy, chosen.realm), None)  # nothing goes ahead (refused)
            raise AuthRejectedError(
                f"credentials for realm {chosen.realm!r} refused", status=response.status
            )
        # A new challenge replaces what we knew of that realm.
        self._nonces[(proxy, chosen.realm)] = _ClientNonce(chosen)
        return self.authorize(request.method, request.uri, realm=chosen.realm, proxy=proxy)

    def refused(self, response: Response) -> None:
        """``response``, a 401/407 without ``stale``, refused our answer: nothing goes
        ahead again for its realms (:meth:`preemptive`) until a new challenge is
        answered; a wrong password sent ahead on every request would cost its user a
        failed login at the server each time."""
        proxy = response.status == 407
        for value in response.headers.get_raw(CHALLENGE_HEADER[proxy]):
            try:
                challenge = parse_challenge(value, proxy=proxy)
            except (AuthHeaderError, AuthUnsupportedError):
                continue
            if not challenge.stale:
                self._nonces.pop((proxy, challenge.realm), None)

    def _answered(self, request: Request, challenge: Challenge) -> bool:
        """Whether ``request`` answered a challenge of that realm with the first use of
        its nonce: a refusal then means the password, and retrying would loop. Credentials
        sent ahead (:meth:`preemptive`, a later count) earn one retry: the server may
        have forgotten or never issued that nonce (a restart, another node)."""
        for value in request.headers.get_raw(CREDENTIALS_HEADER[challenge.proxy]):
            try:
                creds = parse_credentials(value)
            except AuthHeaderError:
                continue
            if creds.realm == challenge.realm and creds.username == self.username:
                return creds.nc_value <= 1
        return False

    def preemptive(self, method: str, uri: str) -> tuple[str, str] | None:
        """Credentials to send with a new request before any challenge to it, answering
        the challenge kept for the first realm we answered (RFC 3261 §22.1: the same
        protection space; RFC 7616 §3.4.5: the next nonce-count), or None: none kept, or
        one without ``qop``, whose nonce is good once. Saves a challenge's round trip."""
        for (proxy, realm), entry in self._nonces.items():
            if entry.challenge.qop:
                return self.authorize(method, uri, realm=realm, proxy=proxy)
        return None

    def authorize(
        self, method: str, uri: str, *, realm: str | None = None, proxy: bool = False
    ) -> tuple[str, str]:
        """(header name, value) answering the last challenge of ``realm`` (any realm if None).

        Use it pre-emptively on later requests (e.g. REGISTER refreshes): the
        nonce-count goes up by one each time (RFC 7616 §3.4.5). Raises
        :class:`AuthUnsupportedError` when no challenge of that realm was seen.
        """
        entry: _ClientNonce | None = None
        for (is_proxy, known_realm), candidate in self._nonces.items():
            if is_proxy == proxy and realm in (None, known_realm):
                entry = candidate
                break
        if entry is None:
            raise AuthUnsupportedError("no challenge received for that realm yet")
        ch = entry.challenge
        ha1 = compute_ha1(self.username, ch.realm, self.password, ch.algorithm)
        params: list[tuple[str, str]] = [
            ("username", self.username),
            ("realm", ch.realm),
            ("nonce", ch.nonce),
            ("uri", uri),
        ]
        if ch.qop:
            entry.nc += 1
            nc = f"{entry.nc:08x}"
            cnonce = self._random(16).hex()
            digest = compute_response(
                algorithm=ch.algorithm,
                ha1=ha1,
                nonce=ch.nonce,
                method=method,
                uri=uri,
                qop="auth",
                nc=nc,
                cnonce=cnonce,
            )
            params += [("response", digest), ("algorithm", ch.algorithm)]
            params += [("cnonce", cnonce), ("qop", "auth"), ("nc", nc)]
        else:
            # RFC 2069 server: no qop offered, so answer without cnonce/nc.
            digest = compute_response(
                algorithm=ch.algorithm, ha1=ha1, nonce=ch.nonce, method=method, uri=uri
            )
            params += [("response", digest), ("algorithm", ch.algorithm)]
        if ch.opaque is not None:
            params.append(("opaque", ch.opaque))
        return CREDENTIALS_HEADER[proxy], format_auth_params("Digest", params)
