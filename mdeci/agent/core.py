"""The device agent: one SIP session with the broker, frames over RUDP, durable state.

Theory of operation
-------------------
:class:`Agent` owns a :class:`sip.aio.ua.UserAgent` (REGISTER, INVITE, re-INVITE, BYE), a
:class:`rudp.aio.RudpEndpoint` with one :class:`rudp.aio.RudpPeer` (the broker, keyed by
the session key we put in our SDP offer), the state files of :mod:`mdeci.agent.state`
and an optional IP monitor. Tasks:

- the *supervisor* waits for "a connection is needed" and makes one attempt: REGISTER
  if not registered, re-INVITE the dialog (or a new INVITE with a new key when there is
  none, or the broker answered 481), point the peer at the answer's media address, then
  a ``list`` over RUDP as a probe. Success: CONNECTED (``media_connected``) and the
  outgoing buffer is flushed. Failure: wait a jittered exponential back-off
  (:class:`~mdeci.agent.backoff.Backoff`) and try again;
- the *reader* decodes frames from the peer: answers resolve the request futures by
  ``req``; a ``notify`` whose ``nseq`` the :class:`~mdeci.sms.dedupe.NseqGate` accepts
  is appended to the inbox (the applications' copy), the gate is saved atomically, the
  ``tail`` listeners get it, and only then ``ack upto`` is sent. A duplicate is acked and
  not handed over;
- the *dialog watcher* follows the UA's dialog events (a BYE from the broker ends the
  session: DISCONNECTED, reconnect);
- the *IP monitor* (if any) calls :meth:`Agent.move_to` when our address goes away.

Any ``PeerUnreachable`` while CONNECTED makes the agent DISCONNECTED
(``media_disconnected``); publishes then go to the outgoing buffer and are re-sent with
the same ``msg_id`` after the next connection (the broker dedupes by ``msg_id``).

Clocks and randomness are injected: ``clock`` (epoch seconds, for the churn log and
latencies), ``random_bytes`` (keys, ids, SIP tags) and ``jitter`` (the back-off).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import random as _random
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from mdeci.agent.backoff import Backoff
from mdeci.agent.errors import AgentError, BrokerRefused, NotConnected, StateError
from mdeci.agent.ipmonitor import AddressSource, PollingIpMonitor, make_monitor
from mdeci.agent.sms import SmsInbox, windowed_gate
from mdeci.agent.state import (
    INBOX_FILE,
    NSEQ_FILE,
    OUTBOX_FILE,
    Inbox,
    NseqState,
    Outbox,
    OutgoingPub,
)
from mdeci.churnlog import ChurnLog, Event
from mdeci.config import AgentConfig
from mdeci.errors import ChurnLogError, FrameError
from mdeci.frames import (
    Ack,
    AttrValue,
    Error,
    Frame,
    List,
    Notify,
    Pub,
    PubOk,
    Sub,
    SubInfo,
    SubOk,
    Subs,
    Unsub,
    decode,
    encode,
)
from mdeci.sms.gateway import SmsGateway
from rudp.aio import RudpEndpoint, RudpPeer
from rudp.errors import PeerUnreachable, RudpError
from sip.aio.ua import (
    DialogEnded,
    DialogRefreshed,
    IncomingRequest,
    Reply,
    UaConfig,
    UserAgent,
)
from sip.dialog import Dialog
from sip.errors import SdpError, SipError, SipRequestFailed
from sip.sdp import build_offer, parse_session
from sip.transaction import TimerConfig

KEY_BYTES = 32
RESPONSE_TIMEOUT = 10.0  # seconds to wait for a broker's answer frame
BYE_TIMEOUT = 3.0  # seconds for BYE and unREGISTER on shutdown


class Status(StrEnum):
    """The agent's view of its media session with the broker."""

    CONNECTED = "CONNECTED"
    DISCONNECTED = "DISCONNECTED"


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentStatus:
    """What ``mdeci status`` shows."""

    aor: str
    node: str
    status: Status
    sip_addr: str
    media_addr: str
    broker_media_addr: str | None
    call_id: str | None
    registered: bool
    highest_nseq: int
    buffered: int
    inbox: int
    listeners: int
    subscriptions: int
    last_error: str | None

    def to_json(self) -> dict[str, Any]:
        return {
            "aor": self.aor,
            "node": self.node,
            "status": str(self.status),
            "sip_addr": self.sip_addr,
            "media_addr": self.media_addr,
            "broker_media_addr": self.broker_media_addr,
            "call_id": self.call_id,
            "registered": self.registered,
            "highest_nseq": self.highest_nseq,
            "buffered": self.buffered,
            "inbox": self.inbox,
            "listeners": self.listeners,
            "subscriptions": self.subscriptions,
            "last_error": self.last_error,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class PubResult:
    """How a publish ended: ``published`` (the broker's ``pub-ok``) or ``buffered``."""

    msg_id: str
    state: str
    matched: int | None = None


def _hostport(addr: tuple[str, int]) -> str:
    host, port = addr
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def notification_record(n: Notify) -> dict[str, Any]:
    """The JSON object an application receives for a notification."""
    record: dict[str, Any] = {
        "nseq": n.nseq,
        "sub_id": n.sub_id,
        "subject": n.subject,
        "msg_id": n.msg_id,
        "published_at": n.published_at,
        "attrs": dict(n.attrs),
        "payload": base64.b64encode(n.payload).decode("ascii"),
        "missed": n.missed,
    }
    with contextlib.suppress(UnicodeDecodeError):
        record["text"] = n.payload.decode("utf-8")
    return record


async def _refuse(req: IncomingRequest) -> Reply:
    # The broker never calls us; an INVITE from anyone gets 488, the rest 405.
    return Reply(488 if req.request.method == "INVITE" else 405)


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
        response_timeout: float = RESPONSE_TIMEOUT,
        sms_gateway: SmsGateway | None = None,
    ) -> None:
        self.config = config
        # With [sms] enabled: the phone's SMS gateway (required then; see agent/sms.py).
        self.sms_gateway = sms_gateway
        self.sms: SmsInbox | None = None
        self.clock = clock
        self.random_bytes = random_bytes
        self.response_timeout = response_timeout
        self.backoff = Backoff(config.reconnect, jitter)
        self.address_source = address_source
        self.status_value = Status.DISCONNECTED
        self.subscriptions: tuple[SubInfo, ...] = ()
        self.last_error: str | None = None
        self.events: list[dict[str, Any]] = []  # churn records written, for tests and demo
        self._changed = asyncio.Event()
        self._need = asyncio.Event()
        self._connected = asyncio.Event()
        self._lock = asyncio.Lock()  # one SIP operation at a time (connect, move)
        self._flush_lock = asyncio.Lock()
        self._pending: dict[int, asyncio.Future[Frame]] = {}
        self._req = 0
        self._listeners: set[asyncio.Queue[dict[str, Any]]] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._reader: asyncio.Task[None] | None = None
        self._peer: RudpPeer | None = None
        self._key: bytes | None = None
        self._dialog: Dialog | None = None
        self._broker_media: tuple[str, int] | None = None
        self._version = 0
        self._rekey = False
        self._sess_id = str(int.from_bytes(random_bytes(4), "big"))
        self._user = config.aor.split(":", 1)[1].split("@", 1)[0]
        self._monitor: PollingIpMonitor | None = None
        self._closed = False
        self._outage_since: float | None = None  # when the current outage or move began
        self.churn: ChurnLog | None = None
        self.ua: UserAgent | None = None
        self.endpoint: RudpEndpoint | None = None
        self.nseq: NseqState | None = None
        self.inbox: Inbox | None = None
        self.outbox: Outbox | None = None

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Open the state files, bind SIP and RUDP, and start connecting.

        Returns once bound; the session comes up in the background (:meth:`wait_connected`).
        Raises :class:`StateError` (state files), :class:`OSError` (binding),
        :class:`~mdeci.errors.ChurnLogError`.
        """
        cfg = self.config
        try:
            cfg.state_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StateError(f"cannot create state_dir {cfg.state_dir}: {exc.strerror}") from exc
        self.inbox = Inbox(cfg.state_dir / INBOX_FILE)
        self.nseq = NseqState(cfg.state_dir / NSEQ_FILE, floor=self.inbox.last_nseq)
        self.outbox = Outbox(cfg.state_dir / OUTBOX_FILE)
        if cfg.sms.enabled:
            self.nseq.gate = windowed_gate(self.nseq.path, self.nseq.highest, cfg.sms.window)
        self.churn = ChurnLog(
            cfg.churnlog.path, cfg.node, self.clock, cfg.churnlog.max_bytes, cfg.churnlog.backups
        )
        timers = TimerConfig(t1=cfg.sip.t1, t2=cfg.sip.t2, t4=cfg.sip.t4)
        ua_config = UaConfig(
            aor=cfg.aor, password=cfg.password, timers=timers, tcp="tcp" in cfg.sip.transports
        )
        self.ua = UserAgent(ua_config, _refuse, random=self.random_bytes)
        await self.ua.start(cfg.sip.host, cfg.sip.port)
        self.endpoint = await RudpEndpoint.open(cfg.media.host, cfg.media.port, config=cfg.rudp)
        self._spawn(self._supervise())
        self._spawn(self._watch_dialogs())
        self._monitor = make_monitor(cfg.ip_monitor, cfg.sip.host, self.address_source)
        if self._monitor is not None:
            self._spawn(self._monitor.run(self._on_ip_change))
        if cfg.sms.enabled:
            if self.sms_gateway is None or cfg.msisdn is None:
                raise AgentError("[sms] enabled needs msisdn and an SMS gateway")
            self.sms = SmsInbox(
                cfg.msisdn, cfg.sms.broker_number, self.sms_gateway, self._on_sms_frame
            )
            await self.sms.start()
        self._need.set()

    async def close(self, *, clean: bool = True) -> None:
        """Stop. ``clean``: BYE the session and unREGISTER first (best effort)."""
        if self._closed:
            return
        self._closed = True
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._stop_reader()
        ua = self.ua
        if ua is not None:
            if clean:
                await self._hang_up(ua)
            await ua.close()
        self._fail_pending(NotConnected("the agent is shutting down"))
        if self.sms is not None:
            await self.sms.close()
        if self.endpoint is not None:
            await self.endpoint.close()
        for f in (self.inbox, self.outbox):
            if f is not None:
                f.close()
        if self.churn is not None:
            self.churn.close()

    async def _hang_up(self, ua: UserAgent) -> None:
        dialog = self._dialog
        if dialog is not None and dialog.id in ua.dialogs:
            with contextlib.suppress(SipError, OSError, TimeoutError):
                await asyncio.wait_for(ua.bye(dialog), BYE_TIMEOUT)
                self._log(Event.SESSION_ENDED, call_id=dialog.call_id, reason="agent shutdown")
        if ua.registered_for:
            with contextlib.suppress(SipError, OSError, TimeoutError):
                await asyncio.wait_for(ua.unregister(), BYE_TIMEOUT)
                self._log(Event.UNREGISTERED, addr=_hostport(ua.local_addr))

    def _spawn(self, coro: Any) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # ------------------------------------------------------------------ observing

    @property
    def connected(self) -> bool:
        return self.status_value is Status.CONNECTED

    async def wait_connected(self) -> None:
        """Return once the session is CONNECTED."""
        await self._connected.wait()

    async def wait_event(self, event: str, count: int = 1, **match: object) -> dict[str, Any]:
        """The ``count``-th churn record named ``event`` (whose fields equal ``match``)."""
        while True:
            found = [
                r
                for r in self.events
                if r["event"] == event and all(r.get(k) == v for k, v in match.items())
            ]
            if len(found) >= count:
                return found[count - 1]
            self._changed.clear()
            await self._changed.wait()

    async def wait_until(self, predicate: Callable[[], bool]) -> None:
        """Return once ``predicate()`` holds; checked after each churn event or pub-ok."""
        while not predicate():
            self._changed.clear()
            await self._changed.wait()

    def status(self) -> AgentStatus:
        """A snapshot for ``mdeci status``."""
        assert self.ua is not None and self.endpoint is not None
        assert self.nseq is not None and self.outbox is not None and self.inbox is not None
        return AgentStatus(
            aor=self.config.aor,
            node=self.config.node,
            status=self.status_value,
            sip_addr=_hostport(self.ua.local_addr),
            media_addr=_hostport(self.endpoint.local_addr),
            broker_media_addr=None if self._broker_media is None else _hostport(self._broker_media),
            call_id=None if self._dialog is None else self._dialog.call_id,
            registered=self.ua.registered_for > 0,
            highest_nseq=self.nseq.highest,
            buffered=len(self.outbox),
            inbox=len(self.inbox.records),
            listeners=len(self._listeners),
            subscriptions=len(self.subscriptions),
            last_error=self.last_error,
        )

    def _restore_latency(self) -> dict[str, float]:
        """``latency_ms`` for a restore event: time since the outage or move began."""
        since, self._outage_since = self._outage_since, None
        return {} if since is None else {"latency_ms": round((self.clock() - since) * 1000, 3)}

    def _log(self, event: Event, **fields: Any) -> None:
        record: dict[str, Any] = {"event": str(event), "uri": self.config.aor, **fields}
        if self.churn is not None:
            try:
                record = self.churn.write(event, uri=self.config.aor, **fields)
            except ChurnLogError as exc:
                self.last_error = str(exc)
        self.events.append(record)
        self._changed.set()

    # ------------------------------------------------------------------ applications

    def listen(self) -> asyncio.Queue[dict[str, Any]]:
        """A queue that receives every notification handed over from now on."""
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._listeners.add(queue)
        return queue

    def unlisten(self, queue: asyncio.Queue[dict[str, Any]]) -> None:
        self._listeners.discard(queue)

    def delivered_since(self, nseq: int) -> list[dict[str, Any]]:
        """Notifications kept in the inbox with ``nseq >= nseq``."""
        assert self.inbox is not None
        return self.inbox.since(nseq)

    async def subscribe(self, subject: str, filter: str = "", ttl: int | None = None) -> SubOk:
        """Subscribe. Raises :class:`NotConnected`, :class:`BrokerRefused`,
        :class:`~mdeci.errors.FrameError` (bad subject)."""
        reply = await self._request(
            Sub(req=self._next_req(), subject=subject, filter=filter, ttl=ttl)
        )
        if not isinstance(reply, SubOk):
            raise AgentError(f"unexpected answer {reply.op!r} to sub")
        with contextlib.suppress(AgentError):
            await self.list_subscriptions()
        return reply

    async def unsubscribe(self, sub_id: str) -> None:
        """Cancel ``sub_id``. Raises :class:`NotConnected`, :class:`BrokerRefused`."""
        await self._request(Unsub(req=self._next_req(), sub_id=sub_id))
        self.subscriptions = tuple(s for s in self.subscriptions if s.sub_id != sub_id)

    async def list_subscriptions(self) -> tuple[SubInfo, ...]:
        """Ask the broker for our subscriptions. Raises :class:`NotConnected`."""
        reply = await self._request(List(req=self._next_req()))
        if not isinstance(reply, Subs):
            raise AgentError(f"unexpected answer {reply.op!r} to list")
        self.subscriptions = reply.items
        return reply.items

    async def publish(
        self,
        subject: str,
        attrs: Mapping[str, AttrValue] | None = None,
        payload: bytes = b"",
        *,
        urgent: bool = False,
    ) -> PubResult:
        """Publish: buffered durably first, then sent if CONNECTED.

        Returns once the broker's ``pub-ok`` came (``published``) or the publish stays in
        the buffer (``buffered``: DISCONNECTED, or the send failed). Raises
        :class:`~mdeci.errors.FrameError` for a bad subject or attributes,
        :class:`BrokerRefused` if the broker refused it, :class:`StateError`.
        """
        assert self.outbox is not None
        msg_id = self.random_bytes(16).hex()
        frame = Pub(
            req=0,
            msg_id=msg_id,
            subject=subject,
            attrs=dict(attrs or {}),
            payload=payload,
            urgent=urgent,
        )  # validates before anything is stored
        pub = OutgoingPub(
            msg_id=msg_id, subject=subject, attrs=frame.attrs, payload=payload, urgent=urgent
        )
        self.outbox.add(pub)
        if not self.connected:
            return PubResult(msg_id=msg_id, state="buffered")
        try:
            matched = await self._send_pub(pub)
        except NotConnected:
            return PubResult(msg_id=msg_id, state="buffered")
        return PubResult(msg_id=msg_id, state="published", matched=matched)

    async def _send_pub(self, pub: OutgoingPub) -> int:
        assert self.outbox is not None
        try:
            reply = await self._request(
                Pub(
                    req=self._next_req(),
                    msg_id=pub.msg_id,
                    subject=pub.subject,
                    attrs=pub.attrs,
                    payload=pub.payload,
                    urgent=pub.urgent,
                )
            )
        except BrokerRefused as exc:
            if exc.code < 500:
                self.outbox.done(pub.msg_id)  # it will never be accepted: do not resend
            raise
        if not isinstance(reply, PubOk):
            raise AgentError(f"unexpected answer {reply.op!r} to pub")
        self.outbox.done(pub.msg_id)
        self._changed.set()
        return reply.matched

    async def _flush(self) -> None:
        """Re-send the buffered publishes, oldest first, with their msg_id."""
        assert self.outbox is not None
        async with self._flush_lock:
            for pub in self.outbox.pending():
                if not self.connected:
                    return
                if pub.msg_id not in self.outbox:
                    continue
                try:
                    await self._send_pub(pub)
                except NotConnected:
                    return
                except AgentError as exc:
                    self.last_error = str(exc)

    # ------------------------------------------------------------------ frames

    def _next_req(self) -> int:
        self._req += 1
        return self._req

    async def _request(self, frame: Sub | Unsub | List | Pub, *, probe: bool = False) -> Frame:
        if not probe and not self.connected:
            raise NotConnected("not connected to the broker (requests are refused)")
        future: asyncio.Future[Frame] = asyncio.get_running_loop().create_future()
        self._pending[frame.req] = future
        try:
            await self._send(encode(frame))
            try:
                reply = await asyncio.wait_for(asyncio.shield(future), self.response_timeout)
            except TimeoutError:
                raise NotConnected(f"no answer from the broker to {frame.op}") from None
        finally:
            self._pending.pop(frame.req, None)
            if future.done() and not future.cancelled():
                future.exception()  # retrieved: a failure was already raised as NotConnected
        if isinstance(reply, Error):
            raise BrokerRefused(reply.code, reply.message)
        return reply

    async def _send(self, data: bytes) -> None:
        peer = self._peer
        if peer is None:
            raise NotConnected("no media session with the broker")
        try:
            await peer.send(data)
        except PeerUnreachable as exc:
            self._lost(f"rudp: {exc.reason}")
            raise NotConnected(f"the broker is unreachable ({exc.reason})") from None

    def _fail_pending(self, exc: Exception) -> None:
        for future in self._pending.values():
            if not future.done():
                future.set_exception(exc)
        self._pending.clear()

    async def _read(self, peer: RudpPeer) -> None:
        while True:
            data = await peer.receive()
            try:
                frame = decode(data)
            except FrameError:
                continue  # a malformed frame from the broker is dropped
            if isinstance(frame, Notify):
                self._on_notify(frame)
            elif isinstance(frame, SubOk | Subs | PubOk | Error):
                req = frame.req
                future = self._pending.get(req) if req is not None else None
                if future is not None and not future.done():
                    future.set_result(frame)

    def _on_sms_frame(self, data: bytes) -> None:
        try:
            frame = decode(data)
        except FrameError:
            return
        nseq = frame.nseq if isinstance(frame, Notify) else None
        self._log(Event.SMS_RECEIVED, nseq=nseq, channel="sms", bytes=len(data))
        if isinstance(frame, Notify):
            # The SMS link acknowledged the buffer already; no `ack` frame by SMS.
            self._on_notify(frame, channel="sms")

    def _on_notify(self, n: Notify, channel: str = "ip") -> None:
        assert self.nseq is not None and self.inbox is not None
        if self.nseq.gate.accept(n.nseq):
            record = notification_record(n)
            try:
                self.inbox.append(record)  # the applications have it...
                self.nseq.save()  # ...and it is never handed over again
            except StateError as exc:
                # Not durable: do not ack, the broker sends it again.
                self.last_error = str(exc)
                return
            for queue in list(self._listeners):
                queue.put_nowait(record)
            latency = max(0.0, (self.clock() - n.published_at) * 1000.0)
            self._log(Event.NOTIFY_DELIVERED, nseq=n.nseq, channel=channel, latency_ms=latency)
        if channel == "ip":
            # Up to this nseq, not the gate's highest: IP delivers in nseq order, but the
            # highest may have come by SMS while older notifications still wait for IP,
            # and the broker's ack is cumulative.
            self._spawn(self._ack(n.nseq))

    async def _ack(self, upto: int) -> None:
        with contextlib.suppress(NotConnected):
            await self._send(encode(Ack(upto=upto)))

    # ------------------------------------------------------------------ connection

    def _lost(self, reason: str) -> None:
        if self.status_value is not Status.CONNECTED or self._closed:
            return
        self.status_value = Status.DISCONNECTED
        self._connected.clear()
        self.last_error = reason
        self._rekey = True
        self._outage_since = self.clock()
        self._log(Event.MEDIA_DISCONNECTED, reason=reason, channel="ip")
        self._fail_pending(NotConnected(reason))
        self._need.set()

    async def _supervise(self) -> None:
        while True:
            await self._need.wait()
            self._need.clear()
            try:
                await self._connect()
            except (SipError, SdpError, OSError, RudpError, AgentError, FrameError) as exc:
                self.last_error = f"connect: {exc}"
                self._need.set()
                await asyncio.sleep(self.backoff.next_delay())
                continue
            self.backoff.reset()

    def _offer(self, host: str, port: int) -> bytes:
        assert self._key is not None
        self._version += 1
        return build_offer(
            self._user, self._sess_id, self._version, host, port, self._key, self.config.msisdn
        ).encode()

    async def _connect(self) -> None:
        ua, endpoint = self.ua, self.endpoint
        assert ua is not None and endpoint is not None
        cfg = self.config
        async with self._lock:
            if ua.registered_for == 0:
                registrar = (cfg.registrar.address.host, cfg.registrar.address.port)
                await ua.register(registrar, cfg.registrar.expires)
                self._log(Event.REGISTERED, addr=_hostport(ua.local_addr))
            host, port = endpoint.local_addr
            answer: bytes | None = None
            dialog = self._dialog
            event = Event.SESSION_REINVITED
            if dialog is not None and dialog.id in ua.dialogs and self._key is not None:
                if self._rekey:
                    # The media failed: a restarted broker may hold our old key with a new
                    # RUDP incarnation we would refuse (docs/rudp.md §2 step 6); a new key
                    # gives both sides a fresh association.
                    self._new_key()
                try:
                    answer = (await ua.reinvite(dialog, self._offer(host, port))).body
                except SipRequestFailed as exc:
                    if exc.status not in (408, 481):
                        raise
                    # §12.2.1.2: 481 and 408 end the dialog; start a new session.
                    ua.dialogs.pop(dialog.id, None)
                    self._dialog = None
                    if exc.status == 408:
                        raise
            if answer is None:
                event = Event.SESSION_STARTED
                self._new_key()
                broker = (cfg.broker.address.host, cfg.broker.address.port)
                self._dialog, response = await ua.invite(
                    cfg.broker.aor, broker, self._offer(host, port)
                )
                answer = response.body
            media = parse_session(answer)
            self._rekey = False
            self._attach((media.addr, media.port))
            assert self._dialog is not None
            self._log(event, call_id=self._dialog.call_id, addr=_hostport((host, port)))
            # The probe: a `list` over RUDP proves the media path both ways.
            reply = await self._request(List(req=self._next_req()), probe=True)
            if isinstance(reply, Subs):
                self.subscriptions = reply.items
            self.status_value = Status.CONNECTED
            self._connected.set()
            self._log(
                Event.MEDIA_CONNECTED,
                call_id=self._dialog.call_id,
                addr=_hostport((host, port)),
                channel="ip",
                **self._restore_latency(),
            )
        self._spawn(self._flush())

    def _new_key(self) -> None:
        assert self.endpoint is not None
        self._stop_reader()
        if self._key is not None:
            self.endpoint.remove_peer(self._key)
        self._key = self.random_bytes(KEY_BYTES)
        self._peer = None

    def _attach(self, media: tuple[str, int]) -> None:
        assert self.endpoint is not None and self._key is not None
        self._broker_media = media
        peer = self._peer
        if peer is None:
            peer = self.endpoint.peer(self._key, media)
            self._peer = peer
            peer.on_disconnected = lambda exc: self._lost(f"rudp: {exc.reason}")
            self._reader = asyncio.create_task(self._read(peer))
        peer.set_address(media)
        if not peer.connected:
            peer.reset()

    def _stop_reader(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            self._reader = None

    async def _watch_dialogs(self) -> None:
        assert self.ua is not None
        while True:
            event = await self.ua.events.get()
            dialog = self._dialog
            if dialog is None or event.dialog.id != dialog.id:
                continue
            if isinstance(event, DialogEnded) and event.reason == "bye received":
                self._log(Event.SESSION_ENDED, call_id=dialog.call_id, reason="bye from broker")
                self._dialog = None
                if self.connected:
                    self._lost("session ended by the broker")
                else:
                    self._need.set()
            elif isinstance(event, DialogRefreshed) and event.body:
                with contextlib.suppress(SdpError):
                    media = parse_session(event.body)
                    if media.key is None:  # an answer: the broker's media address
                        self._attach((media.addr, media.port))

    # ------------------------------------------------------------------ mobility

    async def _on_ip_change(self, host: str) -> None:
        with contextlib.suppress(SipError, OSError, AgentError):
            await self.move_to(host)

    async def move_to(self, host: str) -> None:
        """Move SIP and RUDP to ``host``: rebind RUDP, then ``UserAgent.move`` (REGISTER
        + re-INVITE with a new offer). Logs ``ip_changed``. A failed re-INVITE makes the
        agent DISCONNECTED and the supervisor retries.

        Raises :class:`OSError` when ``host`` cannot be bound.
        """
        ua, endpoint = self.ua, self.endpoint
        assert ua is not None and endpoint is not None
        async with self._lock:
            moved_at = self.clock()
            prev_sip = ua.local_addr
            _, media_port = endpoint.local_addr
            try:
                await endpoint.rebind(host, media_port)
            except OSError:
                await endpoint.rebind(host, 0)
            new_media = endpoint.local_addr
            if self._monitor is not None:
                self._monitor.set_host(host)
            has_session = (
                self._dialog is not None and self._dialog.id in ua.dialogs and self._key is not None
            )
            offer = self._offer(*new_media) if has_session else None
            try:
                await ua.move(host, 0, reinvite_body=(lambda _d: offer) if offer else None)
            except (SipError, OSError) as exc:
                self._log(
                    Event.IP_CHANGED, addr=_hostport(ua.local_addr), prev_addr=_hostport(prev_sip)
                )
                self._lost(f"re-INVITE after move: {exc}")
                self._need.set()
                return
            self._log(
                Event.IP_CHANGED, addr=_hostport(ua.local_addr), prev_addr=_hostport(prev_sip)
            )
            if ua.registered_for:
                self._log(Event.REGISTERED, addr=_hostport(ua.local_addr))
            if has_session and self._dialog is not None:
                self._log(
                    Event.SESSION_REINVITED,
                    call_id=self._dialog.call_id,
                    addr=_hostport(new_media),
                )
                # §2: the completed re-INVITE makes the media CONNECTED again; its latency
                # (move start to re-INVITE done) is the restore time the analytics read.
                if self.status_value is Status.CONNECTED:
                    self._outage_since = self._outage_since or moved_at
                    self._log(
                        Event.MEDIA_CONNECTED,
                        call_id=self._dialog.call_id,
                        addr=_hostport(new_media),
                        channel="ip",
                        **self._restore_latency(),
                    )
            else:
                self._need.set()
