"""Digest authentication of the broker's SIP endpoint, over the SQL users.

- :class:`StoreCredentials` reads HA1 from the store (on the database thread);
- :class:`CachedCredentials` answers the UA's synchronous checks from memory, filled on
  the database thread first (the event loop never calls the database);
- :class:`LoginAttempt` is one request's authentication context (source, user, nonce,
  outcome), which travels with the request;
- :class:`GuardedDigest` checks an attempt's credentials and refuses, unchecked, the
  logins the :class:`~mdeci.broker.throttle.LoginThrottle` locked (unlimited guessing);
- :func:`ensure_users` adds the configured users the store does not have;
- :class:`FailedLogins` logs credentials given and refused (``auth_failed``), rate-limited
  and summarised (``auth_failed_summary``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from mdeci.broker.addresses import addr_text
from mdeci.broker.login_log import LoginLog
from mdeci.broker.throttle import LoginThrottle, source_key
from mdeci.config import LoginThrottleConfig, UserConfig
from mdeci.oplog import event as oplog_event
from mdeci.store.errors import UnsupportedAlgorithm
from mdeci.store.repo import BrokerStore
from sip.aio.ua import Reply
from sip.auth import (
    AuthChallenge,
    AuthOk,
    CredentialStore,
    DigestConfig,
    DigestServer,
    parse_auth_header,
)
from sip.errors import AuthHeaderError, SipParseError
from sip.message import Request
from sip.transaction import Address
from sip.uri import SipUri

# HA1 entries kept for Digest (each user has one per algorithm; ~0.3 kB each). Above the
# users a broker holds sessions of: the in-dialog guard reads only the cache, and a
# working set just above the bound evicts, at every refetch, another owner's entries.
CACHED_HA1 = 100_000


class StoreCredentials:
    """:class:`sip.auth.CredentialStore` over ``BrokerStore.users`` (HA1 only)."""

    def __init__(self, store: BrokerStore) -> None:
        self._store = store

    def ha1(self, username: str, realm: str, algorithm: str) -> str | None:
        """HA1 hex, or None for an unknown user or algorithm. Raises StoreError."""
        try:
            return self._store.users.get_credentials(username, realm, algorithm)
        except UnsupportedAlgorithm:
            return None


class CachedCredentials:
    """:class:`sip.auth.CredentialStore` answering from memory, filled off the loop.

    :meth:`fetch` runs on the database thread and returns what :meth:`keep` stores on
    the loop; :meth:`ha1` never touches the database (an entry not fetched reads as an
    unknown user). At most ``size`` entries per realm and algorithm, the first fetched
    dropped first (a fetch again refreshes an entry's value, not its place).
    """

    def __init__(
        self, store: BrokerStore, algorithms: tuple[str, ...], size: int = CACHED_HA1
    ) -> None:
        self._store = store
        self._algorithms = tuple(dict.fromkeys((*algorithms, "SHA-256")))
        self._size = size
        # Per (realm, algorithm), by username: a table per pair and the digest as an int
        # instead of its hex keep ~130 bytes less per user than one table by (user,
        # realm, algorithm) of hex text (a broker holds every session owner's entries),
        # and a plain table with its names in fetch order ~45 less than an OrderedDict.
        # A value that is not lowercase hex of the algorithm's length stays text.
        self._tables: dict[tuple[str, str], dict[str, int | str | None]] = {}
        self._order: dict[tuple[str, str], deque[str]] = {}  # each table's keys, in order

    def fetch(self, username: str, realm: str) -> dict[tuple[str, str, str], str | None]:
        """Every HA1 of ``username`` in ``realm`` (database thread). Raises StoreError."""
        found: dict[tuple[str, str, str], str | None] = {}
        for algorithm in self._algorithms:
            try:
                ha1 = self._store.users.get_credentials(username, realm, algorithm)
            except UnsupportedAlgorithm:
                ha1 = None
            found[(username, realm, algorithm)] = ha1
        return found

    def fetch_many(self, users: list[str], realm: str) -> dict[tuple[str, str, str], str | None]:
        """:meth:`fetch` for each of ``users``, in one query per thousand (database
        thread). Raises StoreError."""
        found = self._store.users.credentials_of(users, realm, self._algorithms)
        return {
            (user, realm, algorithm): found.get((user, algorithm))
            for user in users
            for algorithm in self._algorithms
        }

    def keep(self, found: dict[tuple[str, str, str], str | None]) -> None:
        for (username, realm, algorithm), ha1 in found.items():
            table = self._tables.get((realm, algorithm))
            if table is None:
                table = self._tables[(realm, algorithm)] = {}
                self._order[(realm, algorithm)] = deque()
            order = self._order[(realm, algorithm)]
            if username not in table:
                order.append(username)
            table[username] = _packed(ha1, algorithm)
            while len(table) > self._size:
                del table[order.popleft()]

    def ha1(self, username: str, realm: str, algorithm: str) -> str | None:
        table = self._tables.get((realm, algorithm))
        value = None if table is None else table.get(username)
        return f"{value:0{_HEX_DIGITS[algorithm]}x}" if isinstance(value, int) else value

    def knows(self, username: str, realm: str) -> bool:
        """Whether ``username``'s entries are here (fetched, even as "no such user")."""
        table = self._tables.get((realm, "SHA-256"))
        return table is not None and username in table


# The hex digits of an HA1 per algorithm (RFC 7616: the hash's output).
_HEX_DIGITS = {"MD5": 32, "SHA-256": 64, "SHA-512-256": 64}


def _packed(ha1: str | None, algorithm: str) -> int | str | None:
    """``ha1`` as the int its lowercase hex spells when it has the algorithm's length,
    else as it is (read back unchanged either way)."""
    if ha1 is None or len(ha1) != _HEX_DIGITS.get(algorithm):
        return ha1
    try:
        value = int(ha1, 16)
    except ValueError:
        return ha1
    return value if f"{value:0{len(ha1)}x}" == ha1 else ha1


def ensure_users(
    store: BrokerStore,
    domain: str,
    realm: str,
    users: tuple[UserConfig, ...],
    *,
    md5: bool = False,
) -> int:
    """Add each user ``sip:<user>@<domain>`` that the store does not have; how many were added.

    Existing users keep their stored password. Raises StoreError (incl. DuplicateUser
    when the username exists in the realm under another URI).
    """
    uris = [f"sip:{u.user}@{domain}" for u in users]
    known = store.users.known(uris)
    added = 0
    for u, uri in zip(users, uris, strict=True):
        if uri not in known:
            store.users.add_user(uri, realm, u.password, username=u.user, md5=md5)
            known.add(uri)
            added += 1
    return added


@dataclass(slots=True)
class LoginAttempt:
    """The authentication context of one request, made when it arrives. It travels with
    the request through every await (the database reads included), so that requests
    handled at the same time never see each other's source or outcome."""

    source: Address
    user: str | None = None  # the username of its credentials for our realm
    nonce: str | None = None  # the nonce those credentials answer
    refused: str = ""  # why the guard refused it: "wrong credentials", a lock
    locked: str = ""  # what its failure locked: "source", "user", "user and source"


class _BoundVerifier:
    """A :class:`sip.auth.Verifier` for one :class:`LoginAttempt`."""

    def __init__(self, guard: GuardedDigest, attempt: LoginAttempt) -> None:
        self._guard = guard
        self._attempt = attempt

    def verify(
        self, request: Request, now: float, *, proxy: bool = False
    ) -> AuthOk | AuthChallenge:
        return self._guard.check(self._attempt, request, now, proxy=proxy)


class GuardedDigest:
    """Digest (:class:`~sip.auth.DigestServer`) behind the
    :class:`~mdeci.broker.throttle.LoginThrottle`: a login the throttle locked is refused
    with a challenge, its credentials not even checked; a failure is counted against the
    attempt's source address and (when the user exists) its user.

    Every check names its :class:`LoginAttempt` (:meth:`check`, :meth:`bound`); there is
    no shared "current request". :meth:`verify`, with no attempt, only challenges.

    The throttle runs on ``monotonic``: a lockout is a duration, which a wall-clock step
    must neither end nor stretch. The ``now`` of the checks (wall clock) only dates
    nonces, which the peer sees.
    """

    def __init__(
        self,
        config: DigestConfig,
        store: CredentialStore,
        random: Callable[[int], bytes],
        throttle: LoginThrottle,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.server = DigestServer(config, store, random)
        self._store = store
        self.throttle = throttle
        self.monotonic = monotonic
        self.failures = 0

    def _credentials(self, request: Request) -> dict[str, str] | None:
        for value in request.headers.get_raw("Authorization"):
            try:
                scheme, params = parse_auth_header(value)
            except AuthHeaderError:
                continue
            if scheme.lower() == "digest" and params.get("realm") == self.config.realm:
                return params
        return None

    def username(self, request: Request) -> str | None:
        """The user named by ``request``'s Digest credentials for our realm, if any."""
        params = self._credentials(request)
        return None if params is None else params.get("username")

    def attempt(self, request: Request, source: Address) -> LoginAttempt:
        """The context of ``request`` from ``source``."""
        params = self._credentials(request) or {}
        return LoginAttempt(source, user=params.get("username"), nonce=params.get("nonce"))

    def bound(self, attempt: LoginAttempt) -> _BoundVerifier:
        """A verifier that checks requests as ``attempt``."""
        return _BoundVerifier(self, attempt)

    def verify(self, request: Request, now: float, *, proxy: bool = False) -> AuthChallenge:
        """Without an attempt there is no source to throttle by: a challenge, unchecked."""
        return self.server.challenge(now, proxy=proxy, reason="no request context")

    def check(
        self, attempt: LoginAttempt, request: Request, now: float, *, proxy: bool = False
    ) -> AuthOk | AuthChallenge:
        """As ``DigestServer.verify``, for ``attempt``; raises AuthHeaderError alike."""
        user = attempt.user
        if user is None:
            return self.server.verify(request, now, proxy=proxy)  # no credentials yet
        host = attempt.source[0]
        if self.throttle.retry_after(user, host, self.monotonic()) is not None:
            attempt.refused = "too many failed logins"
            return self.server.challenge(now, proxy=proxy, reason=attempt.refused)
        result = self.server.verify(request, now, proxy=proxy)
        if isinstance(result, AuthChallenge) and result.reason == "wrong credentials":
            self.failures += 1
            attempt.refused = result.reason
            attempt.locked = self.throttle.failed(
                user, host, self.monotonic(), known_user=self._known(user)
            )
        elif isinstance(result, AuthOk):
            self.throttle.succeeded(result.username)
        return result

    def _known(self, user: str) -> bool:
        realm = self.config.realm
        return any(self._store.ha1(user, realm, a) is not None for a in self.config.algorithms)


class FailedLogins:
    """The failed-login log: one ``auth_failed`` line per failed login up to
    ``log_burst`` per ``log_interval``, then one ``auth_failed_summary`` line for the
    interval (:class:`~mdeci.broker.login_log.LoginLog`). Call on the event loop."""

    def __init__(
        self, config: LoginThrottleConfig, monotonic: Callable[[], float] = time.monotonic
    ) -> None:
        self.rate = LoginLog(config.log_burst, config.log_interval)
        self.monotonic = monotonic
        self._timer: asyncio.TimerHandle | None = None

    def close(self) -> None:
        """Stop the timer; what was left out so far is summarised now."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._summarise(self.monotonic(), early=True)

    def record(self, request: Request, attempt: LoginAttempt, reply: Reply) -> None:
        """Log ``reply`` to ``request`` if it refused credentials that were given (a first
        request without them is the normal start of Digest, a stale nonce the normal end
        of one; neither is a failure) or is a 403."""
        if not _failed(request, reply):
            return
        now = self.monotonic()
        self._summarise(now)
        source = addr_text(attempt.source)
        if not self.rate.note(now, source_key(attempt.source[0]), attempt.user):
            self._arm(now)
            return
        try:
            uri = request.from_.uri.aor if isinstance(request.from_.uri, SipUri) else None
        except SipParseError:
            uri = None
        oplog_event(
            "auth_failed",
            level=logging.WARNING,
            method=request.method,
            uri=uri,
            user=None if attempt.user is None else attempt.user[:64],
            source=source,
            status=reply.status,
            reason=attempt.refused or None,
            locked=attempt.locked or None,
        )

    def _arm(self, now: float) -> None:
        due = self.rate.deadline()
        if self._timer is None and due is not None:
            self._timer = asyncio.get_running_loop().call_later(max(0.0, due - now), self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        now = self.monotonic()
        self._summarise(now)
        self._arm(now)  # a fake clock behind the loop's: try again later

    def _summarise(self, now: float, *, early: bool = False) -> None:
        summary = self.rate.summary(now, early=early)
        if summary is not None:
            oplog_event(
                "auth_failed_summary",
                level=logging.WARNING,
                suppressed=summary.suppressed,
                sources=summary.sources,
                users=summary.users,
                interval=summary.interval,
            )


def _failed(request: Request, reply: Reply) -> bool:
    if reply.status not in (401, 403, 407):
        return False
    given = "Authorization" in request.headers or "Proxy-Authorization" in request.headers
    if reply.status != 403 and not given:
        return False
    return not any("stale=true" in value.lower() for _, value in reply.headers)
