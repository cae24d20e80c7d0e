"""The asyncio glue of the agent: sockets, tasks and a clock around :class:`AgentCore`.

Theory of operation
-------------------
:class:`Agent` opens the state files, a SIP backend (:class:`~mdeci.agent.backend.SipBackend`)
and a :class:`rudp.aio.RudpEndpoint`, and feeds the core: RUDP messages, the outcome of
each SIP command, dialog events, address changes (IP monitor or :meth:`Agent.move_to`)
and the core's timer. After every input it carries out the core's commands
(:meth:`_pump`): frames are sent by one task each (RUDP keeps their order), the RUDP
peer is attached synchronously, and SIP commands and rebinds run one at a time on the
*SIP worker*. Events from the core go to :meth:`_on_event`: churn log, ``tail``
listeners, the futures of pending requests, and a log line for every alert.

The glue keeps no history: waiting for "something happened" is
:meth:`Agent.wait_until` on a condition, and ``event_counts``/``recent_events`` are
bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import ipaddress
import logging
import os
import random as _random
import secrets
import socket
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from mdeci import oplog
from mdeci.agent.backend import SipBackend, make_backend
from mdeci.agent.core import (
    Address,
    AgentCore,
    AgentFiles,
    Alert,
    AttachMedia,
    ChurnRecord,
    CoreEvent,
    Delivered,
    Invite,
    LimitNotice,
    MoveSip,
    Rebind,
    RequestDone,
    RequestFailed,
    SendFrame,
    SipCommand,
    SipOutcome,
    State,
    StateChanged,
    Status,
    StoreReplaced,
    hostport,
)
from mdeci.agent.errors import AgentError, BrokerRefused, NotConnected, StateError
from mdeci.agent.ipmonitor import AddressSource, Wakeable, make_monitor
from mdeci.agent.sms import SmsInbox, open_gateway, windowed_gate
from mdeci.agent.sms import link_config as sms_link_config
from mdeci.agent.state import (
    INBOX_FILE,
    NSEQ_FILE,
    OUTBOX_FILE,
    SUBS_FILE,
    Fsync,
    Inbox,
    NseqState,
    Outbox,
    SubsRecord,
)
from mdeci.churnlog import ChurnLog, Event, Role
from mdeci.config import AgentConfig
from mdeci.errors import ChurnLogError
from mdeci.frames import (
    AttrValue,
    CalendarOk,
    CalendarRule,
    Error,
    Frame,
    LimitReached,
    Pub,
    PubOk,
    SubInfo,
    SubOk,
    Subs,
    encode,
)
from mdeci.sms.gateway import SmsGateway
from rudp.aio import RudpEndpoint, RudpPeer
from rudp.errors import PeerUnreachable

log = logging.getLogger("mdeci.agent")

LOCK_FILE = "lock"
RECENT_EVENTS = 2048  # churn records kept for wait_event (bounded)
BYE_TIMEOUT = 3.0  # seconds for BYE and unREGISTER on shutdown


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentStatus:
    """What ``mdeci status`` shows."""

    aor: str
    node: str
    status: Status
    state: str
    sip_addr: str
    media_addr: str
    broker_media_addr: str | None
    call_id: str | None
    registered: bool
    highest_nseq: int
    store_id: str | None
    buffered: int
    inbox: int
    listeners: int
    subscriptions: int
    attempts: int
    failed_attempts: int
    alerts: Mapping[str, int]
    last_error: str | None
    sip_stack: str
    sip_transport: str  # how it reaches the registrar and the broker
    sip_received: Mapping[str, int]  # SIP messages received per transport
    sip_contact: str  # the Contact URI registered (``sips:`` over TLS)

    def to_json(self) -> dict[str, Any]:
        return {
            "aor": self.aor,
            "node": self.node,
            "status": str(self.status),
            "state": self.state,
            "sip_addr": self.sip_addr,
            "media_addr": self.media_addr,
            "broker_media_addr": self.broker_media_addr,
            "call_id": self.call_id,
            "registered": self.registered,
            "highest_nseq": self.highest_nseq,
            "store_id": self.store_id,
            "buffered": self.buffered,
            "inbox": self.inbox,
            "listeners": self.listeners,
            "subscriptions": self.subscriptions,
            "attempts": self.attempts,
            "failed_attempts": self.failed_attempts,
            "alerts": dict(self.alerts),
            "last_error": self.last_error,
            "sip_stack": self.sip_stack,
            "sip_transport": self.sip_transport,
            "sip_received": dict(self.sip_received),
            "sip_contact": self.sip_contact,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class PubResult:
    """How a publish ended within the bound: ``published`` (the broker's ``pub-ok``),
    ``sent`` (on its way, no answer yet) or ``buffered`` (kept until a connection)."""

    msg_id: str
    state: str
    matched: int | None = None


async def _ip_of(host: str, like: str) -> str | None:
    """``host`` as an IP address of ``like``'s family (resolved if a name), or None: the
    IP monitor follows the route to it."""
    try:
        family = socket.AF_INET6 if ipaddress.ip_address(like).version == 6 else socket.AF_INET
    except ValueError:
        family = socket.AF_UNSPEC
    try:
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(host, None, family=family, type=socket.SOCK_DGRAM)
    except OSError:
        return None
    return str(infos[0][4][0]) if infos else None


def lock_state_dir(state_dir: Path) -> IO[bytes]:
    """Take ``state_dir/lock`` (an exclusive flock, released when the process ends).

    Raises :class:`AgentError` when another agent holds it: that agent's socket and files
    are left alone.
    """
    path = state_dir / LOCK_FILE
    try:
        fh = open(path, "a+b")  # noqa: SIM115 - held for the agent's life
    except OSError as exc:
        raise StateError(f"cannot open {path}: {exc.strerror}") from exc
    try:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        fh.seek(0)
        holder = fh.read().decode("ascii", "replace").strip() or "?"
        fh.close()
        raise AgentError(
            f"another agent (pid {holder}) is using {state_dir}: "
            "stop it first, or give this one its own state_dir"
        ) from None
    fh.seek(0)
    fh.truncate()
    fh.write(str(os.getpid()).encode())
    fh.flush()
    return fh


class Agent:
    """The device agent. Build, :meth:`start`, use, :meth:`close`."""

    def __init__(
        self,
        config: AgentConfig,
        *,
        clock: Callable[[], float] = time.time,
        random_bytes: Callable[[int], bytes] = secrets.token_bytes,
        jitter: Callable[[], float] = _random.random,
        address_source: AddressSource | None = None,
        response_timeout: float | None = None,
        sms_gateway: SmsGateway | None = None,
        fsync: Fsync = os.fsync,
    ) -> None:
        self.config = config
        self.clock = clock
        # Every fsync of the state files (tests and benchmarks count them).
        self.fsync = fsync
        self.random_bytes = random_bytes
        self.jitter = jitter
        self.address_source = address_source
        self.response_timeout = response_timeout
        # With [sms] enabled: the phone's SMS gateway (required then; see agent/sms.py).
        self.sms_gateway = sms_gateway
        self.sms: SmsInbox | None = None
        self.core: AgentCore | None = None
        self.backend: SipBackend | None = None
        self.endpoint: RudpEndpoint | None = None
        self.churn: ChurnLog | None = None
        self.event_counts: Counter[str] = Counter()
        self.recent_events: deque[dict[str, Any]] = deque(maxlen=RECENT_EVENTS)
        self._files: AgentFiles | None = None
        self._changed = asyncio.Event()
        self._connected = asyncio.Event()
        self._waiters: dict[int, asyncio.Future[Frame]] = {}
        self._listeners: set[asyncio.Queue[dict[str, Any]]] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._sip_queue: asyncio.Queue[SipCommand | Rebind] = asyncio.Queue()
        self._peer: RudpPeer | None = None
        self._peer_key: bytes | None = None
        self._burst: list[bytes] = []  # messages read in this loop turn (_on_message)
        self._burst_soon = False
        self._sync_soon = False  # publishes wait for the outbox's fsync (_sync_outbox)
        self._timer: asyncio.TimerHandle | None = None
        self._monitor: Wakeable | None = None
        self._rebind_error: OSError | None = None
        self._closed = False
        self._lock: IO[bytes] | None = None

    # ------------------------------------------------------------------ life

    async def start(self) -> None:
        """Open the state files, bind SIP and RUDP, start connecting.

        Raises :class:`StateError`, :class:`AgentError`, :class:`OSError` (binding).
        """
        cfg = self.config
        try:
            cfg.state_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StateError(f"cannot create {cfg.state_dir}: {exc.strerror}") from exc
        self._lock = lock_state_dir(cfg.state_dir)  # before any file is opened or rewritten
        fsync = self.fsync
        inbox = Inbox(cfg.state_dir / INBOX_FILE, fsync=fsync)
        nseq = NseqState(cfg.state_dir / NSEQ_FILE, floor=inbox.last_nseq, fsync=fsync)
        if cfg.sms.enabled:
            nseq.gate = windowed_gate(nseq.path, nseq.highest, cfg.sms.window)
        files = AgentFiles(
            inbox=inbox,
            nseq=nseq,
            outbox=Outbox(cfg.state_dir / OUTBOX_FILE, fsync=fsync),
            subs=SubsRecord(cfg.state_dir / SUBS_FILE, fsync=fsync),
        )
        self._files = files
        self.churn = ChurnLog(
            cfg.churnlog.path,
            cfg.node,
            self.clock,
            cfg.churnlog.max_bytes,
            cfg.churnlog.backups,
            role=Role.AGENT,
        )
        self.backend = make_backend(cfg, self.random_bytes)
        sip_addr = await self.backend.start(self._on_bye)
        self.endpoint = await RudpEndpoint.open(cfg.media.host, cfg.media.port, config=cfg.rudp)
        kwargs: dict[str, Any] = {}
        if self.response_timeout is not None:
            kwargs["response_timeout"] = self.response_timeout
        self.core = AgentCore(
            cfg,
            files,
            self._on_event,
            random_bytes=self.random_bytes,
            jitter=self.jitter,
            sip_addr=sip_addr,
            media_addr=self.endpoint.local_addr,
            **kwargs,
        )
        self._spawn(self._sip_worker())
        self._monitor = make_monitor(
            cfg.ip_monitor,
            cfg.sip.host,
            self.address_source,
            dest=await _ip_of(cfg.broker.address.host, cfg.sip.host),
        )
        if self._monitor is not None:
            self._spawn(self._monitor.run(self._on_ip_change))
        if cfg.sms.enabled:
            if cfg.msisdn is None:
                raise AgentError("[sms] enabled needs msisdn (this device's number)")
            if self.sms_gateway is None:
                self.sms_gateway = open_gateway(cfg.sms)  # from [sms] (issue 13)
            self.sms = SmsInbox(
                cfg.msisdn,
                cfg.sms.broker_number,
                self.sms_gateway,
                self._on_sms_frame,
                sms_link_config(cfg.sms),
            )
            await self.sms.start()
        self.core.start(self.clock())
        self._pump()

    async def close(self, *, clean: bool = True) -> None:
        """Stop. ``clean``: BYE the session and unREGISTER first (best effort)."""
        if self._closed:
            return
        self._closed = True
        core = self.core
        if core is not None:
            core.close(self.clock(), clean=clean)
            self._pump()
            if clean:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(
                        self.wait_until(lambda: core.state is State.CLOSED), 2 * BYE_TIMEOUT
                    )
        if self._monitor is not None:
            self._monitor.close()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._stop_reader()
        if self._timer is not None:
            self._timer.cancel()
        for waiter in self._waiters.values():
            if not waiter.done():
                waiter.set_exception(NotConnected("the agent is shutting down"))
        if self.backend is not None:
            await self.backend.close()
        if self.sms is not None:
            await self.sms.close()
        if self.endpoint is not None:
            await self.endpoint.close()
        if self._files is not None:
            # The gate's checkpoint (with window 0 the inbox alone holds it meanwhile).
            try:
                self._files.nseq.save()
            except StateError as exc:
                log.warning("state: %s", exc)
            self._files.inbox.close()
            self._files.outbox.close()
        if self.churn is not None:
            self.churn.close()
        if self._lock is not None:
            self._lock.close()  # releases the flock

    def _spawn(self, coro: Any) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # ------------------------------------------------------------------ the core's commands

    def _pump(self) -> None:
        core = self.core
        assert core is not None
        while (command := core.next_command()) is not None:
            if isinstance(command, SendFrame):
                self._send(command.data)
            elif isinstance(command, AttachMedia):
                self._attach(command.key, command.addr)
            else:
                self._sip_queue.put_nowait(command)
        self._arm()

    def _arm(self) -> None:
        assert self.core is not None
        when = self.core.get_timer()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if when is not None and not self._closed:
            loop = asyncio.get_running_loop()
            # The core's times are self.clock()'s; the loop's timer runs on its own clock.
            delay = max(0.0, when - self.clock())
            self._timer = loop.call_later(delay, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        assert self.core is not None
        self.core.handle_timer(self.clock())
        self._pump()

    def _send(self, data: bytes) -> None:
        # No task per frame (issue 14: a publish's task and its steps cost the device
        # more than the frame's encoding): the acknowledgement's future reports a failure.
        peer = self._peer
        if peer is None:
            return
        try:
            future = peer.send_nowait(data)
        except PeerUnreachable as exc:
            # Not from inside _pump's loop over the core's commands: next iteration, as
            # when a task sent the frame.
            asyncio.get_running_loop().call_soon(self._send_failed, peer, exc)
            return
        future.add_done_callback(lambda done: self._sent(peer, done))

    def _sent(self, peer: RudpPeer, future: asyncio.Future[None]) -> None:
        if future.cancelled():
            return
        exc = future.exception()  # retrieved even when closing: asyncio would log it
        if isinstance(exc, PeerUnreachable):
            self._send_failed(peer, exc)

    def _send_failed(self, peer: RudpPeer, exc: PeerUnreachable) -> None:
        # Closing fails what is still pending: that is no lost peer (the task that sent a
        # frame used to be cancelled first).
        if not self._closed:
            self._peer_lost(peer, exc)

    def _peer_lost(self, peer: RudpPeer, exc: PeerUnreachable) -> None:
        if peer is not self._peer or self.core is None:
            return
        reason = f"rudp: {exc.reason}"
        if exc.reason.startswith("0 messages"):
            reason = "rudp: the broker stopped answering keepalives"
        self.core.peer_lost(self.clock(), reason)
        self._pump()

    def _attach(self, key: bytes, addr: Address) -> None:
        endpoint = self.endpoint
        assert endpoint is not None
        if self._peer is None or self._peer_key != key:
            self._stop_reader()
            if self._peer_key is not None:
                endpoint.remove_peer(self._peer_key)
            peer = endpoint.peer(key, addr)
            self._peer, self._peer_key = peer, key
            peer.on_disconnected = lambda exc: self._peer_lost(peer, exc)
            peer.on_message = lambda data: self._on_message(peer, data)
        peer = self._peer
        peer.set_address(addr)
        if not peer.connected:
            peer.reset()

    def _stop_reader(self) -> None:
        if self._peer is not None:
            self._peer.on_message = None
        self._burst.clear()

    def _on_message(self, peer: RudpPeer, data: bytes) -> None:
        # Called by RUDP for each message as it reads a datagram: collected, and handed
        # to the core as one burst once the loop turn's reading is done (one fsync for
        # the burst's notifications, docs/agent.md).
        if peer is not self._peer:
            return
        self._burst.append(data)
        if not self._burst_soon:
            self._burst_soon = True
            asyncio.get_running_loop().call_soon(self._take_burst)

    def _sync_outbox(self) -> None:
        self._sync_soon = False
        if self.core is not None and not self._closed:
            self.core.sync_outbox(self.clock())
            self._pump()

    def _take_burst(self) -> None:
        self._burst_soon = False
        burst, self._burst = self._burst, []
        if self.core is None or not burst or self._closed:
            return
        self.core.frames_received(self.clock(), burst)
        self._pump()

    def _on_sms_frame(self, data: bytes) -> None:
        # The SMS channel's hook into the core (agent/sms.py).
        if self.core is not None:
            self.core.frame_by_sms(self.clock(), data)
            self._pump()

    async def _sip_worker(self) -> None:
        backend = self.backend
        assert backend is not None
        while True:
            command = await self._sip_queue.get()
            core = self.core
            assert core is not None
            if isinstance(command, Rebind):
                await self._rebind(command.host)
                continue
            if isinstance(command, MoveSip) and self._rebind_error is not None:
                outcome = SipOutcome(status=None, reason=f"cannot bind: {self._rebind_error}")
            else:
                timeout = BYE_TIMEOUT if core.state is State.CLOSING else None
                outcome = await backend.execute(command, timeout=timeout)
            core.sip_done(self.clock(), command, outcome)
            self._pump()

    async def _rebind(self, host: str) -> None:
        endpoint = self.endpoint
        assert endpoint is not None and self.core is not None
        self._rebind_error = None
        _, port = endpoint.local_addr
        try:
            try:
                await endpoint.rebind(host, port)
            except OSError:
                await endpoint.rebind(host, 0)
        except OSError as exc:
            self._rebind_error = exc
            return
        if self._monitor is not None:
            self._monitor.set_host(host)
        self.core.media_bound(self.clock(), endpoint.local_addr)

    def _on_bye(self, call_id: str) -> None:
        core = self.core
        if core is not None and core.call_id == call_id:
            core.bye_received(self.clock())
            self._pump()

    # ------------------------------------------------------------------ the core's events

    def _on_event(self, event: CoreEvent) -> None:
        if isinstance(event, ChurnRecord):
            self._log(event.event, dict(event.fields))
        elif isinstance(event, Delivered):
            record = dict(event.record)
            for queue in list(self._listeners):
                queue.put_nowait(record)
        elif isinstance(event, RequestDone):
            waiter = self._waiters.pop(event.req, None)
            if waiter is not None and not waiter.done():
                waiter.set_result(event.frame)
        elif isinstance(event, RequestFailed):
            waiter = self._waiters.pop(event.req, None)
            if waiter is not None and not waiter.done():
                waiter.set_exception(event.error)
        elif isinstance(event, Alert):
            log.warning("%s: %s", event.kind, event.message)
        elif isinstance(event, StoreReplaced):
            log.warning(
                "broker store is now %s: %d subscription(s) sent again", event.new, event.restored
            )
            for queue in list(self._listeners):
                queue.put_nowait({"store_replaced": event.new, "restored": event.restored})
        elif isinstance(event, LimitNotice):
            log.warning("broker limit: %s", event.frame)
        elif isinstance(event, StateChanged):
            if event.status is Status.CONNECTED:
                self._connected.set()
            else:
                self._connected.clear()
        self._changed.set()

    def _log(self, event: Event, fields: dict[str, Any]) -> None:
        fields = {k: v for k, v in fields.items() if v is not None}
        record: dict[str, Any] = {"event": str(event), "uri": self.config.aor, **fields}
        if self.churn is not None:
            try:
                record = self.churn.write(event, uri=self.config.aor, **fields)
            except ChurnLogError as exc:
                if self.core is not None:
                    self.core.last_error = str(exc)
        self.event_counts[str(event)] += 1
        self.recent_events.append(record)

    # ------------------------------------------------------------------ observing

    @property
    def status_value(self) -> Status:
        return self.core.status if self.core is not None else Status.DISCONNECTED

    @property
    def connected(self) -> bool:
        return self.core is not None and self.core.connected

    @property
    def subscriptions(self) -> tuple[SubInfo, ...]:
        return self.core.subscriptions if self.core is not None else ()

    @property
    def last_error(self) -> str | None:
        return self.core.last_error if self.core is not None else None

    async def wait_connected(self) -> None:
        """Return once the session is CONNECTED."""
        await self._connected.wait()

    async def wait_until(self, predicate: Callable[[], bool]) -> None:
        """Return once ``predicate()`` holds; checked after each event of the core."""
        while not predicate():
            self._changed.clear()
            await self._changed.wait()

    async def wait_event(self, event: str, count: int = 1, **match: object) -> dict[str, Any]:
        """The ``count``-th recent churn record named ``event`` (whose fields equal ``match``)."""
        found: list[dict[str, Any]] = []

        def seen() -> bool:
            found[:] = [
                r
                for r in self.recent_events
                if r["event"] == event and all(r.get(k) == v for k, v in match.items())
            ]
            return len(found) >= count

        await self.wait_until(seen)
        return found[count - 1]

    def status(self) -> AgentStatus:
        """A snapshot for ``mdeci status``."""
        core, files, endpoint, backend = self.core, self._files, self.endpoint, self.backend
        assert core is not None and files is not None and endpoint is not None
        assert backend is not None
        return AgentStatus(
            aor=self.config.aor,
            node=self.config.node,
            status=core.status,
            state=str(core.state),
            sip_addr=hostport(core.sip_addr),
            media_addr=hostport(endpoint.local_addr),
            broker_media_addr=None if core.broker_media is None else hostport(core.broker_media),
            call_id=core.call_id,
            registered=core.registered,
            highest_nseq=files.nseq.highest,
            store_id=files.nseq.store_id,
            buffered=len(files.outbox),
            inbox=len(files.inbox.records),
            listeners=len(self._listeners),
            subscriptions=len(core.subscriptions),
            attempts=core.counters.attempts,
            failed_attempts=core.counters.failed_attempts,
            alerts=dict(core.counters.alerts),
            last_error=core.last_error,
            sip_stack=backend.name,
            sip_transport=backend.transport,
            sip_received=backend.received,
            sip_contact=backend.contact,
        )

    # ------------------------------------------------------------------ mobility

    async def _on_ip_change(self, host: str) -> None:
        core = self.core
        assert core is not None
        # The moment of detection (the move's ip_changed comes after the new REGISTER).
        oplog.event("move_detected", logger="agent", addr=host, prev_addr=core.sip_addr[0])
        try:
            await self.move_to(host)
        except (OSError, AgentError):
            # Not moved (the address cannot be bound yet: an IPv6 address still in
            # duplicate address detection): the monitor names it again at its next event
            # or dump instead of taking it for ours.
            if self._monitor is not None:
                self._monitor.set_host(core.sip_addr[0])

    async def move_to(self, host: str) -> None:
        """Move SIP and RUDP to ``host``: rebind RUDP, REGISTER the new contact, re-INVITE.

        Returns once the move is done (or failed: then the agent reconnects with back-off).
        Raises :class:`OSError` when ``host`` cannot be bound.
        """
        core = self.core
        assert core is not None
        before = self.event_counts[str(Event.IP_CHANGED)]
        core.address_changed(self.clock(), host)
        self._pump()
        if core.sip_addr[0] == host and core.state is not State.MOVING:
            return

        def done() -> bool:
            return self.event_counts[str(Event.IP_CHANGED)] > before and (
                core.state is not State.MOVING
            )

        await self.wait_until(done)
        if self._rebind_error is not None:
            raise self._rebind_error

    # ------------------------------------------------------------------ applications

    def listen(self) -> asyncio.Queue[dict[str, Any]]:
        """A queue that receives every notification handed over from now on."""
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._listeners.add(queue)
        self._changed.set()
        return queue

    def unlisten(self, queue: asyncio.Queue[dict[str, Any]]) -> None:
        self._listeners.discard(queue)
        self._changed.set()

    def delivered_since(self, nseq: int) -> list[dict[str, Any]]:
        """Notifications kept in the inbox with ``nseq >= nseq``."""
        assert self._files is not None
        return self._files.inbox.since(nseq)

    async def _answer(self, req: int, timeout: float | None = None) -> Frame:
        future: asyncio.Future[Frame] = asyncio.get_running_loop().create_future()
        self._waiters[req] = future
        self._pump()
        try:
            if timeout is None:
                reply = await future
            else:
                reply = await asyncio.wait_for(asyncio.shield(future), timeout)
        finally:
            if self._waiters.get(req) is future:
                if not future.done():
                    future.cancel()
                del self._waiters[req]
        if isinstance(reply, Error):
            raise BrokerRefused(reply.code, reply.message)
        return reply

    @property
    def limits(self) -> list[LimitReached]:
        """The usage limits the broker told us of (``limit`` frames, issue 13)."""
        return [] if self.core is None else list(self.core.limits)

    async def subscribe(
        self, subject: str, filter: str = "", ttl: int | None = None, *, qclass: str = ""
    ) -> SubOk:
        """Subscribe (``qclass``: the queue class of its notifications, issue 13). Raises
        :class:`NotConnected`, :class:`BrokerRefused`, :class:`~mdeci.errors.FrameError`
        (bad subject)."""
        assert self.core is not None
        reply = await self._answer(
            self.core.subscribe(self.clock(), subject, filter, ttl, qclass=qclass)
        )
        if not isinstance(reply, SubOk):
            raise AgentError(f"unexpected answer {reply.op!r} to sub")
        return reply

    async def send_calendar(
        self, rules: Sequence[CalendarRule], utc_offset_minutes: int = 0
    ) -> CalendarOk:
        """Tell the broker this device's weekly channel calendar (issue 13; it decides how
        long a notification may wait for a better channel). Raises :class:`NotConnected`,
        :class:`BrokerRefused`, :class:`~mdeci.errors.FrameError` (bad rules)."""
        assert self.core is not None
        reply = await self._answer(self.core.send_calendar(self.clock(), rules, utc_offset_minutes))
        if not isinstance(reply, CalendarOk):
            raise AgentError(f"unexpected answer {reply.op!r} to calendar")
        return reply

    async def unsubscribe(self, sub_id: str) -> None:
        """Cancel ``sub_id``. Raises :class:`NotConnected`, :class:`BrokerRefused`."""
        assert self.core is not None
        await self._answer(self.core.unsubscribe(self.clock(), sub_id))

    async def list_subscriptions(self) -> tuple[SubInfo, ...]:
        """Ask the broker for our subscriptions. Raises :class:`NotConnected`."""
        assert self.core is not None
        reply = await self._answer(self.core.list(self.clock()))
        if not isinstance(reply, Subs):
            raise AgentError(f"unexpected answer {reply.op!r} to list")
        return reply.items

    async def publish(
        self,
        subject: str,
        attrs: Mapping[str, AttrValue] | None = None,
        payload: bytes = b"",
        *,
        urgent: bool = False,
        timeout: float | None = None,
    ) -> PubResult:
        """Publish: buffered durably first, then sent if CONNECTED.

        Returns within ``timeout`` (None: when the broker answered or the core gave up,
        ``response_timeout``; the local API passes ``pub_timeout``): ``published`` (the
        broker's ``pub-ok`` came), ``sent`` (no answer yet: it stays buffered until one
        comes, and is sent again after a reconnection) or ``buffered`` (DISCONNECTED).
        Raises :class:`~mdeci.errors.FrameError` for a bad subject or attributes,
        :class:`BrokerRefused` if the broker refused it, :class:`StateError`.
        """
        assert self.core is not None
        msg_id, req = self.core.publish(self.clock(), subject, attrs, payload, urgent=urgent)
        if req is not None and not self._sync_soon:
            # One fsync for the publishes of this loop turn, then they are sent.
            self._sync_soon = True
            asyncio.get_running_loop().call_soon(self._sync_outbox)
        if req is None:
            self._pump()
            self._publish_by_sms(msg_id, subject, attrs, payload, urgent)
            return PubResult(msg_id=msg_id, state="buffered")
        try:
            reply = await self._answer(req, timeout)
        except TimeoutError:
            return PubResult(msg_id=msg_id, state="sent")
        except NotConnected:
            self._publish_by_sms(msg_id, subject, attrs, payload, urgent)
            return PubResult(msg_id=msg_id, state="buffered")
        if not isinstance(reply, PubOk):
            raise AgentError(f"unexpected answer {reply.op!r} to pub")
        return PubResult(msg_id=msg_id, state="published", matched=reply.matched)

    def _publish_by_sms(
        self,
        msg_id: str,
        subject: str,
        attrs: Mapping[str, AttrValue] | None,
        payload: bytes,
        urgent: bool,
    ) -> None:
        """IP is down: an urgent publish also goes by SMS now (``[sms] publish_urgent``);
        the IP resend later carries the same ``msg_id``, which the broker takes once."""
        if urgent and self.sms is not None and self.config.sms.publish_urgent:
            frame = Pub(
                req=0,
                msg_id=msg_id,
                subject=subject,
                attrs=dict(attrs or {}),
                payload=payload,
                urgent=True,
            )
            self.sms.send_frame(encode(frame))


__all__ = ["Agent", "AgentStatus", "Invite", "PubResult", "Status"]
