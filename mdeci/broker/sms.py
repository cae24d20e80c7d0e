"""SMS fallback of the broker: urgent notifications of DISCONNECTED users go by SMS.

Theory of operation (docs/protocol.md §7, docs/channels.md "Broker integration")
----------------------------------------------------------------------------
:class:`SmsFallback` is asked to look at a user (:meth:`SmsFallback.kick`) when
something was queued for it while its IP channel is not CONNECTED, when its RUDP peer
became unreachable, and at start for every session stored DISCONNECTED. For a user whose
session is DISCONNECTED and who has an MSISDN (SDP ``a=mdeci-msisdn`` or the user's
configured ``msisdn``), each queued *urgent* notification not already on its way is
encoded as the same ``notify`` frame IP would carry and offered to the channel selector
(:func:`mdeci.channels.select`, class ``urgent``, available channels ``{"sms"}``):

- ``SendNow`` on SMS: the frame goes to the user's number through one
  :class:`~mdeci.sms.link.SmsLink` buffer (TTL: what is left of ``[sms] ttl`` since
  publication), the usage is counted (limits), ``sms_sent`` is logged with the frame's
  ``bytes`` and its ``cost``;
- ``NoChannel`` (e.g. the user's monthly SMS limit): logged once per notification as
  ``notify_queued`` with ``channel = "sms"`` and the limit as ``reason``; it waits in the
  queue for IP;
- ``Hold``: looked at again at its deadline.

Non-urgent notifications are never considered: they stay queued for IP.

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
database cannot stall SIP and RUDP (issue 12). A look at a user is split in two:

- *plan*, on the database thread: read the session and the queued rows, run the
  selector (the usage sums, the calendar and the subscriptions' classes live there),
  count the usage of each SMS it decides to send, delete rows whose TTL ended; the
  answer is a :class:`_Plan`, a list of steps;
- *act*, on the loop: hand the frames to the SMS link, log, arm retry timers, tell the
  device of limits (the link, the timers and the log are the loop's).

At most one look per user runs at a time; a kick meanwhile runs one more look after it,
so a plan always knows which notifications are on their way. A plan that comes back
after IP returned or the calendar changed is stale: only its deletions are reported
(the usage it counted for SMS it then does not send stays counted; usage only grows,
and the window is one database round trip).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date

import cbor2

from mdeci.broker.errors import BrokerError, WrongThreadError
from mdeci.broker.sink import ChurnSink
from mdeci.broker.worker import DbWorker
from mdeci.channels import (
    CachedUsage,
    Channel,
    Hold,
    Kind,
    NoChannel,
    Outgoing,
    Period,
    SelectorPolicy,
    SendNow,
    Usage,
    UsageCounter,
    WeeklyCalendar,
    period_days,
    record_send,
    select,
)
from mdeci.channels.config import ChannelsConfig, IpConfig, LimitConfig, Scope
from mdeci.channels.limits import first_exceeded
from mdeci.channels.live import Figures, LiveFigures
from mdeci.config import BrokerSmsConfig, SmsGatewayKind
from mdeci.errors import FrameError
from mdeci.frames import Ack, LimitReached, Notify, Pub, decode, encode
from mdeci.sms import sms_tariff
from mdeci.sms.config import SmsConfig
from mdeci.sms.gateway import LinkRunner, SmsGateway, network_gateway
from mdeci.sms.link import BufferAcknowledged, BufferExpired, FrameReceived, LinkEvent, SmsLink
from mdeci.store.calendars import SqlCalendars
from mdeci.store.errors import StoreError
from mdeci.store.queues import QueuedNotification
from mdeci.store.repo import BrokerStore
from mdeci.store.sessions import SessionStatus
from mdeci.store.usage import SqlUsage, remove_delivered

log = logging.getLogger(__name__)

SMS_CHANNEL = "sms"
IP_CHANNEL = "ip"
#: The usage counters' user name for global limits (everybody's SMS together).
GLOBAL_USER = "*"
_EPOCH_DATE = date(1970, 1, 1)
# Urgent rows read per look at a user beyond those already in flight.
BATCH = 32
RECENT_MO = 64


def sms_channel(config: BrokerSmsConfig, link: SmsConfig | None, figures: Figures) -> Channel:
    """The SMS channel: ``[sms] price`` per SMS (a frame costs its segments), live L, V."""
    return Channel(
        name=SMS_CHANNEL,
        kind=Kind.SMS,
        tariff=sms_tariff(config.price, link),
        energy_mw=config.energy_mw,
        latency_ms=figures.latency_ms,
        coverage=figures.coverage,
    )


def ip_channel(config: IpConfig, figures: Figures) -> Channel:
    """The IP channel: ``[channels.ip]`` tariff and energy, live L and V."""
    return Channel(
        name=IP_CHANNEL,
        kind=Kind.IP,
        tariff=config.tariff(),
        energy_mw=config.energy_mw,
        latency_ms=figures.latency_ms,
        coverage=figures.coverage,
    )


def sms_limits(config: BrokerSmsConfig) -> tuple[LimitConfig, ...]:
    """``[sms]``'s shorthand limits (per user, on SMS) as ``[[channels.limits]]``."""
    limits: list[LimitConfig] = []
    if config.day_messages is not None:
        limits.append(LimitConfig(period=Period.DAY, messages=config.day_messages))
    if config.month_messages is not None:
        limits.append(LimitConfig(period=Period.MONTH, messages=config.month_messages))
    if config.month_money is not None:
        limits.append(LimitConfig(period=Period.MONTH, money=config.month_money))
    return tuple(limits)


def sms_policy(
    config: BrokerSmsConfig,
    link: SmsConfig | None = None,
    channels: ChannelsConfig | None = None,
    *,
    user: str = "",
    ip: Figures | None = None,
    sms: Figures | None = None,
) -> SelectorPolicy:
    """``user``'s selector policy: the IP and SMS channels (with these figures, else the
    configured ones), the classes of ``[channels]`` and the per-user limits of
    ``[channels]`` and ``[sms]``."""
    chans = channels if channels is not None else ChannelsConfig()
    ip_now = ip if ip is not None else Figures(chans.ip.latency_ms, chans.ip.coverage)
    sms_now = sms if sms is not None else Figures(config.latency_ms, 1.0)
    extra = tuple(lim.limit() for lim in sms_limits(config))
    return SelectorPolicy(
        channels=(ip_channel(chans.ip, ip_now), sms_channel(config, link, sms_now)),
        classes=chans.classes_of(),
        limits=chans.limits_for(user) + extra,
    )


def link_config(config: BrokerSmsConfig) -> SmsConfig:
    """The broker's SMS link settings from ``[sms]``."""
    return SmsConfig(
        ack_timeout=config.ack_timeout,
        ack_timeout_max=config.ack_timeout_max,
        first_part_ack=config.first_part_ack,
        default_ttl=config.ttl,
    )


def make_gateway(config: BrokerSmsConfig) -> SmsGateway:
    """The gateway ``[sms] gateway`` names.

    Raises :class:`BrokerError` for ``"simulated"``: that network reaches no phone (tests
    hand the broker a gateway of their own network); a standalone broker must say how to
    reach phones (``"kannel"``: docs/sms.md "Loopback with Kannel and fakesmsc").
    """
    if config.gateway is SmsGatewayKind.SIMULATED:
        raise BrokerError(
            '[sms] gateway = "simulated" reaches no phone outside tests: set gateway = '
            '"kannel" (docs/sms.md "Loopback with Kannel and fakesmsc") or "smpp", '
            "or enabled = false"
        )
    gateway = network_gateway(config)
    if gateway is not None:
        return gateway
    raise AssertionError(f"gateway kind {config.gateway} not handled")  # a programming error


@dataclass(frozen=True, slots=True)
class _InFlight:
    uri: str
    nseq: int
    published_at: float


@dataclass(frozen=True, slots=True)
class _Look:
    """What the loop knows when a look at ``uri`` starts (the plan's input)."""

    uri: str
    msisdn: str
    connected: bool
    after: int  # connected users: the highest nseq already decided
    flying: frozenset[int]  # nseqs on their way by SMS
    policy: SelectorPolicy
    now: float


@dataclass(frozen=True, slots=True)
class _Send:
    nseq: int
    published_at: float
    frame: bytes
    ttl: float
    qclass: str
    cost: float


@dataclass(frozen=True, slots=True)
class _Dropped:
    """The row's TTL ended while the user was away: deleted by the plan."""

    nseq: int


@dataclass(frozen=True, slots=True)
class _Note:
    nseq: int
    reason: str


@dataclass(frozen=True, slots=True)
class _Limit:
    channel: str
    limit: str
    qclass: str


@dataclass(frozen=True, slots=True)
class _Retry:
    delay: float


_Step = _Send | _Dropped | _Note | _Limit | _Retry


@dataclass(frozen=True, slots=True)
class _Plan:
    steps: tuple[_Step, ...]
    decided: int  # the highest nseq looked at


def _quantum(value: float) -> float:
    """Two significant figures: live figures move a cached policy only when they move."""
    return float(f"{value:.2g}")


class SmsFallback:
    """The broker's channel selection and SMS side; :meth:`start`, then :meth:`close`.

    ``clock`` is the broker's (epoch seconds: TTLs, limits' calendar periods, latencies);
    the link's retransmission timers run on the event loop's clock. ``tell`` (set by the
    service) sends a frame to a user over IP and says whether it could; ``worker`` (set
    by the service) is its database thread, where every store call of this side runs.
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
        self._global_limits = self.channels.limits_for("", scope=Scope.GLOBAL)
        self._policies: dict[str, tuple[tuple[float, ...], SelectorPolicy]] = {}
        self._free: dict[str, tuple[SelectorPolicy, SelectorPolicy]] = {}
        self._calendar_store = SqlCalendars(store.engine)
        self._calendars: dict[str, WeeklyCalendar | None] = {}
        self.link = SmsLink(config.number, self.link_config)
        self.runner = LinkRunner(self.link, gateway, self._on_event)
        self.tell: Callable[[str, bytes], bool] | None = None
        self.worker: DbWorker | None = None
        self.connected: Callable[[str], bool] | None = None  # is its IP channel up
        self._defaults = dict(default_msisdns or {})
        self._uri_by_number = {number: uri for uri, number in self._defaults.items()}
        # Set by the service: handle a frame from a user as if it came over IP; the class
        # a live subscription asked for.
        self.handle_frame: Callable[[str, bytes], None] | None = None
        self.sub_class: Callable[[int], str | None] | None = None
        # Set by the service: this user's notification left by SMS (the IP side must not
        # count a later ack of it as a second delivery).
        self.delivered: Callable[[str, int], None] | None = None
        self._buffers: dict[int, _InFlight] = {}
        self._by_user: dict[str, dict[int, int]] = {}  # uri -> nseq -> buffer id
        self._noted: dict[str, set[int]] = {}  # nseqs whose hold/refusal was logged
        self._decided: dict[str, int] = {}  # connected users: highest nseq decided
        self._told: set[tuple[str, str, float]] = set()  # (uri, limit, period end) told
        self._untold: dict[str, list[bytes]] = {}  # limit frames waiting for IP
        self._ip_seen: dict[str, tuple[int, int]] = {}  # RUDP (sent, retransmitted) seen
        self._users_by_number: dict[str, str] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._looking: dict[str, asyncio.Task[None]] = {}  # uri -> its look (one at a time)
        self._again: dict[str, bool] = {}  # kicked during its look: connected, last said
        self._epochs: dict[str, int] = {}  # bumped when a running plan becomes stale
        # The latest MO frames (sender, frame), for tests and debugging: bounded, since
        # anybody can send SMS to the broker's number.
        self.received: deque[tuple[str, bytes]] = deque(maxlen=RECENT_MO)
        self.errors = 0
        self._started = False
        # Only the classes that may use SMS are looked at; rows carry only "urgent".
        urgent = self.channels.class_config(self.channels.urgent_class)
        self._urgent_sms = urgent is not None and SMS_CHANNEL in urgent.channels
        # Every row may be of a class that allows SMS unless only the urgent class does
        # (then urgent rows alone are read, or a named class could never use SMS).
        self._normal_sms = any(
            SMS_CHANNEL in c.channels
            for c in self.channels.classes
            if c.name != self.channels.urgent_class
        )

    async def start(self) -> None:
        """Start the gateway, then look at every user stored DISCONNECTED.

        Raises :class:`BrokerError` when no service gave it its database thread.
        """
        if self.worker is None:
            raise BrokerError("the SMS side needs a broker service's database thread")
        await self.runner.start()
        self._started = True
        try:
            away = await self.worker.run(
                self.store.sessions.sessions_with_status, SessionStatus.DISCONNECTED
            )
        except StoreError as exc:
            self.errors += 1  # they are looked at again when something is queued for them
            log.warning("channel selection at start: %s", exc)
            return
        for rec in away:
            self.kick(rec.uri)

    async def close(self) -> None:
        self._started = False
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        looks = list(self._looking.values())
        for task in looks:
            task.cancel()
        await asyncio.gather(*looks, return_exceptions=True)
        await self.runner.close()

    # ------------------------------------------------------------------ the service's calls

    def in_flight(self, uri: str) -> tuple[int, ...]:
        """nseqs of ``uri`` on their way by SMS (not yet acknowledged or expired)."""
        return tuple(sorted(self._by_user.get(uri, {})))

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
        last_sent, last_re = self._ip_seen.get(uri, (0, 0))
        if sent < last_sent or retransmitted < last_re:
            last_sent, last_re = 0, 0  # a new RUDP association: counters restarted
        self._ip_seen[uri] = (sent, retransmitted)
        new_sent = sent - last_sent
        if new_sent > 0:
            lost = min(new_sent, retransmitted - last_re)
            self.live.delivered(uri, IP_CHANNEL, 1.0 - lost / new_sent, weight=1.0)

    def kick(self, uri: str, *, connected: bool = False) -> None:
        """Decide for ``uri``'s queued notifications not decided yet (see the module
        docstring); ``connected``: its IP channel is up."""
        if not self._started:
            return
        msisdn = self._msisdn(uri)
        if msisdn is None or not (self._urgent_sms or self._normal_sms):
            return  # IP only: the IP path delivers in order when it is up
        self._users_by_number[msisdn] = uri
        if uri in self._looking:
            self._again[uri] = connected
            return
        self._looking[uri] = asyncio.create_task(self._look(uri, msisdn, connected))

    async def idle(self) -> None:
        """Return once no look at any user is running (for tests and shutdown)."""
        while self._looking:
            await asyncio.gather(*self._looking.values(), return_exceptions=True)

    def calendar_changed(self, uri: str) -> None:
        """``uri``'s device sent a new calendar: forget the old one and decide again for
        what is held or refused."""
        if self.worker is not None:
            # The cache is the database thread's; queued before the look below.
            self.worker.post("sms calendar", self._calendars.pop, uri, None)
        self._epochs[uri] = self._epochs.get(uri, 0) + 1
        timer = self._timers.pop(uri, None)
        if timer is not None:
            timer.cancel()
        self._noted.pop(uri, None)
        self._decided.pop(uri, None)
        self.kick(uri, connected=self.connected is not None and self.connected(uri))

    def _calendar(self, uri: str) -> WeeklyCalendar | None:
        """``uri``'s calendar as its device last sent it (read from SQL once), or None.
        On the database thread."""
        if uri not in self._calendars:
            stored = self._calendar_store.get(uri)
            self._calendars[uri] = None if stored is None else stored.calendar()
        return self._calendars[uri]

    def ip_back(self, uri: str) -> None:
        """``uri`` is CONNECTED again and IP proved to work: stop its SMS buffers; IP
        delivers what is queued; tell it the limits it reached meanwhile."""
        timer = self._timers.pop(uri, None)
        if timer is not None:
            timer.cancel()
        self._epochs[uri] = self._epochs.get(uri, 0) + 1
        flying = self._by_user.pop(uri, {})
        for buffer_id in flying.values():
            self.link.cancel(buffer_id)
            self._buffers.pop(buffer_id, None)
        self._noted.pop(uri, None)
        self._decided.pop(uri, None)
        if flying and self._started:
            self.runner.poke()
        untold = self._untold.pop(uri, [])
        if untold:
            # After the service marked it CONNECTED (it calls us first).
            asyncio.get_running_loop().call_soon(self._tell_all, uri, untold)

    # ------------------------------------------------------------------ internals

    def _msisdn(self, uri: str) -> str | None:
        # From the operator's user records only: a device cannot make the broker pay
        # for SMS to a number of its choosing (the SDP's a=mdeci-msisdn is ignored).
        return self._defaults.get(uri)

    async def _look(self, uri: str, msisdn: str, connected: bool) -> None:
        """Plan on the database thread, act on the loop; again while kicked meanwhile."""
        assert self.worker is not None  # start() checked
        try:
            while self._started:
                epoch = self._epochs.get(uri, 0)
                look = _Look(
                    uri=uri,
                    msisdn=msisdn,
                    connected=connected,
                    after=self._decided.get(uri, 0) if connected else 0,
                    flying=frozenset(self._by_user.get(uri, ())),
                    policy=self.policy(uri),
                    now=self.clock(),
                )
                try:
                    plan = await self.worker.run(self._plan, look)
                except StoreError as exc:
                    self.errors += 1  # retried at the next kick (publish, disconnection, start)
                    log.warning("channel selection for %s: %s", uri, exc)
                    plan = None
                if plan is not None:
                    self._act(look, plan, stale=self._epochs.get(uri, 0) != epoch)
                if uri not in self._again:
                    return
                connected = self._again.pop(uri)
        finally:
            self._looking.pop(uri, None)
            self._again.pop(uri, None)

    def _plan(self, look: _Look) -> _Plan | None:
        """The decisions for ``look.uri``'s queued rows (None: it is not away).

        On the database thread: it reads and writes the store and the usage counters.
        """
        if self.worker is None or not self.worker.on_thread():
            raise WrongThreadError("SMS plans run on the broker's database thread")
        if not look.connected:
            session = self.store.sessions.get_session(look.uri)
            if session is None or session.status is not SessionStatus.DISCONNECTED:
                return None
        rows = self.store.queues.pending(
            look.uri,
            after_nseq=look.after,
            limit=len(look.flying) + BATCH,
            urgent_only=not self._normal_sms,
        )
        steps: list[_Step] = []
        for row in rows:
            if row.nseq not in look.flying:
                steps.extend(self._decide(look, row))
        return _Plan(tuple(steps), max((row.nseq for row in rows), default=0))

    def _act(self, look: _Look, plan: _Plan, *, stale: bool) -> None:
        """Carry ``plan`` out on the loop (a stale one: only its deletions are logged)."""
        uri = look.uri
        for step in plan.steps:
            if isinstance(step, _Dropped):
                self.log.emit(
                    "notify_dropped", uri, nseq=step.nseq, channel=SMS_CHANNEL, reason="ttl ended"
                )
            elif stale or not self._started:
                continue
            elif isinstance(step, _Send):
                self._send(look, step)
            elif isinstance(step, _Note):
                self._note(uri, step.nseq, step.reason)
            elif isinstance(step, _Limit):
                self._limit_reached(uri, step.channel, step.limit, step.qclass, look.now)
            else:
                self._retry_at(uri, step.delay)
        if look.connected and not stale:
            self._decided[uri] = max(self._decided.get(uri, 0), plan.decided)

    def _send(self, look: _Look, step: _Send) -> None:
        buffer_id = self.runner.send_frame(look.msisdn, step.frame, ttl=step.ttl)
        self._buffers[buffer_id] = _InFlight(look.uri, step.nseq, step.published_at)
        self._by_user.setdefault(look.uri, {})[step.nseq] = buffer_id
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

    def _qclass(self, row: QueuedNotification) -> str:
        """The publish's class, else its subscription's, else by ``urgent``."""
        if row.qclass:
            return row.qclass
        if self.sub_class is not None:
            named = self.sub_class(row.sub_id)
            if named:
                return named
        return self.channels.urgent_class if row.urgent else self.channels.default_class

    def _decide(self, look: _Look, row: QueuedNotification) -> list[_Step]:
        """The selector's answer for one row, as steps; on the database thread (an SMS
        it sends is counted here, so the next plan of any user sees it)."""
        uri, now, connected = look.uri, look.now, look.connected
        left = row.published_at + self.config.ttl - now
        if left <= 0 and not connected:
            remove_delivered(self.store.engine, uri, row.nseq)
            return [_Dropped(row.nseq)]
        frame = _notify_frame(row)
        if frame is None:
            return []  # unsendable rows are the IP path's to report
        qclass = self._qclass(row)
        message = Outgoing(user=uri, qclass=qclass, size=len(frame), first_seen=row.published_at)
        available = {IP_CHANNEL} if connected else set()
        policy = look.policy
        over_global = self._over_global(message, policy, now)
        if over_global is None:
            available.add(SMS_CHANNEL)
        decision = select(
            policy,
            message,
            available=available,
            usage=self.usage,
            now=now,
            calendar=self._calendar(uri),
        )
        if over_global is not None and not isinstance(decision, SendNow | Hold):
            decision = NoChannel("every channel is blocked", ((SMS_CHANNEL, over_global),))
        if isinstance(decision, Hold):
            why = f"held until {decision.until:.0f} for {decision.waiting_for}"
            return [_Note(row.nseq, why), _Retry(decision.until - now)]
        if isinstance(decision, NoChannel):
            steps: list[_Step] = [
                _Limit(channel, limit, qclass) for channel, limit in decision.blocked
            ]
            if decision.blocked or not connected:
                why = "; ".join(f"{ch}: {limit}" for ch, limit in decision.blocked)
                steps.append(_Note(row.nseq, f"sms not used ({decision.reason}) {why}".strip()))
            return steps
        if decision.channel.name != SMS_CHANNEL:
            # IP it is: the IP path carries every queued notification in order. Was SMS
            # the better choice, but for a limit? Then that limit is what decided.
            stopped = self._sms_stopped(uri, message, policy, over_global, connected, now)
            if stopped is None:
                return []
            return [
                _Limit(SMS_CHANNEL, stopped, qclass),
                _Note(row.nseq, f"sms not used (limit reached) sms: {stopped}"),
            ]
        if left <= 0:
            return []
        record_send(self.usage, message, decision, at=now)
        if self._global_limits:
            self.usage.add(
                GLOBAL_USER, SMS_CHANNEL, qclass, now, Usage(1, len(frame), decision.cost)
            )
        return [_Send(row.nseq, row.published_at, frame, left, qclass, decision.cost)]

    def _sms_stopped(
        self,
        uri: str,
        message: Outgoing,
        policy: SelectorPolicy,
        over_global: str | None,
        connected: bool,
        now: float,
    ) -> str | None:
        """The limit that kept ``message`` off SMS although SMS scores best, or None."""
        cls, _ = policy.plan(message.qclass)
        if Kind.SMS not in cls.kinds:
            return None
        free = self._free_policy(uri, policy)
        available = {IP_CHANNEL, SMS_CHANNEL} if connected else {SMS_CHANNEL}
        best = select(free, message, available=available, usage=self.usage, now=now)
        if not isinstance(best, SendNow) or best.channel.name != SMS_CHANNEL:
            return None
        if over_global is not None:
            return over_global
        over = first_exceeded(
            policy.limits,
            self.usage,
            user=uri,
            channel=SMS_CHANNEL,
            qclass=message.qclass,
            extra=Usage(1, message.size, best.cost),
            now=now,
        )
        return None if over is None else over.describe()

    def _free_policy(self, uri: str, policy: SelectorPolicy) -> SelectorPolicy:
        """``policy`` without its limits (what the cost function alone would choose)."""
        found = self._free.get(uri)
        if found is None or found[0] is not policy:
            found = (policy, dataclasses.replace(policy, limits=()))
            self._free[uri] = found
        return found[1]

    def _over_global(self, message: Outgoing, policy: SelectorPolicy, now: float) -> str | None:
        """The global limit sending ``message`` by SMS would exceed, described, or None."""
        if not self._global_limits:
            return None
        sms = policy.channels[1]
        extra = Usage(1, message.size, sms.cost(message.size))
        over = first_exceeded(
            self._global_limits,
            self.usage,
            user=GLOBAL_USER,
            channel=SMS_CHANNEL,
            qclass=message.qclass,
            extra=extra,
            now=now,
        )
        return None if over is None else "global " + over.describe()

    def _note(self, uri: str, nseq: int, reason: str) -> None:
        noted = self._noted.setdefault(uri, set())
        if nseq in noted:
            return
        noted.add(nseq)
        self.log.emit("notify_queued", uri, nseq=nseq, channel=SMS_CHANNEL, reason=reason)
        log.info("notification %d of %s: %s", nseq, uri, reason)

    def _limit_reached(self, uri: str, channel: str, limit: str, qclass: str, now: float) -> None:
        """Tell the device (once per limit and period) that ``limit`` stops ``channel``."""
        period = next(
            (p for p in Period if limit.removeprefix("global ").startswith(p.value)), None
        )
        end = period_days(period, now)[1] if period is not None else None
        until = (end - _EPOCH_DATE).days * 86400.0 if end is not None else now
        key = (uri, limit, until)
        if key in self._told:
            return
        self._told.add(key)
        log.warning("limit reached for %s on %s (class %s): %s", uri, channel, qclass, limit)
        frame = encode(LimitReached(channel=channel, limit=limit, qclass=qclass, until=until))
        self._tell_all(uri, [frame])

    def _tell_all(self, uri: str, frames: list[bytes]) -> None:
        for i, frame in enumerate(frames):
            if self.tell is None or not self.tell(uri, frame):
                self._untold.setdefault(uri, []).extend(frames[i:])
                return

    def _retry_at(self, uri: str, delay: float) -> None:
        if uri in self._timers:
            return
        loop = asyncio.get_running_loop()

        def again() -> None:
            self._timers.pop(uri, None)
            self._noted.pop(uri, None)
            self._decided.pop(uri, None)
            self.kick(uri, connected=self.connected is not None and self.connected(uri))

        self._timers[uri] = loop.call_later(max(0.0, delay), again)

    def _on_event(self, event: LinkEvent) -> None:
        if isinstance(event, FrameReceived):
            self._on_mo(event.sender, event.frame)
            return
        flight = self._buffers.pop(event.buffer_id, None)
        if flight is None:
            return
        self._by_user.get(flight.uri, {}).pop(flight.nseq, None)
        if self.worker is not None:
            # On the database thread, before any later plan; if it fails the row stays
            # queued (logged): IP delivers it again later and the agent's gate refuses it.
            self.worker.post(
                "sms done", remove_delivered, self.store.engine, flight.uri, flight.nseq
            )
        if isinstance(event, BufferAcknowledged) and self.delivered is not None:
            self.delivered(flight.uri, flight.nseq)
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
        if known is None or not isinstance(decoded, Pub | Ack) or self.handle_frame is None:
            return
        self.handle_frame(known, frame)


def _notify_frame(row: QueuedNotification) -> bytes | None:
    try:
        return encode(
            Notify(
                nseq=row.nseq,
                sub_id=str(row.sub_id),
                subject=row.subject,
                msg_id=row.msg_id,
                published_at=row.published_at,
                attrs=cbor2.loads(row.attrs_cbor),
                payload=row.payload,
            )
        )
    except (FrameError, ValueError, cbor2.CBORDecodeError):
        return None
