"""The broker's SIP side: one :class:`~sip.aio.ua.UserAgent` for ``sip:broker@<domain>``.

Theory of operation
-------------------
The UA owns sockets, transactions and dialogs; this module is its request handler and
the consumer of its dialog events, and turns both into calls on the SIP-agnostic
:class:`~mdeci.broker.service.BrokerService` and rows in the store.

- ``REGISTER`` (embedded registrar): the sans-IO :class:`~sip.registrar.Registrar` over
  the SQL bindings, with Digest over the SQL users; its events become the churn events
  ``registered`` / ``unregistered`` / ``registration_expired``. A sweep task calls
  ``registrar.expire(now)`` every ``expire_interval``. The clock is wall-clock epoch
  seconds (injected), because binding expiries are stored in SQL and outlive the process.
- ``INVITE`` (new or re-INVITE) to the broker's user: Digest (401 challenge, sent once
  and statelessly by the UA), the authenticated user must be the From AOR's user (else
  403), and inside a dialog the From AOR must be the dialog's owner (else 403). Behind a
  proxy the Request-URI arrives rewritten to our contact: a digest ``uri`` naming our
  AOR is accepted (``DigestConfig.retarget_uris``, docs/sip.md). The offer is read with
  ``parse_session(require_key=True)`` (488 + Warning when unusable) and answered with
  ``build_answer`` on the RUDP address. The handler only decides the answer: the UA
  creates the dialog after it returns, so the session is stored and
  ``BrokerService.connected`` called when the UA reports ``DialogStarted`` (new) or
  ``DialogRefreshed`` (re-INVITE). A new dialog of a user who had one replaces it (the
  old one gets a BYE in the background).
  Each session has its own SDP ``o=`` sess-id, its version + 1 per answer (RFC 3264).
- In-dialog BYE, re-INVITE, UPDATE and INFO first pass :meth:`_guard` (the UA calls it
  before the dialog changes): digest credentials of the session's owner, else 401/403
  and nothing changes. A re-INVITE verified there is not verified again by the handler
  (its nonce-count would look replayed).
- ``BYE`` is answered by the UA; its ``DialogEnded`` event calls
  ``BrokerService.disconnected(uri, ended=True)`` and logs ``session_ended``.
- Requests for other users get 404; OPTIONS, CANCEL and unknown methods are the UA
  core's (200 with Allow, §9.2, 501); ``Allow`` names REGISTER only in embedded mode.

With ``embedded_registrar = False`` the broker instead REGISTERs its own AOR at
``registrar_address`` over ``registrar_transport`` (the UA refreshes it) and answers
REGISTER with 405.

The database is never called on the event loop (issue 12): every store call goes to the
service's :class:`~mdeci.broker.worker.DbWorker` thread, the one the core runs on, in
order. The SIP machinery that needs store data synchronously gets it fetched first:

- Digest (the UA's in-dialog guard is synchronous) reads HA1 from a bounded cache,
  :class:`CachedCredentials`. The handler refreshes the requesting user's entries on
  the worker before it verifies; a session owner's entries are loaded when its session
  is restored; a guard check that failed refreshes them for the client's retry.
- The registrar runs on the loop over :class:`StagedBindings`: the AOR's bindings are
  read on the worker first, the registrar's writes are recorded, then applied on the
  worker before the answer goes out (a failure answers 500 and logs no event).
  REGISTERs are handled one at a time, so no two stage the same rows.
- Session rows and statuses are written by calls queued on the worker (the row before
  the status, since the worker keeps order); a write that fails is logged and repeated
  at the next change, as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from mdeci.broker.errors import BrokerError
from mdeci.broker.service import BrokerService
from mdeci.broker.sink import ChurnSink, FieldValue
from mdeci.broker.throttle import LoginThrottle, ThrottleConfig
from mdeci.broker.worker import LoopSink
from mdeci.oplog import event as oplog_event
from mdeci.store.bindings import Binding as StoredBinding
from mdeci.store.errors import StoreError, UnsupportedAlgorithm
from mdeci.store.repo import BrokerStore
from mdeci.store.sessions import SessionRecord, SessionStatus
from rudp.keys import KeyExchange, KeyExchangeError, psk_from_ha1
from sip.aio.ua import (
    DialogEnded,
    DialogEvent,
    DialogRefreshed,
    DialogStarted,
    IncomingRequest,
    Reply,
    UaConfig,
    UserAgent,
)
from sip.auth import (
    AuthChallenge,
    AuthOk,
    CredentialStore,
    DigestConfig,
    DigestServer,
    parse_auth_header,
)
from sip.dialog import Dialog, DialogId, DialogState
from sip.errors import AuthHeaderError, SdpError, SipError, SipParseError
from sip.message import Request
from sip.registrar import (
    Binding,
    Registered,
    Registrar,
    RegistrarConfig,
    RegistrarEvent,
    RegistrationExpired,
    Unregistered,
)
from sip.sdp import MdeciMedia, build_answer, parse_session
from sip.transaction import TimerConfig
from sip.uri import SipUri, parse_uri

CACHED_HA1 = 10_000  # HA1 entries kept for Digest (each user has one per algorithm)

Address = tuple[str, int]
WARN_AGENT = "mdeci"
log = logging.getLogger("mdeci.broker")


@dataclass(frozen=True, kw_only=True, slots=True)
class UserCredentials:
    """A user to add to the store at start if missing (from ``[[auth.users]]``)."""

    user: str
    password: str = field(repr=False)
    msisdn: str | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class SipEndpointConfig:
    """Settings of the broker's SIP endpoint (built from ``BrokerConfig`` by the caller).

    ``domain`` and ``user``: the broker's AOR ``sip:<user>@<domain>``; ``realm``: the
    digest realm (default: the domain); ``algorithms``: offered in this order;
    ``users``: added to the store at start when missing; ``embedded_registrar``: answer
    REGISTER for the domain (else register at ``registrar_address`` with
    ``register_password``); ``min_expires`` / ``default_expires`` / ``max_expires``:
    the embedded registrar's bounds (s); ``register_expires``: what the broker asks an
    external registrar for (over ``registrar_transport``); ``expire_interval``: period
    of the binding expiry sweep (s);
    ``timers``: RFC 3261 T1/T2/T4; ``tcp``: listen on TCP too; ``tls_cert`` /
    ``tls_key``: listen for SIP over TLS on ``tls_port``; ``tls_ca``: verify TLS peers;
    ``key_confirm_timeout``: seconds after a key agreement within which the agent's
    first authentic RUDP datagram must arrive, else the session is ended as a key
    mismatch (an SDP rewritten on the path; docs/security.md).
    """

    domain: str
    user: str = "broker"
    realm: str = ""
    algorithms: tuple[str, ...] = ("SHA-256",)
    users: tuple[UserCredentials, ...] = ()
    embedded_registrar: bool = True
    registrar_address: Address | None = None
    register_password: str | None = field(default=None, repr=False)
    register_expires: int = 600
    registrar_transport: str = "udp"
    min_expires: int = 60
    default_expires: int = 600
    max_expires: int = 3600
    expire_interval: float = 5.0
    timers: TimerConfig = field(default_factory=TimerConfig)
    tcp: bool = True
    tls_port: int = 0
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_ca: str | None = None
    key_confirm_timeout: float = 10.0
    login_throttle: ThrottleConfig = field(default_factory=ThrottleConfig)

    def __post_init__(self) -> None:
        if self.key_confirm_timeout <= 0:
            raise BrokerError("key_confirm_timeout must be > 0")
        if not self.embedded_registrar and self.registrar_address is None:
            raise BrokerError("an external registrar needs registrar_address")
        if self.expire_interval <= 0:
            raise BrokerError("expire_interval must be > 0")

    @property
    def aor(self) -> str:
        """``sip:<user>@<domain>``."""
        return f"sip:{self.user}@{self.domain}"

    @property
    def digest_realm(self) -> str:
        """``realm`` or the domain."""
        return self.realm or self.domain


# ---------------------------------------------------------------------------- adapters


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


class StoreBindings:
    """:class:`sip.registrar.BindingStore` over ``BrokerStore.bindings`` (SQL)."""

    def __init__(self, store: BrokerStore) -> None:
        self._bindings = store.bindings

    @staticmethod
    def _out(b: StoredBinding) -> Binding:
        return Binding(b.aor, b.contact, b.expires_at, b.call_id, b.cseq, b.q, b.source)

    def bindings(self, aor: str, now: float) -> list[Binding]:
        return [self._out(b) for b in self._bindings.bindings(aor, now)]

    def put(self, binding: Binding) -> None:
        b = binding
        self._bindings.put(
            StoredBinding(b.aor, b.contact, b.expires_at, b.call_id, b.cseq, b.q, b.source)
        )

    def remove(self, aor: str, contact: str) -> None:
        self._bindings.remove(aor, contact)

    def remove_all(self, aor: str) -> None:
        self._bindings.remove_all(aor)

    def expire(self, now: float) -> list[Binding]:
        return [self._out(b) for b in self._bindings.expire(now)]


class CachedCredentials:
    """:class:`sip.auth.CredentialStore` answering from memory, filled off the loop.

    :meth:`fetch` runs on the database thread and returns what :meth:`keep` stores on
    the loop; :meth:`ha1` never touches the database (an entry not fetched reads as an
    unknown user). At most ``size`` entries, least recently used dropped first.
    """

    def __init__(
        self, store: BrokerStore, algorithms: tuple[str, ...], size: int = CACHED_HA1
    ) -> None:
        self._store = store
        self._algorithms = tuple(dict.fromkeys((*algorithms, "SHA-256")))
        self._size = size
        self._known: OrderedDict[tuple[str, str, str], str | None] = OrderedDict()

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

    def keep(self, found: dict[tuple[str, str, str], str | None]) -> None:
        for key, ha1 in found.items():
            self._known[key] = ha1
            self._known.move_to_end(key)
        while len(self._known) > self._size:
            self._known.popitem(last=False)

    def ha1(self, username: str, realm: str, algorithm: str) -> str | None:
        return self._known.get((username, realm, algorithm))


class StagedBindings:
    """:class:`sip.registrar.BindingStore` over rows read beforehand: the registrar runs
    on the loop, its writes are recorded and applied later on the database thread.

    :meth:`begin` gives the bindings of the one AOR the next REGISTER may touch; any
    other AOR reads as unavailable (StoreError: the REGISTER gets 500).
    """

    def __init__(self) -> None:
        self._aor: str | None = None
        self._rows: dict[str, Binding] = {}
        self._ops: list[tuple[str, Binding | str]] = []

    def begin(self, aor: str | None, rows: list[Binding]) -> None:
        self._aor = aor
        self._rows = {b.contact: b for b in rows}
        self._ops = []

    def end(self) -> list[tuple[str, Binding | str]]:
        """The writes recorded since :meth:`begin`, in order; forgets the rows."""
        ops, self._ops = self._ops, []
        self._aor, self._rows = None, {}
        return ops

    def _check(self, aor: str) -> None:
        if aor != self._aor:
            raise StoreError(f"bindings of {aor} were not read before the request")

    def bindings(self, aor: str, now: float) -> list[Binding]:
        self._check(aor)
        live = [b for b in self._rows.values() if b.expires_at > now]
        return sorted(live, key=lambda b: -b.q)

    def put(self, binding: Binding) -> None:
        self._check(binding.aor)
        self._rows[binding.contact] = binding
        self._ops.append(("put", binding))

    def remove(self, aor: str, contact: str) -> None:
        self._check(aor)
        self._rows.pop(contact, None)
        self._ops.append(("remove", contact))

    def remove_all(self, aor: str) -> None:
        self._check(aor)
        self._rows.clear()
        self._ops.append(("remove_all", aor))

    def expire(self, now: float) -> list[Binding]:
        raise StoreError("expiry runs on the database thread, not through staged rows")

    @staticmethod
    def apply(store: StoreBindings, aor: str, ops: list[tuple[str, Binding | str]]) -> None:
        """Write ``ops`` (database thread). Raises StoreError."""
        for op, arg in ops:
            if op == "put":
                assert isinstance(arg, Binding)
                store.put(arg)
            elif op == "remove":
                assert isinstance(arg, str)
                store.remove(aor, arg)
            else:
                store.remove_all(aor)


def ensure_users(
    store: BrokerStore,
    domain: str,
    realm: str,
    users: tuple[UserCredentials, ...],
    *,
    md5: bool = False,
) -> int:
    """Add each user ``sip:<user>@<domain>`` that the store does not have; how many were added.

    Existing users keep their stored password. Raises StoreError (incl. DuplicateUser
    when the username exists in the realm under another URI).
    """
    added = 0
    for u in users:
        uri = f"sip:{u.user}@{domain}"
        if store.users.get_user(uri) is None:
            store.users.add_user(uri, realm, u.password, username=u.user, md5=md5)
            added += 1
    return added


class GuardedDigest(DigestServer):
    """A :class:`~sip.auth.DigestServer` that logs failed logins (user and source, never a
    secret) and refuses, unchecked, the logins of a user or source locked by the
    :class:`~mdeci.broker.throttle.LoginThrottle` (issue 12: unlimited guessing).

    ``source`` is set by the endpoint before each request it hands to a verifier.
    """

    def __init__(
        self,
        config: DigestConfig,
        store: CredentialStore,
        random: Callable[[int], bytes],
        throttle: LoginThrottle,
    ) -> None:
        super().__init__(config, store, random)
        self.throttle = throttle
        self.source = "-"
        self.failures = 0

    def username(self, request: Request) -> str | None:
        """The user named by ``request``'s Digest credentials for our realm, if any."""
        for value in request.headers.get_raw("Authorization"):
            try:
                scheme, params = parse_auth_header(value)
            except AuthHeaderError:
                continue
            if scheme.lower() == "digest" and params.get("realm") == self.config.realm:
                return params.get("username")
        return None

    def verify(
        self, request: Request, now: float, *, proxy: bool = False
    ) -> AuthOk | AuthChallenge:
        """As ``DigestServer.verify``; raises AuthHeaderError alike."""
        user = self.username(request)
        if user is None:
            return super().verify(request, now, proxy=proxy)  # no credentials yet
        wait = self.throttle.retry_after(user, self.source, now)
        if wait is not None:
            log.warning(
                "login of user %r from %s not checked: too many failed logins (%.0f s left)",
                user[:64],
                self.source,
                wait,
            )
            return self.challenge(now, proxy=proxy, reason="too many failed logins")
        result = super().verify(request, now, proxy=proxy)
        if isinstance(result, AuthChallenge) and result.reason == "wrong credentials":
            self.failures += 1
            locked = self.throttle.failed(user, self.source, now)
            log.warning(
                "failed login: user %r from %s (%s)%s",
                user[:64],
                self.source,
                request.method,
                "; user and source locked" if locked else "",
            )
        elif isinstance(result, AuthOk):
            self.throttle.succeeded(result.username)
        return result


# ---------------------------------------------------------------------------- helpers


def with_store_id(answer: str, store_id: str) -> str:
    """The answer with ``a=mdeci-store:<id>`` at session level (docs/agent.md): agents
    reset their delivery gate when the store they talk to is a new one."""
    head, sep, rest = answer.partition("m=")
    return f"{head}a=mdeci-store:{store_id}\r\n{sep}{rest}"


def addr_text(addr: Address) -> str:
    """``ip:port`` (``[v6]:port``)."""
    host, port = addr
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def parse_addr_text(text: str) -> Address:
    """Inverse of :func:`addr_text`. Raises ValueError."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"not ip:port: {text!r}")
    return host.strip("[]"), int(port)


def _warning(text: str) -> tuple[str, str]:
    clean = text.replace('"', "'").replace("\r", " ").replace("\n", " ")[:180]
    return ("Warning", f'399 {WARN_AGENT} "{clean}"')


def _refuse(status: int, why: str) -> Reply:
    return Reply(status, headers=(_warning(why),))


@dataclass(frozen=True, slots=True)
class _Accepted:
    """An INVITE we answered 2xx, waiting for the UA's dialog event."""

    uri: str
    media: MdeciMedia
    offer: str
    secret: bytes = field(repr=False)  # the RUDP session secret (rudp.keys)
    new_keys: bool


@dataclass(slots=True)
class _Session:
    uri: str
    dialog_id: DialogId
    call_id: str
    media_addr: Address
    key: bytes = field(repr=False)
    started_at: float
    kx: bytes | None  # the agent's public value the keys were agreed with


# ---------------------------------------------------------------------------- endpoint


class BrokerSipEndpoint:
    """The broker's SIP endpoint; :meth:`start`, then :meth:`close` at the end.

    ``clock``: wall-clock epoch seconds (bindings, nonces, session times);
    ``random``: tags, nonces and Call-IDs.
    """

    def __init__(
        self,
        config: SipEndpointConfig,
        store: BrokerStore,
        service: BrokerService,
        log: ChurnSink,
        *,
        clock: Callable[[], float] = time.time,
        random: Callable[[int], bytes] = secrets.token_bytes,
    ) -> None:
        self.config = config
        self.store = store
        self.service = service
        self.worker = service.worker  # the core's thread: store calls keep its order
        self.log = log
        self._loop_log = LoopSink(log, service.to_loop)  # for events logged by the worker
        self.clock = clock
        self.credentials = CachedCredentials(store, config.algorithms)
        self._staged = StagedBindings()
        self._register_lock = asyncio.Lock()
        self._msisdns = {  # only the users that have one: 10,000 users are 10,000 entries
            f"sip:{u.user}@{config.domain}": u.msisdn for u in config.users if u.msisdn
        }
        self.digest = GuardedDigest(
            DigestConfig(
                realm=config.digest_realm,
                algorithms=config.algorithms,
                # Behind a proxy the Request-URI arrives rewritten to our contact; the
                # agent's digest names our AOR as it sent it (docs/sip.md, retargeting).
                retarget_uris=(config.aor, f"sips:{config.user}@{config.domain}"),
            ),
            self.credentials,
            random,
            LoginThrottle(config.login_throttle),
        )
        self.registrar: Registrar | None = None
        self.ua = UserAgent(
            UaConfig(
                aor=config.aor,
                password=None if config.embedded_registrar else config.register_password,
                timers=config.timers,
                tcp=config.tcp,
                tls_port=config.tls_port,
                tls_cert=config.tls_cert,
                tls_key=config.tls_key,
                tls_ca=config.tls_ca,
                user_agent="mdeci-broker/0.1",
                # Allow names what this mode serves: REGISTER only as the registrar.
                methods=frozenset(
                    {"INVITE", "REGISTER"} if config.embedded_registrar else {"INVITE"}
                ),
            ),
            self.handle,
            random=random,
            guard=self._guard,
        )
        self._random = random
        # RFC 3264 §8: each session has its own o= sess-id; its version grows by one with
        # every answer in that session. Keyed by (Call-ID, the agent's From tag).
        self._origins: dict[tuple[str, str], tuple[int, int]] = {}
        # In-dialog requests whose digest the guard verified (the handler must not verify
        # the same nonce-count twice): (Call-ID, CSeq number).
        self._guarded: set[tuple[str, int]] = set()
        self._accepted: dict[tuple[str, str], _Accepted] = {}
        self._sessions: dict[str, _Session] = {}
        self._owners: dict[DialogId, str] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._bound = False
        # (uri, dialog) -> the pending key confirmation of that session
        self._key_checks: dict[tuple[str, DialogId], asyncio.TimerHandle] = {}
        self.stats_refused = 0
        self.event_errors = 0
        self._store_id: str | None = None  # read once: the store's incarnation id

    # ------------------------------------------------------------------ lifecycle

    @property
    def local_addr(self) -> Address:
        """The bound SIP address."""
        return self.ua.local_addr

    async def start(self, host: str, port: int = 0) -> Address:
        """Add configured users, bind UDP (+TCP), start the sweep and event tasks, and
        register at the external registrar if configured; returns the SIP address.

        Raises OSError when the address cannot be bound, StoreError on the database,
        BrokerError when the external registrar refuses us.
        """
        await self.worker.run(
            ensure_users,
            self.store,
            self.config.domain,
            self.config.digest_realm,
            self.config.users,
            md5="MD5" in self.config.algorithms,
        )
        bound = await self.ua.start(host, port)
        await self.restore_sessions()
        if self.config.embedded_registrar:
            self.registrar = Registrar(
                RegistrarConfig(
                    domains=tuple(dict.fromkeys((self.config.domain, bound[0], host))),
                    default_expires=self.config.default_expires,
                    min_expires=self.config.min_expires,
                    max_expires=self.config.max_expires,
                    warn_agent=WARN_AGENT,
                ),
                self._staged,
                self._random,
                auth=self.digest,
            )
            self._spawn(self._sweep_forever())
        self._spawn(self._events_forever())
        if not self.config.embedded_registrar:
            assert self.config.registrar_address is not None
            try:
                await self.ua.register(
                    self.config.registrar_address,
                    self.config.register_expires,
                    transport=self.config.registrar_transport,
                )
            except SipError as exc:
                await self.ua.close()
                raise BrokerError(
                    f"registrar {addr_text(self.config.registrar_address)} refused "
                    f"{self.config.aor}: {exc}"
                ) from None
        self._bound = True
        return bound

    async def close(self) -> None:
        """Stop tasks and close sockets; sessions stay stored (no BYE: agents keep their
        dialogs and re-INVITE after a broker restart). Unregisters from an external
        registrar."""
        if not self.config.embedded_registrar:
            with contextlib.suppress(SipError, TimeoutError):
                await asyncio.wait_for(self.ua.unregister(), 2)
        self._bound = False
        for handle in self._key_checks.values():
            handle.cancel()
        self._key_checks.clear()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.ua.close()

    def _spawn(self, coro: object) -> None:
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(coro)  # type: ignore[arg-type]
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def restore_sessions(self) -> int:
        """After a restart: rebuild the dialog and the RUDP peer of every session stored
        CONNECTED, so agents keep their dialogs (re-INVITE, BYE) and delivery resumes.
        Rows that cannot be read back are marked DISCONNECTED. Returns how many were
        restored. Raises StoreError."""
        restored = 0
        rows = await self.worker.run(
            self.store.sessions.sessions_with_status, SessionStatus.CONNECTED
        )
        for rec in rows:
            try:
                addr = parse_addr_text(rec.media_addr)
                dialog = Dialog(
                    call_id=rec.call_id,
                    local_tag=rec.local_tag,
                    remote_tag=rec.remote_tag,
                    local_uri=self.config.aor,
                    remote_uri=rec.uri,
                    remote_target=rec.remote_target,
                    route_set=[r for r in rec.route_set.split(", ") if r],
                    local_seq=rec.local_cseq,
                    remote_seq=rec.remote_cseq,
                    is_uac=False,
                )
                self.service.connected(rec.uri, addr, rec.session_key)
            except (ValueError, BrokerError):
                self.worker.post(
                    "session status",
                    self.store.sessions.set_status,
                    rec.uri,
                    SessionStatus.DISCONNECTED,
                    self.clock(),
                )
                continue
            self.ua.dialogs[dialog.id] = dialog
            self._owners[dialog.id] = rec.uri
            try:
                kx = parse_session(rec.remote_sdp).key
            except SdpError:
                kx = None  # a re-INVITE then has to agree new keys
            self._sessions[rec.uri] = _Session(
                rec.uri, dialog.id, rec.call_id, addr, rec.session_key, rec.started_at, kx
            )
            restored += 1
            # The guard verifies the owner's in-dialog requests from the cache.
            owner = parse_uri(rec.uri)
            if isinstance(owner, SipUri) and owner.user is not None:
                await self._load_credentials(owner.user)
        return restored

    async def _load_credentials(self, username: str) -> None:
        """Refresh ``username``'s HA1 entries from the store. Raises StoreError."""
        found = await self.worker.run(self.credentials.fetch, username, self.config.digest_realm)
        self.credentials.keep(found)

    # ------------------------------------------------------------------ requests

    async def handle(self, req: IncomingRequest) -> Reply:
        """The UA's request handler. Never raises for a store failure (500 + Retry-After)."""
        self.digest.source = addr_text(req.source)
        try:
            reply = await self._handle(req)
        except StoreError as exc:
            # Details (host, port, SQL) go to the operator's log; the peer learns nothing.
            oplog_event(
                "database_error",
                level=logging.ERROR,
                where="sip",
                method=req.request.method,
                source=self.digest.source,
                error=str(exc),
            )
            return Reply(500, headers=(("Retry-After", "5"), _warning("service unavailable")))
        self._log_auth_failure(req, reply)
        return reply

    @staticmethod
    def _log_auth_failure(req: IncomingRequest, reply: Reply) -> None:
        """One ``auth_failed`` line for credentials that were given and refused (a first
        request without them is the normal start of Digest, not a failure)."""
        request = req.request
        if reply.status not in (401, 403, 407):
            return
        given = "Authorization" in request.headers or "Proxy-Authorization" in request.headers
        if reply.status != 403 and not given:
            return
        if any("stale=true" in value.lower() for _, value in reply.headers):
            return  # an old nonce: the client retries with a fresh one
        try:
            uri = request.from_.uri.aor if isinstance(request.from_.uri, SipUri) else None
        except SipParseError:
            uri = None
        oplog_event(
            "auth_failed",
            level=logging.WARNING,
            method=request.method,
            uri=uri,
            source=addr_text(req.source),
            status=reply.status,
        )

    async def _handle(self, req: IncomingRequest) -> Reply:
        """Fetch on the database thread what the request needs, then decide on the loop."""
        request = req.request
        if request.method not in ("REGISTER", "INVITE"):
            return Reply(405)
        username = self.digest.username(request)
        if username is not None:
            await self._load_credentials(username)
        if request.method == "REGISTER":
            return await self._register(req)
        if self._store_id is None:
            self._store_id = await self.worker.run(self.store.identity.incarnation)
        return self._invite(req)

    async def _register(self, req: IncomingRequest) -> Reply:
        if self.registrar is None:
            return _refuse(405, "this broker is not a registrar")
        try:
            to = req.request.to.uri
            aor = to.aor if isinstance(to, SipUri) and to.user is not None else None
        except SipParseError:
            aor = None  # the registrar refuses it before any binding is read
        bindings = StoreBindings(self.store)
        async with self._register_lock:
            now = self.clock()
            rows = [] if aor is None else await self.worker.run(bindings.bindings, aor, now)
            self._staged.begin(aor, rows)
            response = self.registrar.handle(req.request, now, source=addr_text(req.source))
            ops = self._staged.end()
            try:
                if ops and aor is not None:
                    await self.worker.run(StagedBindings.apply, bindings, aor, ops)
            except BaseException:
                while self.registrar.next_event() is not None:
                    pass  # nothing was stored: nothing to log
                raise
        self._drain_registrar()
        return Reply.from_response(response)

    def _invite(self, req: IncomingRequest) -> Reply:
        request = req.request
        try:
            target = request.parsed_uri
            from_uri = request.from_.uri
            from_tag = request.from_.tag or ""
        except SipParseError as exc:
            return _refuse(400, exc.reason)
        if not isinstance(target, SipUri) or target.user != self.config.user:
            return _refuse(404, "no such user here")
        if not isinstance(from_uri, SipUri) or from_uri.user is None:
            return _refuse(403, "From is not a SIP address-of-record")
        uri = from_uri.aor
        if from_uri.host.lower() != self.config.domain.lower():
            return _refuse(403, f"{uri} is not of domain {self.config.domain}")
        if req.dialog is not None:
            owner = self._owners.get(req.dialog.id)
            if owner is not None and owner != uri:
                self.stats_refused += 1
                return _refuse(403, f"{uri} may not act in the session of {owner}")
        guarded = (request.call_id, request.cseq.seq)
        if req.dialog is None or guarded not in self._guarded:
            refused = self._authenticate(request, from_uri.user)
            if refused is not None:
                return refused
        self._guarded.discard(guarded)
        origin_key = (request.call_id, from_tag)
        sess_id, version = self._origins.get(origin_key, (self._new_sess_id(), 0))
        try:
            media = parse_session(request.body, require_key=True)
        except SdpError as exc:
            return _refuse(488, exc.reason)
        assert media.key is not None  # require_key
        session = self._sessions.get(uri)
        keep = (
            session is not None
            and req.dialog is not None
            and session.dialog_id == req.dialog.id
            and session.kx == media.key
        )
        if not keep:
            holder = self._kx_holder(media.key)
            if holder is not None:
                self.stats_refused += 1
                log.warning(
                    "INVITE from %s as %s refused: its key-exchange value is bound to the "
                    "session of %s",
                    addr_text(req.source),
                    uri,
                    holder,
                )
                return _refuse(488, "key-exchange value already in use; draw a new one")
        ha1 = self.credentials.ha1(from_uri.user, self.config.digest_realm, "SHA-256")
        if ha1 is None:
            return _refuse(403, "no SHA-256 credentials for this user")
        kx = None if keep else KeyExchange(self._random(32))
        if self._store_id is None:
            return _refuse(500, "broker store unavailable")
        try:
            # The store id goes in before the secret is derived: it is part of the
            # transcript both ends bind the key to.
            answer = with_store_id(
                build_answer(
                    request.body,
                    self.config.user,
                    sess_id,
                    version + 1,
                    *self.service.local_addr,
                    key=None if kx is None else kx.public,
                ),
                self._store_id,
            ).encode()
            if kx is None:
                assert session is not None
                secret = session.key
            else:
                secret = kx.session_secret(media.key, psk_from_ha1(ha1), request.body, answer)
        except SdpError as exc:
            return _refuse(488, exc.reason)
        except KeyExchangeError as exc:
            return _refuse(488, str(exc))
        self._origins[origin_key] = (sess_id, version + 1)
        dialog = req.dialog
        if (
            kx is not None
            and session is not None
            and dialog is not None
            and session.dialog_id == dialog.id
        ):
            # A re-key inside the session: the agent sends under the new keys as soon as it
            # has this answer, which may be before the UA reports the refresh (it waits for
            # the ACK), so the RUDP side switches now.
            session.key, session.kx = secret, media.key
            self.service.connected(uri, (media.addr, media.port), secret)
        offer = request.body.decode("utf-8", "replace")
        self._accepted[(request.call_id, from_tag)] = _Accepted(
            uri, media, offer, secret, kx is not None
        )
        return Reply(200, body=answer)

    def _kx_holder(self, kx: bytes) -> str | None:
        """The user whose live session was agreed with public value ``kx``, if any."""
        for session in self._sessions.values():
            if session.kx == kx:
                return session.uri
        for accepted in self._accepted.values():
            if accepted.media.key == kx:
                return accepted.uri
        return None

    def _new_sess_id(self) -> int:
        return int.from_bytes(self._random(6), "big") & 0x7FFFFFFFFFFF

    def _authenticate(self, request: Request, user: str) -> Reply | None:
        """Digest for ``request`` as ``user``: None when good, else the refusal (401/407
        challenge, 400 for unreadable credentials, 403 for another user's)."""
        try:
            result = self.digest.verify(request, self.clock())
        except AuthHeaderError as exc:
            return _refuse(400, f"bad credentials: {exc.reason}")
        if isinstance(result, AuthChallenge):
            return Reply(result.status, headers=result.headers)
        if result.username != user:
            self.stats_refused += 1
            return _refuse(403, f"{result.username} may not act as sip:{user}@...")
        return None

    def _guard(self, request: Request, dialog: Dialog) -> Reply | None:
        """Issue 12: an in-dialog request changes nothing until it is authenticated as
        the session's owner (a BYE or re-INVITE from anyone else gets 401/403 and the
        session goes on). Requests of dialogs we did not make with an agent pass."""
        owner = self._owners.get(dialog.id)
        if owner is None or request.method not in ("BYE", "INVITE", "UPDATE", "INFO"):
            return None
        try:
            owner_user = parse_uri(owner)
        except SipParseError:
            return None
        if not isinstance(owner_user, SipUri) or owner_user.user is None:
            return None
        try:
            from_uri = request.from_.uri
        except SipParseError as exc:
            return _refuse(400, exc.reason)
        if not isinstance(from_uri, SipUri) or from_uri.aor != owner:
            self.stats_refused += 1
            return _refuse(403, f"{from_uri} may not act in the session of {owner}")
        refused = self._authenticate(request, owner_user.user)
        if refused is None and request.method == "INVITE":
            self._guarded.add((request.call_id, request.cseq.seq))
        elif refused is not None and refused.status == 401:
            # The cache may be older than a password change, or lost to a restart: fetch
            # the owner's entries again for the client's retry (the guard cannot wait).
            self._spawn(self._refresh_credentials(owner_user.user))
        return refused

    async def _refresh_credentials(self, username: str) -> None:
        with contextlib.suppress(StoreError):
            await self._load_credentials(username)

    # ------------------------------------------------------------------ events

    async def _events_forever(self) -> None:
        while True:
            event = await self.ua.events.get()
            try:
                self._on_event(event)
            except Exception:  # a StoreError, a short key: counted, never fatal to the loop
                self.event_errors += 1

    def _on_event(self, event: DialogEvent) -> None:
        dialog = event.dialog
        if isinstance(event, DialogStarted | DialogRefreshed) and not dialog.is_uac:
            accepted = self._accepted.pop((dialog.call_id, dialog.remote_tag), None)
            if accepted is not None:
                self._session_up(dialog, accepted, refreshed=isinstance(event, DialogRefreshed))
        elif isinstance(event, DialogEnded):
            self._session_down(dialog, event.reason)

    def _session_up(self, dialog: Dialog, accepted: _Accepted, *, refreshed: bool) -> None:
        uri, media = accepted.uri, accepted.media
        now = self.clock()
        addr = (media.addr, media.port)
        previous = self._sessions.get(uri)
        same = previous is not None and previous.dialog_id == dialog.id
        if refreshed and not same:
            # The refresh of a dialog a newer INVITE already replaced (its ACK came late):
            # applying it would put the user back on that dialog's keys.
            return
        record = SessionRecord(
            uri=uri,
            call_id=dialog.call_id,
            local_tag=dialog.local_tag,
            remote_tag=dialog.remote_tag,
            remote_target=dialog.remote_target,
            route_set=", ".join(dialog.route_set),
            remote_sdp=accepted.offer,
            media_addr=addr_text(addr),
            session_key=accepted.secret,
            # The operator's record only: a number announced in SDP is the user's claim,
            # and SMS to it would be paid by the operator (issue 12).
            msisdn=self._msisdns.get(uri),
            status=SessionStatus.CONNECTED,
            local_cseq=dialog.local_seq,
            remote_cseq=dialog.remote_seq or 0,
            started_at=previous.started_at if same and previous is not None else now,
            updated_at=now,
        )
        if previous is not None and not same:
            # A new dialog of the same user (e.g. a restarted agent) replaces the old one.
            self._owners.pop(previous.dialog_id, None)
            old = self.ua.dialogs.get(previous.dialog_id)
            if old is not None and old.state is DialogState.CONFIRMED:
                self._spawn(self._bye_quietly(old))
        self._owners[dialog.id] = uri
        self._sessions[uri] = _Session(
            uri, dialog.id, dialog.call_id, addr, accepted.secret, record.started_at, media.key
        )
        prev: str | None
        if refreshed and same and previous is not None:
            name, prev = "session_reinvited", addr_text(previous.media_addr)
        else:
            name = "session_started"
            prev = addr_text(previous.media_addr) if previous is not None else None
        # Queued before the status write of service.connected (the worker keeps order), and
        # logged once written, so whoever reads the event finds the row. The agent already
        # holds the new keys: the RUDP side follows even when the row cannot be written now
        # (it is written again at the next change).
        self.worker.post(
            "session row",
            self._store_session,
            record,
            name,
            {"call_id": dialog.call_id, "addr": addr_text(addr), "prev_addr": prev},
        )
        self.service.connected(uri, addr, accepted.secret)
        if accepted.new_keys and (uri, dialog.id) not in self._key_checks:
            # A pending check keeps its deadline: re-keying again and again (as an agent
            # whose keys never work does) must not postpone the verdict forever.
            self._key_checks[(uri, dialog.id)] = asyncio.get_running_loop().call_later(
                self.config.key_confirm_timeout, self._confirm_keys, uri, dialog.id, dialog
            )

    def _store_session(
        self, record: SessionRecord, event: str, fields: dict[str, FieldValue]
    ) -> None:
        """Database thread: write ``record``, then log ``event`` on the loop."""
        try:
            self.store.sessions.upsert_session(record)
        finally:
            self._loop_log.emit(event, record.uri, **fields)

    def _confirm_keys(self, uri: str, dialog_id: DialogId, dialog: Dialog) -> None:
        """Fail closed: no authentic datagram since the key agreement means the two ends
        derived different secrets (an SDP rewritten on the path, or another password)."""
        self._key_checks.pop((uri, dialog_id), None)
        session = self._sessions.get(uri)
        if session is None or session.dialog_id != dialog_id:
            return
        if self.service.heard_from(uri):
            return
        log.warning(
            "session of %s (Call-ID %s) ended: no authentic RUDP datagram within %.1f s of "
            "the key agreement; the SDP key exchange was altered on the path or the agent "
            "derived another key",
            uri,
            dialog.call_id,
            self.config.key_confirm_timeout,
        )
        self._owners.pop(dialog_id, None)
        del self._sessions[uri]
        self.service.disconnected(uri, ended=True)
        self._log_when_stored(
            "session_ended",
            uri,
            call_id=dialog.call_id,
            addr=addr_text(session.media_addr),
            reason="key mismatch",
        )
        if dialog.state is DialogState.CONFIRMED:
            self._spawn(self._bye_quietly(dialog))

    def _session_down(self, dialog: Dialog, reason: str) -> None:
        uri = self._owners.pop(dialog.id, None)
        if uri is None:
            return  # a dialog that was already replaced, or never a session
        session = self._sessions.get(uri)
        if session is None or session.dialog_id != dialog.id:
            return
        del self._sessions[uri]
        self._origins.pop((dialog.call_id, dialog.remote_tag), None)
        self.service.disconnected(uri, ended=True)
        self._log_when_stored(
            "session_ended",
            uri,
            call_id=dialog.call_id,
            addr=addr_text(session.media_addr),
            reason=reason,
        )

    def _log_when_stored(self, event: str, uri: str, **fields: FieldValue) -> None:
        """Log ``event`` once the store writes queued so far ran (whoever reads it finds
        the session's status written)."""
        self.worker.post("churn event", self._loop_log.emit, event, uri, **fields)

    def kick(self, uri: str) -> bool:
        """End ``uri``'s session now (``mdeci admin kick``): BYE to the agent, delivery
        stopped, ``session_ended`` logged with reason ``kicked``. False when it has none."""
        session = self._sessions.get(uri)
        dialog = self.ua.dialogs.get(session.dialog_id) if session is not None else None
        if dialog is None:
            return False
        self._session_down(dialog, "kicked")
        if dialog.state is DialogState.CONFIRMED:
            self._spawn(self._bye_quietly(dialog))
        return True

    @property
    def bound(self) -> bool:
        """True while the SIP sockets are open (the readiness probe)."""
        return self._bound

    async def _bye_quietly(self, dialog: Dialog) -> None:
        with contextlib.suppress(SipError, OSError):
            await self.ua.bye(dialog)

    # ------------------------------------------------------------------ registrar

    def _drain_registrar(self) -> None:
        assert self.registrar is not None
        while (event := self.registrar.next_event()) is not None:
            self._log_registrar(event)

    def _log_registrar(self, event: RegistrarEvent) -> None:
        if isinstance(event, Registered):
            if not event.refreshed:
                self.log.emit(
                    "registered",
                    event.aor,
                    call_id=event.call_id or None,
                    addr=event.source,
                    reason=f"contact={event.contact} expires={event.expires}",
                )
        elif isinstance(event, Unregistered):
            self.log.emit(
                "unregistered",
                event.aor,
                call_id=event.call_id or None,
                reason=f"contact={event.contact}",
            )
        elif isinstance(event, RegistrationExpired):
            self.log.emit(
                "registration_expired",
                event.aor,
                addr=event.source,
                reason=f"contact={event.contact}",
            )

    async def expire_now(self) -> int:
        """Run the binding expiry sweep once; how many bindings ran out. Raises StoreError."""
        if self.registrar is None:
            return 0
        gone = await self.worker.run(StoreBindings(self.store).expire, self.clock())
        for b in gone:
            self._log_registrar(RegistrationExpired(b.aor, b.contact, b.source))
        return len(gone)

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(self.config.expire_interval)
            with contextlib.suppress(StoreError):
                await self.expire_now()

    # ------------------------------------------------------------------ introspection

    def session_of(self, uri: str) -> tuple[str, Address] | None:
        """(Call-ID, media address) of ``uri``'s live session, or None."""
        s = self._sessions.get(uri)
        return None if s is None else (s.call_id, s.media_addr)


__all__ = [
    "BrokerSipEndpoint",
    "SipEndpointConfig",
    "StoreBindings",
    "StoreCredentials",
    "UserCredentials",
    "addr_text",
    "ensure_users",
    "parse_addr_text",
]
