"""SMS side of the broker: channel selection beyond IP for the classes that may use SMS.

Here the channels are IP (whatever access network carries it) and SMS. Which access
network a notification waits for (Wi-Fi rather than cellular) is decided on the IP path
(:mod:`mdeci.broker.network_holds`, docs/channels.md "Networks as channels").

Theory of operation (docs/protocol.md §7, docs/channels.md "Broker integration")
----------------------------------------------------------------------------
:class:`SmsFallback` is asked to look at a user (:meth:`SmsFallback.kick`) when
something was queued for it (whether its IP channel is up or not), when its session
became DISCONNECTED, when its device sent a new calendar, at a held decision's deadline,
and at start for every session stored DISCONNECTED. Only users with an MSISDN in the
operator's records (``[[auth.users]] msisdn``) are looked at: a number announced in SDP
is the device's claim, and SMS to it would be paid by the operator. Only the rows of a
class that may use SMS are read (``[[channels.classes]]`` whose channels name ``sms``;
when only the urgent class does, the rows the publish marked urgent). Each is encoded
as the same ``notify`` frame IP would carry and offered to the channel selector
(:func:`mdeci.channels.select`) with the user's policy (the IP and SMS channels with
their live latency and reliability, the classes, the limits of ``[channels]`` and
``[sms]``, the device's calendar); IP is available while the session is CONNECTED, SMS
unless a global limit stops it:

- ``SendNow`` on SMS: the frame goes to the user's number through one
  :class:`~mdeci.sms.link.SmsLink` buffer (TTL: what is left of ``[sms] ttl`` since
  publication), the usage is counted (limits), ``sms_sent`` is logged with the frame's
  ``bytes`` and its ``cost``;
- ``SendNow`` on IP: nothing to do, the IP path carries every queued notification in
  order (a limit that kept SMS from scoring best is told to the device);
- ``NoChannel`` (e.g. the user's monthly SMS limit): logged once per notification as
  ``notify_queued`` with ``channel = "sms"`` and the limit as ``reason``; it waits in the
  queue for IP;
- ``Hold``: looked at again at its deadline.

Acknowledgement mapping. The agent's SMS link acknowledges a buffer once it has
reassembled it intact; the agent hands the frame to the same ``nseq`` gate as IP. On that
buffer ack the broker deletes exactly that notification from the queue
(:func:`mdeci.store.usage.remove_delivered`, not the cumulative ``ack``: older
non-urgent ones still wait for IP) and logs ``notify_delivered`` with ``channel = "sms"``.
A buffer whose TTL ends unacknowledged is reported undeliverable (``notify_dropped``) and
deleted as well. When IP comes back (:meth:`SmsFallback.ip_back`: the service calls it
once a datagram sent over the new connection was acknowledged, not at the re-INVITE,
which proves only SIP) every buffer of the user still in flight is cancelled; those
notifications are still queued and the IP flush sends them; if an SMS copy got there
first, the agent's gate refuses the IP copy (and still acks it), so nothing reaches the
application twice.

Threads. Like the core, every store call of this side runs on the service's database
thread (:class:`~mdeci.broker.worker.DbWorker`), never on the event loop, so a hung
database cannot stall SIP and RUDP. A look at a user is split in two:

- *plan*, on the database thread: read the session and the queued rows, run the
  selector (the usage sums, the calendar and the subscriptions' classes live there),
  count the usage of each SMS it decides to send, delete rows whose TTL ended; the
  answer is a :class:`~mdeci.broker.sms_plan.Plan`, a list of steps
  (:mod:`mdeci.broker.sms_plan`);
- *act*, on the loop: hand the frames to the SMS link, log, arm retry timers, tell the
  device of limits (the link, the timers and the log are the loop's).

At most one look per user runs at a time; a kick meanwhile runs one more look after it,
so a plan always knows which notifications are on their way. A plan that comes back
after IP returned or the calendar changed is stale: only its deletions are reported
(the usage it counted for SMS it then does not send stays counted; usage only grows,
and the window is one database round trip).

State. A user's SMS fields (buffers in flight by nseq, holds logged, the highest nseq
decided, the plan epoch, the look running, the retry armed, limits told and waiting
for IP, the RUDP counters last seen) are the Session Manager's
(:mod:`mdeci.broker.sms_sessions`, ``sessions.sms``): this side reports to it and
carries out its commands (start a look, arm or cancel a retry, cancel buffers, tell
later). It keeps only what those commands drive (the looks' tasks, the retries' timer
handles), the link's buffers by buffer id, the configuration, and its policy caches.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date

from mdeci.broker.errors import BrokerError
from mdeci.broker.sessions import SessionManager
from mdeci.broker.sink import ChurnSink
from mdeci.broker.sms_plan import (
    Dropped,
    IpSide,
    Limit,
    Look,
    Note,
    Plan,
    Send,
    SmsPlanner,
)
from mdeci.broker.sms_policy import (
    IP_CHANNEL,
    SMS_CHANNEL,
    link_config,
    make_gateway,
    sms_policy,
)
from mdeci.broker.sms_sessions import (
    ArmRetry,
    CancelBuffers,
    CancelRetry,
    SmsCommand,
    StartLook,
    TellLater,
)
from mdeci.broker.worker import DbWorker
from mdeci.channels import (
    CachedUsage,
    Period,
    SelectorPolicy,
    UsageCounter,
    period_days,
)
from mdeci.channels.config import ChannelsConfig
from mdeci.channels.live import Figures, LiveFigures
from mdeci.config import BrokerSmsConfig
from mdeci.errors import FrameError
from mdeci.frames import Ack, LimitReached, Pub, decode, encode
from mdeci.sms.auth import CounterStore, KeyRing, MemoryCounters, Role, SmsAuth, SmsKeys
from mdeci.sms.errors import SmsError
from mdeci.sms.gateway import LinkRunner, SmsGateway
from mdeci.sms.link import (
    BufferAcknowledged,
    BufferExpired,
    FrameReceived,
    LinkEvent,
    SmsLink,
    SmsRefused,
)
from mdeci.store.errors import StoreError
from mdeci.store.repo import BrokerStore
from mdeci.store.sessions import SessionStatus
from mdeci.store.usage import SqlUsage, remove_delivered

log = logging.getLogger(__name__)

_EPOCH_DATE = date(1970, 1, 1)
RECENT_MO = 64


def sms_ha1s(store: BrokerStore, numbers: dict[str, str]) -> dict[str, str]:
    """Number to SHA-256 HA1 of each user (URI to number) in the store (database thread).

    Raises StoreError.
    """
    out = {}
    for uri, number in numbers.items():
        user = store.users.get_user(uri)
        if user is not None:
            ha1 = store.users.get_credentials(user.username, user.realm, "SHA-256")
            if ha1:
                out[number] = ha1
    return out


@dataclass(frozen=True, slots=True)
class _InFlight:
    uri: str
    nseq: int
    published_at: float


def _quantum(value: float) -> float:
    """Two significant figures: live figures move a cached policy only when they move."""
    return float(f"{value:.2g}")


class SmsFallback:
    """The broker's channel selection and SMS side; :meth:`start`, then :meth:`close`.

    ``clock`` is the broker's (epoch seconds: TTLs, limits' calendar periods, latencies);
    the link's retransmission timers run on the event loop's clock. ``ip`` (the service,
    bound once through :class:`IpSide`) sends a frame to a user over IP and says whether
    it could; ``worker`` (set by the service) is its database thread, where every store
    call of this side runs.
    """

    def __init__(
        self,
        store: BrokerStore,
        config: BrokerSmsConfig,
        gateway: SmsGateway,
        log_sink: ChurnSink,
        clock: Callable[[], float],
        *,
        usage: UsageCounter | None = None,
        channels: ChannelsConfig | None = None,
        default_msisdns: dict[str, str] | None = None,
        counters: CounterStore | None = None,
    ) -> None:
        self.store = store
        self.config = config
        self.channels = channels if channels is not None else ChannelsConfig()
        self.clock = clock
        self.log = log_sink
        # Period sums read once from SQL, then kept exact by record_send (one broker per
        # database): the selector adds microseconds, not a query per limit.
        self.usage: UsageCounter = (
            usage if usage is not None else CachedUsage(SqlUsage(store.engine))
        )
        self.link_config = link_config(config)
        self.live = LiveFigures(
            {
                IP_CHANNEL: Figures(self.channels.ip.latency_ms, self.channels.ip.coverage),
                SMS_CHANNEL: Figures(config.latency_ms, 1.0),
            },
            alpha=self.channels.alpha,
        )
        self.planner = SmsPlanner(store, config, self.channels, self.usage)
        self._policies: dict[str, tuple[tuple[float, ...], SelectorPolicy]] = {}
        # SMS keys of the users with a number, from their HA1 (filled at start); replay
        # counters in ``counters`` (the service's data_dir file; memory in tests).
        self.keys = KeyRing(Role.BROKER)
        self._keying: set[str] = set()  # numbers whose HA1 is being read
        self._key_tasks: set[asyncio.Task[None]] = set()
        auth = SmsAuth(
            self._key_of, counters if counters is not None else MemoryCounters(), clock=clock
        )
        self.link = SmsLink(config.number, self.link_config, auth=auth)
        self.runner = LinkRunner(self.link, gateway, self._on_event, on_refused=self._refused)
        self.ip: IpSide | None = None  # the service, once it bound this side (bind)
        self.worker: DbWorker | None = None
        self._defaults = dict(default_msisdns or {})
        self._uri_by_number = {number: uri for uri, number in self._defaults.items()}
        # Each user's SMS fields are the Session Manager's (the service's once bound; a
        # manager of its own while this side is used alone). Kept here: the link's
        # buffers in flight (by buffer id), and the I/O handles its commands drive.
        self.sessions = SessionManager()
        self._buffers: dict[int, _InFlight] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}  # ArmRetry / CancelRetry
        self._looks: set[asyncio.Task[None]] = set()  # StartLook (one per user at a time)
        # The latest MO frames (sender, frame), for tests and debugging: bounded, since
        # anybody can send SMS to the broker's number.
        self.received: deque[tuple[str, bytes]] = deque(maxlen=RECENT_MO)
        self.errors = 0
        self._started = False
        # Only the classes that may use SMS are looked at; rows carry only "urgent".
        urgent = self.channels.class_config(self.channels.urgent_class)
        self._urgent_sms = urgent is not None and SMS_CHANNEL in urgent.channels

    def bind(self, ip: IpSide) -> None:
        """Work with ``ip``, the service (before :meth:`start`): its database thread
        becomes this side's."""
        self.ip = ip
        self.worker = ip.worker
        self.sessions = ip.sessions
        self.planner.ip = ip

    def _connected(self, uri: str) -> bool:
        return self.ip is not None and self.ip.is_connected(uri)

    async def start(self) -> None:
        """Start the gateway, then look at every user of this broker stored DISCONNECTED.

        Raises :class:`BrokerError` when no service gave it its database thread.
        """
        if self.worker is None:
            raise BrokerError("the SMS side needs a broker service's database thread")
        await self.load_keys()
        await self.runner.start()
        self._started = True
        try:
            away = await self.worker.run(
                self.store.sessions.owned_sessions, SessionStatus.DISCONNECTED, self.store.node
            )
        except StoreError as exc:
            self.errors += 1  # they are looked at again when something is queued for them
            log.warning("channel selection at start: %s", exc)
            return
        for rec, _ in away:  # this broker's (another's users are its own to look at)
            self.kick(rec.uri)

    async def close(self) -> None:
        self._started = False
        for uri, timer in self._timers.items():
            timer.cancel()
            self.sessions.sms.retry_dropped(uri)
        self._timers.clear()
        looks = [*self._looks, *self._key_tasks]
        for task in looks:
            task.cancel()
        await asyncio.gather(*looks, return_exceptions=True)
        await self.runner.close()

    # ------------------------------------------------------------------ the service's calls

    def in_flight(self, uri: str) -> tuple[int, ...]:
        """nseqs of ``uri`` on their way by SMS (not yet acknowledged or expired)."""
        return self.sessions.sms.in_flight(uri)

    def policy(self, uri: str) -> SelectorPolicy:
        """``uri``'s selector policy with its live figures (rebuilt when they move)."""
        ip, sms = self.live.get(uri, IP_CHANNEL), self.live.get(uri, SMS_CHANNEL)
        key = (
            _quantum(ip.latency_ms),
            _quantum(ip.coverage),
            _quantum(sms.latency_ms),
            _quantum(sms.coverage),
        )
        cached = self._policies.get(uri)
        if cached is not None and cached[0] == key:
            return cached[1]
        policy = sms_policy(
            self.config,
            self.link_config,
            self.channels,
            user=uri,
            ip=Figures(key[0], key[1]),
            sms=Figures(key[2], key[3]),
        )
        self._policies[uri] = (key, policy)
        return policy

    def observe_ip(self, uri: str, rtt_ms: float | None, sent: int, retransmitted: int) -> None:
        """The user's RUDP figures now: smoothed RTT and its packet counters so far (the
        share of packets sent since the last call that needed no retransmission is one
        reliability sample)."""
        if rtt_ms is not None and rtt_ms > 0:
            self.live.latency(uri, IP_CHANNEL, rtt_ms)
        sample = self.sessions.sms.ip_sample(uri, sent, retransmitted)
        if sample is not None:
            self.live.delivered(uri, IP_CHANNEL, sample, weight=1.0)

    def kick(self, uri: str, *, connected: bool = False) -> None:
        """Decide for ``uri``'s queued notifications not decided yet (see the module
        docstring); ``connected``: its IP channel is up."""
        if not self._started:
            return
        msisdn = self._msisdn(uri)
        if msisdn is None or not (self._urgent_sms or self.planner.normal_sms):
            return  # IP only: the IP path delivers in order when it is up
        self._run(self.sessions.sms.kicked(uri, connected=connected), msisdn)

    async def idle(self) -> None:
        """Return once no look at any user is running (for tests and shutdown)."""
        while self._looks:
            await asyncio.gather(*self._looks, return_exceptions=True)

    def calendar_changed(self, uri: str) -> None:
        """``uri``'s device sent a new calendar: forget the old one and decide again for
        what is held or refused."""
        if self.worker is not None:
            # The cache is the database thread's; queued before the look below.
            self.worker.post("sms calendar", self.planner.forget_calendar, uri)
        self._run(self.sessions.sms.calendar_changed(uri))
        self.kick(uri, connected=self._connected(uri))

    def ip_back(self, uri: str) -> None:
        """``uri`` is CONNECTED again and IP proved to work: stop its SMS buffers; IP
        delivers what is queued; tell it the limits it reached meanwhile (the Session
        Manager's :class:`~mdeci.broker.sessions.SmsStop`)."""
        self._run(self.sessions.sms.ip_back(uri))

    def _run(self, commands: list[SmsCommand], msisdn: str = "") -> None:
        """Carry out the Session Manager's SMS commands, in order."""
        for command in commands:
            if isinstance(command, StartLook):
                task = asyncio.create_task(self._look(command.uri, msisdn, command.connected))
                self._looks.add(task)  # the loop keeps only a weak reference
                task.add_done_callback(self._looks.discard)
            elif isinstance(command, ArmRetry):
                self._arm(command.uri, command.delay)
            elif isinstance(command, CancelRetry):
                timer = self._timers.pop(command.uri, None)
                if timer is not None:
                    timer.cancel()
            elif isinstance(command, CancelBuffers):
                for buffer_id in command.buffer_ids:
                    self.link.cancel(buffer_id)
                    self._buffers.pop(buffer_id, None)
                if self._started:
                    self.runner.poke()
            elif isinstance(command, TellLater):
                # After the service marked it CONNECTED (it calls us first).
                frames = list(command.frames)
                asyncio.get_running_loop().call_soon(self._tell_all, command.uri, frames)

    # ------------------------------------------------------------------ internals

    def _msisdn(self, uri: str) -> str | None:
        # From the operator's user records only: a device cannot make the broker pay
        # for SMS to a number of its choosing (the SDP's a=mdeci-msisdn is ignored).
        return self._defaults.get(uri)

    async def _look(self, uri: str, msisdn: str, connected: bool) -> None:
        """Plan on the database thread, act on the loop; again while kicked meanwhile."""
        assert self.worker is not None  # start() checked
        sms = self.sessions.sms
        next_connected: bool | None = connected
        try:
            if self.keys.get(msisdn) is None:
                await self._load_keys({uri: msisdn})
            while self._started and next_connected is not None:
                connected = next_connected
                start = sms.look_from(uri, connected=connected)
                look = Look(
                    uri=uri,
                    msisdn=msisdn,
                    connected=connected,
                    after=start.after,
                    flying=start.flying,
                    policy=self.policy(uri),
                    now=self.clock(),
                )
                try:
                    plan = await self.worker.run(self.planner.plan, look)
                except StoreError as exc:
                    self.errors += 1  # retried at the next kick (publish, disconnection, start)
                    log.warning("channel selection for %s: %s", uri, exc)
                    plan = None
                if plan is not None:
                    stale = sms.planned(uri, start.epoch, connected=connected, decided=plan.decided)
                    self._act(look, plan, stale=stale)
                next_connected = sms.look_again(uri)
        finally:
            sms.look_ended(uri)

    def _act(self, look: Look, plan: Plan, *, stale: bool) -> None:
        """Carry ``plan`` out on the loop (a stale one: only its deletions are logged)."""
        uri = look.uri
        for step in plan.steps:
            if isinstance(step, Dropped):
                self.log.emit(
                    "notify_dropped", uri, nseq=step.nseq, channel=SMS_CHANNEL, reason="ttl ended"
                )
            elif stale or not self._started:
                continue
            elif isinstance(step, Send):
                self._send(look, step)
            elif isinstance(step, Note):
                self._note(uri, step.nseq, step.reason)
            elif isinstance(step, Limit):
                self._limit_reached(uri, step.channel, step.limit, step.qclass, look.now)
            else:
                self._run(self.sessions.sms.retry(uri, step.delay))

    def _send(self, look: Look, step: Send) -> None:
        try:
            buffer_id = self.runner.send_frame(look.msisdn, step.frame, ttl=step.ttl)
        except SmsError as exc:  # no SMS keys for the number, no counter recorded, ...
            self.errors += 1
            log.warning("SMS to %s for %s not sent: %s", look.msisdn, look.uri, exc)
            return
        self._buffers[buffer_id] = _InFlight(look.uri, step.nseq, step.published_at)
        self.sessions.sms.sent(look.uri, step.nseq, buffer_id)
        how = "both: sms beats ip" if look.connected else "ip down"
        self.log.emit(
            "sms_sent",
            look.uri,
            nseq=step.nseq,
            channel=SMS_CHANNEL,
            bytes=len(step.frame),
            cost=step.cost,
            reason=f"to {look.msisdn} ({how}, class {step.qclass})",
        )

    def _note(self, uri: str, nseq: int, reason: str) -> None:
        if not self.sessions.sms.noted(uri, nseq):
            return
        self.log.emit("notify_queued", uri, nseq=nseq, channel=SMS_CHANNEL, reason=reason)
        log.info("notification %d of %s: %s", nseq, uri, reason)

    def _limit_reached(self, uri: str, channel: str, limit: str, qclass: str, now: float) -> None:
        """Tell the device (once per limit and period) that ``limit`` stops ``channel``."""
        period = next(
            (p for p in Period if limit.removeprefix("global ").startswith(p.value)), None
        )
        end = period_days(period, now)[1] if period is not None else None
        until = (end - _EPOCH_DATE).days * 86400.0 if end is not None else now
        if not self.sessions.sms.told(uri, limit, until):
            return
        log.warning("limit reached for %s on %s (class %s): %s", uri, channel, qclass, limit)
        frame = encode(LimitReached(channel=channel, limit=limit, qclass=qclass, until=until))
        self._tell_all(uri, [frame])

    def _tell_all(self, uri: str, frames: list[bytes]) -> None:
        for i, frame in enumerate(frames):
            if self.ip is None or not self.ip.tell(uri, frame):
                self.sessions.sms.untold(uri, frames[i:])
                return

    def _arm(self, uri: str, delay: float) -> None:
        def again() -> None:
            self._timers.pop(uri, None)
            self.sessions.sms.retry_due(uri)
            self.kick(uri, connected=self._connected(uri))

        self._timers[uri] = asyncio.get_running_loop().call_later(delay, again)

    def _on_event(self, event: LinkEvent) -> None:
        if isinstance(event, FrameReceived):
            self._on_mo(event.sender, event.frame)
            return
        flight = self._buffers.pop(event.buffer_id, None)
        if flight is None:
            return
        self.sessions.sms.buffer_done(flight.uri, flight.nseq)
        if self.worker is not None:
            # On the database thread, before any later plan; if it fails the row stays
            # queued (logged): IP delivers it again later and the agent's gate refuses it.
            self.worker.post(
                "sms done", remove_delivered, self.store.engine, flight.uri, flight.nseq
            )
        if isinstance(event, BufferAcknowledged) and self.ip is not None:
            self.ip.delivered_by_sms(flight.uri, flight.nseq)
        if isinstance(event, BufferAcknowledged):
            self.live.latency(flight.uri, SMS_CHANNEL, (event.acked_at - event.sent_at) * 1000.0)
            self.live.delivered(flight.uri, SMS_CHANNEL, 1.0)
            latency = max(0.0, (self.clock() - flight.published_at) * 1000.0)
            self.log.emit(
                "notify_delivered",
                flight.uri,
                nseq=flight.nseq,
                channel=SMS_CHANNEL,
                latency_ms=latency,
            )
        elif isinstance(event, BufferExpired):
            self.live.delivered(flight.uri, SMS_CHANNEL, 0.0)
            self.log.emit(
                "notify_dropped",
                flight.uri,
                nseq=flight.nseq,
                channel=SMS_CHANNEL,
                reason=f"undeliverable by sms: ttl ended after {event.sms_sent} sms",
            )

    async def load_keys(self) -> None:
        """Key every user's number from its HA1 (again after the users were stored)."""
        await self._load_keys(self._defaults)

    async def _load_keys(self, numbers: dict[str, str]) -> None:
        """Key the users' numbers (URI to number) from their HA1 in the store."""
        assert self.worker is not None
        self._keying.update(numbers.values())
        try:
            ha1s = await self.worker.run(sms_ha1s, self.store, numbers)
        except StoreError as exc:
            self.errors += 1
            log.warning("SMS keys: %s (their SMS are refused until read)", exc)
            ha1s = {}
        finally:
            self._keying.difference_update(numbers.values())
        for number, ha1 in ha1s.items():
            self.keys.set(number, ha1)

    def _key_of(self, number: str) -> SmsKeys | None:
        """The link's key lookup: a user's number not keyed yet (added to the store after
        start) is read in the background; its SMS meanwhile are refused and resent."""
        keys = self.keys.get(number)
        uri = self._uri_by_number.get(number)
        if keys is None and uri is not None and self._started and number not in self._keying:
            task = asyncio.get_running_loop().create_task(self._load_keys({uri: number}))
            self._keying.add(number)
            self._key_tasks.add(task)  # the loop keeps only a weak reference
            task.add_done_callback(self._key_tasks.discard)
        return keys

    def _refused(self, refused: SmsRefused) -> None:
        """An SMS the link dropped (forged, replayed, unknown number): logged, nothing else."""
        known = self._uri_by_number.get(refused.sender)
        self.log.emit(
            "sms_received",
            known if known is not None else f"tel:{refused.sender}",
            channel=SMS_CHANNEL,
            reason=f"refused {refused.what}: {refused.reason.value}",
        )

    def _on_mo(self, sender: str, frame: bytes) -> None:
        """A frame from a phone. From a user's number (the operator's records), a ``pub``
        or ``ack`` is handled as if it came over IP (no answer goes back: SMS costs, and
        the device resends a publish over IP later under the same ``msg_id``)."""
        known = self._uri_by_number.get(sender)
        uri = known if known is not None else f"tel:{sender}"
        self.received.append((sender, frame))
        op = "?"
        decoded = None
        with contextlib.suppress(FrameError):
            decoded = decode(frame)
            op = decoded.op
        self.log.emit("sms_received", uri, channel=SMS_CHANNEL, bytes=len(frame), reason=f"op={op}")
        if known is None or not isinstance(decoded, Pub | Ack) or self.ip is None:
            return
        self.ip.handle_sms_frame(known, frame)


__all__ = ["RECENT_MO", "IpSide", "SmsFallback", "make_gateway", "sms_policy"]
