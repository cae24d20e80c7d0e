"""The broker's SIP side: one :class:`~sip.aio.ua.UserAgent` for ``sip:<user>@<domain>``.

Theory of operation
-------------------
The UA owns sockets, transactions and dialogs; this module is its request handler and
the consumer of its dialog events. Every user's session is the
:class:`~mdeci.broker.sessions.SessionManager`'s: the answers and dialog events go to it,
and its commands are carried out here (BYE, churn events) or by the service.

- ``REGISTER``: the embedded registrar (:mod:`mdeci.broker.registrar`), or 405 when the
  broker REGISTERs its own AOR at an external registrar (``[registrar] embedded = false``;
  the UA refreshes it).
- ``INVITE`` (new or re-INVITE) to the broker's user: Digest (401 challenge, sent once
  and statelessly by the UA; :mod:`mdeci.broker.sip_auth`), the authenticated user must
  be the From AOR's user and, inside a dialog, the dialog's owner (else 403). Behind a
  proxy the Request-URI arrives rewritten to our contact: a digest ``uri`` naming our AOR
  is accepted (docs/sip.md). The offer is read and answered by
  :mod:`mdeci.broker.media_answer` on the data channels ``[media] transports`` accepts
  (488 + Warning when no line is usable), a key-exchange value another session holds is
  refused (488), and the answer names the accepted line's address (RUDP's, or the QUIC
  server's with its fingerprint) with an SDP origin (RFC 3264: one sess-id per dialog,
  derived from it, and version + 1 per answer, which the manager keeps). The UA creates
  the dialog after the handler returns: the session is stored and delivered to when it
  reports ``DialogStarted`` or ``DialogRefreshed``.
- In-dialog BYE, re-INVITE, UPDATE and INFO first pass :meth:`_guard` (the UA calls it
  before the dialog changes): digest credentials of the session's owner, else 401/403
  and nothing changes. A re-INVITE verified there is not verified again by the handler
  (its nonce-count would look replayed).
- Requests for other users get 404; OPTIONS, CANCEL and unknown methods are the UA
  core's (200 with Allow, §9.2, 501); ``Allow`` names REGISTER only in embedded mode.
  Drained (:meth:`drain`), new INVITEs and OPTIONS get 503 (:mod:`mdeci.broker.drain`).

The database is never called on the event loop: store calls go to the service's
:class:`~mdeci.broker.worker.DbWorker` thread, in order. Digest (the UA's in-dialog guard
is synchronous) reads HA1 from :class:`~mdeci.broker.sip_auth.CachedCredentials`, filled
on the worker before a request is verified, when a session is restored, and when the
guard misses or fails (for the client's retry; a miss is a challenge, not a failed login).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import sys
import time
from collections.abc import Callable

from mdeci.broker.addresses import Address, addr_text, parse_addr_text
from mdeci.broker.drain import draining
from mdeci.broker.errors import BrokerError
from mdeci.broker.links import check_key
from mdeci.broker.media_answer import answer_offer, read_offer, sess_id
from mdeci.broker.refusal import STORAGE_UNAVAILABLE, refusal
from mdeci.broker.registrar import BrokerRegistrar, StagedBindings, StoreBindings
from mdeci.broker.service import BrokerService
from mdeci.broker.sessions import Command, DialogId, DialogUp, InviteAnswered, Log, SendBye
from mdeci.broker.sink import ChurnSink, FieldValue
from mdeci.broker.sip_auth import (
    CachedCredentials,
    FailedLogins,
    GuardedDigest,
    LoginAttempt,
    StoreCredentials,
    ensure_users,
)
from mdeci.broker.throttle import LoginThrottle
from mdeci.broker.ua_config import ua_config
from mdeci.broker.worker import LoopSink
from mdeci.config import BrokerConfig
from mdeci.oplog import event as oplog_event
from mdeci.store.errors import StoreError, StoreUnavailable
from mdeci.store.ownership import Lost
from mdeci.store.repo import BrokerStore
from mdeci.tasks import spawn
from rudp.keys import KeyExchange, KeyExchangeError, psk_from_ha1
from sip.aio.ua import (
    DialogEnded,
    DialogEvent,
    DialogRefreshed,
    DialogStarted,
    IncomingRequest,
    Reply,
    UserAgent,
)
from sip.auth import AuthChallenge, DigestConfig
from sip.dialog import Dialog, DialogState
from sip.errors import AuthHeaderError, SdpError, SipError, SipParseError
from sip.message import Request
from sip.registrar import Registrar, RegistrarConfig
from sip.sdp import MdeciMedia, SessionDescription, read_description, stored_key
from sip.uri import SipUri, parse_uri

WARN_AGENT = "mdeci"
log = logging.getLogger("mdeci.broker")


# ---------------------------------------------------------------------------- helpers


def _warning(text: str) -> tuple[str, str]:
    clean = text.replace('"', "'").replace("\r", " ").replace("\n", " ")[:180]
    return ("Warning", f'399 {WARN_AGENT} "{clean}"')


def _refuse(status: int, why: str) -> Reply:
    return Reply(status, headers=(_warning(why),))


def _store_refusal(exc: StoreError) -> Reply:
    """The answer to a request the store failed: 503 (SIP has no 507) and Retry-After,
    the cause in the Warning (see :mod:`mdeci.broker.db_health`)."""
    answer = refusal(exc)
    why = f"service unavailable: {answer.message}"
    return Reply(STORAGE_UNAVAILABLE, headers=(("Retry-After", "5"), _warning(why)))


# ---------------------------------------------------------------------------- endpoint


def remote_aor(dialog: Dialog) -> str:
    """The AOR of ``dialog``'s remote URI ("" when it has none): an agent's session is
    keyed by it (the From of the INVITE that made the dialog)."""
    try:
        remote = parse_uri(dialog.remote_uri)
    except SipParseError:
        return ""
    return remote.aor if isinstance(remote, SipUri) and remote.user is not None else ""


class BrokerSipEndpoint:
    """The broker's SIP endpoint; :meth:`start`, then :meth:`close` at the end.

    ``clock``: wall-clock epoch seconds (bindings, nonces, session times);
    ``monotonic``: seconds for durations a clock step must not change (login lockouts);
    ``random``: tags, nonces and Call-IDs.
    """

    def __init__(
        self,
        config: BrokerConfig,
        store: BrokerStore,
        service: BrokerService,
        log: ChurnSink,
        *,
        clock: Callable[[], float] = time.time,
        random: Callable[[int], bytes] = secrets.token_bytes,
        expire_interval: float = 5.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        if expire_interval <= 0:
            raise BrokerError("expire_interval must be > 0")
        self.config = config
        self.expire_interval = expire_interval  # of the binding expiry sweep (s)
        self.store = store
        self.service = service
        self.worker = service.worker  # the core's thread: store calls keep its order
        self.log = log
        self._loop_log = LoopSink(log, service.to_loop)  # for events logged by the worker
        self.clock = clock
        self.credentials = CachedCredentials(store, config.auth.algorithms)
        self._staged = StagedBindings()
        self._msisdns = {  # only the users that have one: 10,000 users are 10,000 entries
            f"sip:{u.user}@{config.domain}": u.msisdn for u in config.auth.users if u.msisdn
        }
        self.digest = GuardedDigest(
            DigestConfig(
                realm=config.realm,
                algorithms=config.auth.algorithms,
                # Behind a proxy the Request-URI arrives rewritten to our contact; the
                # agent's digest names our AOR as it sent it (docs/sip.md, retargeting).
                retarget_uris=(config.aor, f"sips:{config.user}@{config.domain}"),
            ),
            self.credentials,
            random,
            LoginThrottle(config.auth.throttle),
            monotonic,
        )
        self.failed_logins = FailedLogins(config.auth.throttle, monotonic)
        self.registrar: Registrar | None = None
        self._registrar: BrokerRegistrar | None = None  # the registrar's glue
        self.ua = UserAgent(ua_config(config), self.handle, random=random, guard=self._guard)
        self._random = random
        self._sess_salt = random(16)  # see sess_id
        # Every user's session is the Session Manager's (the service holds it): this
        # endpoint hands it the SIP events and carries out its BYEs and churn events.
        self.sessions = service.sessions
        self.sessions.key_confirm_timeout = config.auth.key_confirm_timeout
        # A user another broker took over: the refusal comes from the database thread.
        service.rows.on_lost = lambda lost: service.to_loop.call(self._lost, lost)
        self._timer: asyncio.TimerHandle | None = None  # the manager's next_timer
        # In-dialog requests whose digest the guard verified (the handler must not verify
        # the same nonce-count twice): (Call-ID, CSeq number).
        self._guarded: set[tuple[str, int]] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._bound = False
        self._listening = asyncio.Event()  # set once SIP is bound
        self.stats_refused = 0
        self._store_id: str | None = None  # read once: the store's incarnation id

    # ------------------------------------------------------------------ lifecycle

    @property
    def local_addr(self) -> Address:
        """The bound SIP address."""
        return self.ua.local_addr

    async def start(self, host: str, port: int = 0) -> Address:
        """Add configured users, restore the stored sessions, bind UDP (+TCP), start the
        sweep and event tasks, register at the external registrar if configured; returns
        the SIP address. SIP is bound once every session and its owner's HA1 are back:
        a request read before would get a 481 or a second 401 (thousands in a reconnect
        storm); its retransmission finds the broker ready. Raises OSError when the
        address cannot be bound, StoreError, BrokerError when the registrar refuses us.
        """
        await self.worker.run(
            ensure_users,
            self.store,
            self.config.domain,
            self.config.realm,
            self.config.auth.users,
            md5="MD5" in self.config.auth.algorithms,
        )
        await self.restore_sessions()
        bound = await self.ua.start(host, port)
        self._listening.set()
        reg = self.config.registrar
        if reg.embedded:
            self.registrar = Registrar(
                RegistrarConfig(
                    domains=tuple(dict.fromkeys((self.config.domain, bound[0], host))),
                    default_expires=min(max(reg.default_expires, reg.min_expires), reg.max_expires),
                    min_expires=reg.min_expires,
                    max_expires=reg.max_expires,
                    warn_agent=WARN_AGENT,
                ),
                self._staged,
                self._random,
                auth=self.digest,
            )
            self._registrar = BrokerRegistrar(
                self.registrar, self._staged, self.store, self.worker, self.log, self.clock
            )
            self._spawn(self._registrar.sweep_forever(self.expire_interval))
        self._spawn(self._events_forever())
        if not reg.embedded:
            assert reg.address is not None  # checked by RegistrarConfig
            address = (reg.address.host, reg.address.port)
            try:
                await self.ua.register(address, reg.register_expires, transport=reg.transport)
            except SipError as exc:
                await self.ua.close()
                raise BrokerError(
                    f"registrar {addr_text(address)} refused {self.config.aor}: {exc}"
                ) from None
        self._bound = True
        return bound

    async def close(self) -> None:
        """Stop tasks and close sockets; sessions stay stored (no BYE: agents keep their
        dialogs and re-INVITE after a broker restart). Unregisters from an external
        registrar."""
        if not self.config.registrar.embedded:
            with contextlib.suppress(SipError, TimeoutError):
                await asyncio.wait_for(self.ua.unregister(), 2)
        self._bound = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.failed_logins.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.ua.close()

    def _spawn(self, coro: object) -> None:
        task: asyncio.Task[None] = spawn(coro, log, "SIP endpoint task")  # type: ignore[arg-type]
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def restore_sessions(self) -> int:
        """After a restart: rebuild the dialog and the RUDP peer of every session of this
        broker's (or of no broker's) stored CONNECTED, so agents keep their dialogs and
        delivery resumes; a QUIC session ends with a BYE (its agent INVITEs again at once).
        Rows that cannot be read back are marked DISCONNECTED. Returns how many were
        restored. Raises StoreError."""
        restored, owners = 0, []
        # Read and held in one call on the database thread, before anything for the users.
        for rec, _ in await self.worker.run(self.service.rows.read_back):
            try:
                addr = parse_addr_text(rec.media_addr)
                check_key(rec.session_key)
                dialog = Dialog(
                    call_id=rec.call_id,
                    local_tag=rec.local_tag,
                    remote_tag=rec.remote_tag,
                    local_uri=self.config.aor,
                    remote_uri=rec.uri,
                    remote_target=rec.remote_target,
                    route_set=tuple(r for r in rec.route_set.split(", ") if r),
                    local_seq=rec.local_cseq,
                    remote_seq=rec.remote_cseq,
                    is_uac=False,
                )
            except (ValueError, BrokerError):
                self._run(self.sessions.unrestorable(rec.uri))
                continue
            try:
                kx = stored_key(rec.remote_sdp, rec.transport)
            except SdpError:
                kx = None  # a re-INVITE then has to agree new keys
            self.ua.dialogs[dialog.id] = dialog  # before a QUIC session's BYE goes out
            self._run(
                self.sessions.restored(
                    rec.uri, dialog.id, addr, rec.session_key, kx, rec.started_at, rec.transport
                )
            )
            # A PING now: the agent, which holds the key, resumes on it (docs/protocol.md §4).
            if rec.transport == "rudp" and self.service.alive(rec.uri):
                self.service.endpoint.peer(rec.session_key, addr).announce()
            restored += 1
            owner = parse_uri(rec.uri)
            if isinstance(owner, SipUri) and owner.user is not None:
                owners.append(owner.user)
        # The guard verifies the owners' in-dialog requests from the cache: one call for
        # all of them (a call each waited behind every request of a reconnect storm).
        fetch = self.credentials.fetch_many
        self.credentials.keep(await self.worker.run(fetch, owners, self.config.realm))
        return restored

    async def _load_credentials(self, username: str) -> None:
        """Refresh ``username``'s HA1 entries from the store. Raises StoreError."""
        found = await self.worker.run(self.credentials.fetch, username, self.config.realm)
        self.credentials.keep(found)

    # ------------------------------------------------------------------ requests

    async def handle(self, req: IncomingRequest) -> Reply:
        """The UA's request handler. Never raises for a store failure (503 + Retry-After)."""
        attempt = self.digest.attempt(req.request, req.source)
        try:
            reply = await self._handle(req, attempt)
        except StoreError as exc:
            # Details (host, port, SQL) go to the operator's log; the peer learns the cause.
            self.service.broker.health.failed(
                "sip", exc, method=req.request.method, source=addr_text(req.source)
            )
            return _store_refusal(exc)
        self.failed_logins.record(req.request, attempt, reply)
        return reply

    async def _handle(self, req: IncomingRequest, attempt: LoginAttempt) -> Reply:
        """Fetch on the database thread what the request needs, then decide on the loop.
        ``attempt`` is this request's authentication context, carried across the awaits."""
        request = req.request
        if request.method not in ("REGISTER", "INVITE"):
            return Reply(405)
        if attempt.user is not None:
            await self._load_credentials(attempt.user)
        if request.method == "REGISTER":
            return await self._register(req, attempt)
        if self._store_id is None:
            self._store_id = await self.worker.run(self.store.identity.incarnation)
        return self._invite(req, attempt)

    async def _register(self, req: IncomingRequest, attempt: LoginAttempt) -> Reply:
        if self._registrar is None:
            return _refuse(405, "this broker is not a registrar")
        verifier, credentials = self.digest.bound(attempt), attempt.user is not None
        return await self._registrar.handle(req, verifier, credentials=credentials)

    def _invite(self, req: IncomingRequest, attempt: LoginAttempt) -> Reply:
        """Answer an INVITE or re-INVITE to the broker's user: who sends it, Digest, the
        offer, then the keys and the answer (:meth:`_answer`)."""
        request = req.request
        who = self._inviter(req)
        if isinstance(who, Reply):
            return who
        uri, user, from_tag = who
        guarded = (request.call_id, request.cseq.seq)
        if req.dialog is None or guarded not in self._guarded:
            refused = self._authenticate(request, user, attempt)
            if refused is not None:
                return refused
        self._guarded.discard(guarded)
        version = self.sessions.version(uri, request.call_id, from_tag) or 0
        origin = (sess_id(self._sess_salt, request.call_id, from_tag), version + 1)
        try:
            offer = read_description(request.body)  # read once: the answer reuses it
            media = read_offer(offer, self.service.channels)
        except SdpError as exc:
            return _refuse(488, exc.reason)
        assert media.key is not None  # require_key
        dialog_id = None if req.dialog is None else req.dialog.id
        keep = self.sessions.keeps_keys(uri, dialog_id, media.key)
        if not keep:
            holder = self.sessions.kx_holder(media.key)
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
        return self._answer(req, uri, user, from_tag, offer, media, origin, keep)

    def _inviter(self, req: IncomingRequest) -> tuple[str, str, str] | Reply:
        """(AOR, user, From tag) of an INVITE's sender, or the refusal: 404 for another
        user of ours, 403 for a sender outside our domain or not the dialog's owner."""
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
        uri = sys.intern(from_uri.aor)  # the session's key everywhere: one string
        if from_uri.host.lower() != self.config.domain.lower():
            return _refuse(403, f"{uri} is not of domain {self.config.domain}")
        if req.dialog is not None:
            owner = self.sessions.owner(req.dialog.id, remote_aor(req.dialog))
            if owner is not None and owner != uri:
                self.stats_refused += 1
                return _refuse(403, f"{uri} may not act in the session of {owner}")
        return uri, from_uri.user, from_tag

    def _answer(
        self,
        req: IncomingRequest,
        uri: str,
        user: str,
        from_tag: str,
        offer: SessionDescription,
        media: MdeciMedia,
        origin: tuple[int, int],
        keep: bool,
    ) -> Reply:
        """The 200 answer on our RUDP address: the keys kept (a re-INVITE offering the
        value its keys came from) or agreed anew, bound to the store's id."""
        request = req.request
        assert media.key is not None
        ha1 = self.credentials.ha1(user, self.config.realm, "SHA-256")
        if ha1 is None:
            return _refuse(403, "no SHA-256 credentials for this user")
        kx = None if keep else KeyExchange(self._random(32))
        if self._store_id is None:
            return _store_refusal(StoreUnavailable("the store's id was not read"))
        try:
            # The store id goes in before the secret is derived: it is part of the
            # transcript both ends bind the key to.
            public = None if kx is None else kx.public
            channels = self.service.channels
            answer = answer_offer(
                offer, self.config.user, origin, channels, public, self._store_id
            ).encode()
            if kx is None:
                kept = self.sessions.get(uri)
                assert kept is not None
                secret = kept.key
            else:
                secret = kx.session_secret(media.key, psk_from_ha1(ha1), request.body, answer)
        except SdpError as exc:
            return _refuse(488, exc.reason)
        except KeyExchangeError as exc:
            return _refuse(488, str(exc))
        answered = InviteAnswered(
            uri=uri,
            call_id=request.call_id,
            from_tag=from_tag,
            dialog_id=None if req.dialog is None else req.dialog.id,
            media_addr=(media.addr, media.port),
            kx=media.key,
            key=secret,
            new_keys=kx is not None,
            transport=media.transport,
            offer=request.body.decode("utf-8", "replace"),
            version=origin[1],
            # The operator's record only: a number announced in SDP is the user's claim,
            # and SMS to it would be paid by the operator.
            msisdn=self._msisdns.get(uri),
        )
        self._run(self.sessions.answered(answered))
        return Reply(200, body=answer)

    def _authenticate(self, request: Request, user: str, attempt: LoginAttempt) -> Reply | None:
        """Digest for ``request`` (``attempt``) as ``user``: None when good, else the
        refusal (401/407 challenge, 400 for unreadable credentials, 403 for another user's)."""
        try:
            result = self.digest.check(attempt, request, self.clock())
        except AuthHeaderError as exc:
            return _refuse(400, f"bad credentials: {exc.reason}")
        if isinstance(result, AuthChallenge):
            return Reply(result.status, headers=result.headers)
        if result.username != user:
            self.stats_refused += 1
            return _refuse(403, f"{result.username} may not act as sip:{user}@...")
        return None

    def _guard(self, request: Request, dialog: Dialog, source: Address | None) -> Reply | None:
        """An in-dialog request changes nothing until it is authenticated as
        the session's owner (a BYE or re-INVITE from anyone else gets 401/403 and the
        session goes on). Requests of dialogs we did not make with an agent pass."""
        owner = self.sessions.owner(dialog.id, remote_aor(dialog))
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
        if self.credentials.knows(owner_user.user, self.config.realm):
            attempt = self.digest.attempt(request, source or ("-", 0))
            refused = self._authenticate(request, owner_user.user, attempt)
            if refused is not None:
                self.failed_logins.record(request, attempt, refused)
        else:  # evicted by other users' entries, or lost to a restart: not a failed login
            challenge = self.digest.verify(request, self.clock())
            refused = Reply(challenge.status, headers=challenge.headers)
        if refused is None and request.method == "INVITE":
            self._guarded.add((request.call_id, request.cseq.seq))
        elif refused is not None and refused.status == 401:
            # The owner's entries are missing or older than a password change: fetch them
            # for the client's retry (the guard cannot wait).
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
            except Exception:  # a StoreError, a short key: logged, never fatal to the loop
                log.exception("dialog event %s failed", type(event).__name__)

    def _on_event(self, event: DialogEvent) -> None:
        dialog = event.dialog
        if isinstance(event, DialogStarted | DialogRefreshed) and not dialog.is_uac:
            up = DialogUp(
                dialog_id=dialog.id,
                remote_target=dialog.remote_target,
                route_set=", ".join(dialog.route_set),
                local_seq=dialog.local_seq,
                remote_seq=dialog.remote_seq or 0,
                refreshed=isinstance(event, DialogRefreshed),
                wall=self.clock(),
            )
            self._run(self.sessions.dialog_up(up, asyncio.get_running_loop().time()))
        elif isinstance(event, DialogEnded):
            self._run(self.sessions.dialog_ended(dialog.id, remote_aor(dialog), event.reason))

    def _run(self, commands: list[Command]) -> None:
        """Carry out the Session Manager's commands in order: BYEs and churn events here,
        the rest by the service; then arm its next timer."""
        for command in commands:
            if isinstance(command, SendBye):
                dialog = self.ua.dialogs.get(command.dialog_id)
                if dialog is not None and dialog.state is DialogState.CONFIRMED:
                    self._spawn(self._bye_quietly(dialog))
            elif isinstance(command, Log):
                self._log_when_stored(command.event, command.uri, **dict(command.fields))
            else:
                self.service.apply([command])
        self._arm()

    def _arm(self) -> None:
        at = self.sessions.next_timer()
        if self._timer is not None:
            if at is not None and self._timer.when() == at:
                return
            self._timer.cancel()
            self._timer = None
        if at is not None:
            self._timer = asyncio.get_running_loop().call_at(at, self._on_timer)

    def _on_timer(self) -> None:
        """Fail closed: a session whose keys no authentic datagram confirmed ends."""
        self._timer = None
        commands = self.sessions.timer(asyncio.get_running_loop().time())
        for command in commands:
            if isinstance(command, Log) and command.event == "session_ended":
                log.warning(
                    "session of %s (Call-ID %s) ended: no authentic data-channel packet within "
                    "%.1f s of the key agreement; the SDP key exchange was altered on the "
                    "path or the agent derived another key",
                    command.uri,
                    dict(command.fields).get("call_id"),
                    self.config.auth.key_confirm_timeout,
                )
        self._run(commands)

    def _lost(self, lost: Lost) -> None:
        """The store refused a call for ``lost.uri``: another broker holds the user now.
        Its session here ends without a BYE (the agent's dialog is with the new holder,
        or will be); the dialog is forgotten."""
        session = self.sessions.get(lost.uri)
        if session is None:
            return
        self._spawn(self._drop_lost(lost, session.dialog_id))

    async def _drop_lost(self, lost: Lost, dialog_id: DialogId | None) -> None:
        # A new session of the user here may have claimed it again meanwhile: its claim
        # was queued on the database thread before this question, so the answer says.
        rows = self.service.rows
        if await self.worker.run(rows.holds, lost.uri):
            return
        session = self.sessions.get(lost.uri)
        if session is None or session.dialog_id != dialog_id:
            return  # ended, or replaced by a newer dialog, since
        if session.dialog_id is not None:
            self.ua.dialogs.pop(session.dialog_id, None)
        oplog_event(
            "session_lost",
            level=logging.WARNING,
            uri=lost.uri,
            node=self.config.node,
            owner=lost.owner,
            epoch=lost.epoch,
        )
        self._run(self.sessions.lost(lost.uri, lost.owner, lost.epoch))

    def _log_when_stored(self, event: str, uri: str, **fields: FieldValue) -> None:
        """Log ``event`` once the store writes queued so far ran (whoever reads it finds
        the session's status written)."""
        self.worker.post("churn event", self._loop_log.emit, event, uri, **fields)

    def kick(self, uri: str) -> bool:
        """End ``uri``'s session now (``mdeci admin kick``): BYE to the agent, delivery
        stopped, ``session_ended`` logged with reason ``kicked``. False when it has none."""
        session = self.sessions.get(uri)
        if session is None or session.dialog_id not in self.ua.dialogs:
            return False
        self._run(self.sessions.kick(uri))
        return True

    def drain(self) -> int:
        """Out of service (``mdeci admin drain``): new INVITEs and the proxy's OPTIONS
        probes get 503, every session ends with BYE. How many sessions it ended."""
        self.ua.core.out_of_service = draining(self.config.node)
        ended = self.sessions.drain()
        self._run(ended)
        return sum(isinstance(c, Log) for c in ended)

    @property
    def bound(self) -> bool:
        """True while the SIP sockets are open (the readiness probe)."""
        return self._bound

    async def _bye_quietly(self, dialog: Dialog) -> None:
        await self._listening.wait()  # a restored QUIC session's BYE waits for the bind
        with contextlib.suppress(SipError, OSError):
            await self.ua.bye(dialog)

    async def expire_now(self) -> int:
        """Run the binding expiry sweep once; how many bindings ran out. Raises StoreError."""
        return 0 if self._registrar is None else await self._registrar.expire_now()

    # ------------------------------------------------------------------ introspection

    def session_of(self, uri: str) -> tuple[str, Address] | None:
        """(Call-ID, media address) of ``uri``'s live session, or None."""
        s = self.sessions.get(uri)
        return None if s is None or s.dialog_id is None else (s.call_id, s.media_addr)


__all__ = [
    "Address",
    "BrokerSipEndpoint",
    "StoreBindings",
    "StoreCredentials",
    "addr_text",
    "ensure_users",
    "parse_addr_text",
]
