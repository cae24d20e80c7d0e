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
- ``INVITE`` (new or re-INVITE) to the broker's user: Digest (401 challenge), the
  authenticated user must be the From AOR's user (else 403), and inside a dialog the
  From AOR must be the dialog's owner (else 403); the offer is read with
  ``parse_session(require_key=True)`` (488 + Warning when unusable) and answered with
  ``build_answer`` on the RUDP address. The handler only decides the answer: the UA
  creates the dialog after it returns, so the session is stored and
  ``BrokerService.connected`` called when the UA reports ``DialogStarted`` (new) or
  ``DialogRefreshed`` (re-INVITE). A new dialog of a user who had one replaces it (the
  old one gets a BYE in the background).
- ``BYE`` is answered by the UA; its ``DialogEnded`` event calls
  ``BrokerService.disconnected(uri, ended=True)`` and logs ``session_ended``.
- Requests for other users get 404; other methods outside a dialog 405.

With ``embedded_registrar = False`` the broker instead REGISTERs its own AOR at
``registrar_address`` (the UA refreshes it) and answers REGISTER with 405.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from mdeci.broker.errors import BrokerError
from mdeci.broker.service import BrokerService
from mdeci.broker.sink import ChurnSink
from mdeci.store.bindings import Binding as StoredBinding
from mdeci.store.errors import StoreError, UnsupportedAlgorithm
from mdeci.store.repo import BrokerStore
from mdeci.store.sessions import SessionRecord, SessionStatus
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
from sip.auth import AuthChallenge, DigestConfig, DigestServer
from sip.dialog import Dialog, DialogId, DialogState
from sip.errors import AuthHeaderError, SdpError, SipError, SipParseError
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
from sip.uri import SipUri

Address = tuple[str, int]
WARN_AGENT = "mdeci"


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
    external registrar for; ``expire_interval``: period of the binding expiry sweep (s);
    ``timers``: RFC 3261 T1/T2/T4; ``tcp``: listen on TCP too.
    """

    domain: str
    user: str = "broker"
    realm: str = ""
    algorithms: tuple[str, ...] = ("SHA-256", "MD5")
    users: tuple[UserCredentials, ...] = ()
    embedded_registrar: bool = True
    registrar_address: Address | None = None
    register_password: str | None = field(default=None, repr=False)
    register_expires: int = 600
    min_expires: int = 60
    default_expires: int = 600
    max_expires: int = 3600
    expire_interval: float = 5.0
    timers: TimerConfig = field(default_factory=TimerConfig)
    tcp: bool = True

    def __post_init__(self) -> None:
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


def ensure_users(
    store: BrokerStore, domain: str, realm: str, users: tuple[UserCredentials, ...]
) -> int:
    """Add each user ``sip:<user>@<domain>`` that the store does not have; how many were added.

    Existing users keep their stored password. Raises StoreError (incl. DuplicateUser
    when the username exists in the realm under another URI).
    """
    added = 0
    for u in users:
        uri = f"sip:{u.user}@{domain}"
        if store.users.get_user(uri) is None:
            store.users.add_user(uri, realm, u.password, username=u.user)
            added += 1
    return added


# ---------------------------------------------------------------------------- helpers


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


@dataclass(slots=True)
class _Session:
    uri: str
    dialog_id: DialogId
    call_id: str
    media_addr: Address
    key: bytes
    started_at: float


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
        self.log = log
        self.clock = clock
        self._msisdns = {f"sip:{u.user}@{config.domain}": u.msisdn for u in config.users}
        self.digest = DigestServer(
            DigestConfig(realm=config.digest_realm, algorithms=config.algorithms),
            StoreCredentials(store),
            random,
        )
        self.registrar: Registrar | None = None
        self.ua = UserAgent(
            UaConfig(
                aor=config.aor,
                password=None if config.embedded_registrar else config.register_password,
                timers=config.timers,
                tcp=config.tcp,
                user_agent="mdeci-broker/0.1",
            ),
            self.handle,
            random=random,
        )
        self._random = random
        self._sess_id = int.from_bytes(random(4), "big") & 0x7FFFFFFF
        self._version = 0
        self._accepted: dict[tuple[str, str], _Accepted] = {}
        self._sessions: dict[str, _Session] = {}
        self._owners: dict[DialogId, str] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.stats_refused = 0
        self.event_errors = 0

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
        ensure_users(self.store, self.config.domain, self.config.digest_realm, self.config.users)
        bound = await self.ua.start(host, port)
        self.restore_sessions()
        if self.config.embedded_registrar:
            self.registrar = Registrar(
                RegistrarConfig(
                    domains=tuple(dict.fromkeys((self.config.domain, bound[0], host))),
                    default_expires=self.config.default_expires,
                    min_expires=self.config.min_expires,
                    max_expires=self.config.max_expires,
                    warn_agent=WARN_AGENT,
                ),
                StoreBindings(self.store),
                self._random,
                auth=self.digest,
            )
            self._spawn(self._sweep_forever())
        self._spawn(self._events_forever())
        if not self.config.embedded_registrar:
            assert self.config.registrar_address is not None
            try:
                await self.ua.register(self.config.registrar_address, self.config.register_expires)
            except SipError as exc:
                await self.ua.close()
                raise BrokerError(
                    f"registrar {addr_text(self.config.registrar_address)} refused "
                    f"{self.config.aor}: {exc}"
                ) from None
        return bound

    async def close(self) -> None:
        """Stop tasks and close sockets; sessions stay stored (no BYE: agents keep their
        dialogs and re-INVITE after a broker restart). Unregisters from an external
        registrar."""
        if not self.config.embedded_registrar:
            with contextlib.suppress(SipError, TimeoutError):
                await asyncio.wait_for(self.ua.unregister(), 2)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.ua.close()

    def _spawn(self, coro: object) -> None:
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(coro)  # type: ignore[arg-type]
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def restore_sessions(self) -> int:
        """After a restart: rebuild the dialog and the RUDP peer of every session stored
        CONNECTED, so agents keep their dialogs (re-INVITE, BYE) and delivery resumes.
        Rows that cannot be read back are marked DISCONNECTED. Returns how many were
        restored. Raises StoreError."""
        restored = 0
        for rec in self.store.sessions.sessions_with_status(SessionStatus.CONNECTED):
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
                self.store.sessions.set_status(rec.uri, SessionStatus.DISCONNECTED, self.clock())
                continue
            self.ua.dialogs[dialog.id] = dialog
            self._owners[dialog.id] = rec.uri
            self._sessions[rec.uri] = _Session(
                rec.uri, dialog.id, rec.call_id, addr, rec.session_key, rec.started_at
            )
            restored += 1
        return restored

    # ------------------------------------------------------------------ requests

    async def handle(self, req: IncomingRequest) -> Reply:
        """The UA's request handler. Never raises for a store failure (500 + Retry-After)."""
        try:
            return self._handle(req)
        except StoreError as exc:
            return Reply(500, headers=(("Retry-After", "5"), _warning(f"store: {exc}")))

    def _handle(self, req: IncomingRequest) -> Reply:
        request = req.request
        if request.method == "REGISTER":
            return self._register(req)
        if request.method == "INVITE":
            return self._invite(req)
        return Reply(405)

    def _register(self, req: IncomingRequest) -> Reply:
        if self.registrar is None:
            return _refuse(405, "this broker is not a registrar")
        now = self.clock()
        response = self.registrar.handle(req.request, now, source=addr_text(req.source))
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
        now = self.clock()
        try:
            result = self.digest.verify(request, now)
        except AuthHeaderError as exc:
            return _refuse(400, f"bad credentials: {exc.reason}")
        if isinstance(result, AuthChallenge):
            return Reply(result.status, headers=result.headers)
        if result.username != from_uri.user:
            self.stats_refused += 1
            return _refuse(403, f"{result.username} may not act as {uri}")
        try:
            media = parse_session(request.body, require_key=True)
            self._version += 1
            answer = build_answer(
                request.body,
                self.config.user,
                self._sess_id,
                self._version,
                *self.service.local_addr,
            )
        except SdpError as exc:
            return _refuse(488, exc.reason)
        offer = request.body.decode("utf-8", "replace")
        self._accepted[(request.call_id, from_tag)] = _Accepted(uri, media, offer)
        return Reply(200, body=answer.encode())

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
        assert media.key is not None  # parse_session(require_key=True)
        previous = self._sessions.get(uri)
        same = previous is not None and previous.dialog_id == dialog.id
        record = SessionRecord(
            uri=uri,
            call_id=dialog.call_id,
            local_tag=dialog.local_tag,
            remote_tag=dialog.remote_tag,
            remote_target=dialog.remote_target,
            route_set=", ".join(dialog.route_set),
            remote_sdp=accepted.offer,
            media_addr=addr_text(addr),
            session_key=media.key,
            msisdn=media.msisdn or self._msisdns.get(uri),
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
            uri, dialog.id, dialog.call_id, addr, media.key, record.started_at
        )
        self.store.sessions.upsert_session(record)
        if refreshed and same and previous is not None:
            self.log.emit(
                "session_reinvited",
                uri,
                call_id=dialog.call_id,
                addr=addr_text(addr),
                prev_addr=addr_text(previous.media_addr),
            )
        else:
            prev = addr_text(previous.media_addr) if previous is not None else None
            self.log.emit(
                "session_started", uri, call_id=dialog.call_id, addr=addr_text(addr), prev_addr=prev
            )
        self.service.connected(uri, addr, media.key)

    def _session_down(self, dialog: Dialog, reason: str) -> None:
        uri = self._owners.pop(dialog.id, None)
        if uri is None:
            return  # a dialog that was already replaced, or never a session
        session = self._sessions.get(uri)
        if session is None or session.dialog_id != dialog.id:
            return
        del self._sessions[uri]
        self.log.emit(
            "session_ended",
            uri,
            call_id=dialog.call_id,
            addr=addr_text(session.media_addr),
            reason=reason,
        )
        self.service.disconnected(uri, ended=True)

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

    def expire_now(self) -> int:
        """Run the binding expiry sweep once; how many bindings ran out. Raises StoreError."""
        if self.registrar is None:
            return 0
        gone = self.registrar.expire(self.clock())
        self._drain_registrar()
        return len(gone)

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(self.config.expire_interval)
            with contextlib.suppress(StoreError):
                self.expire_now()

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
