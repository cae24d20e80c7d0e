"""The SMS side's plans: its decisions for one user's queue, on the database thread.

A look at a user (:class:`Look`, what the loop knows when it starts) becomes a
:class:`Plan`, a list of steps (:class:`Send`, :class:`Dropped`, :class:`Note`,
:class:`Limit`, :class:`Retry`) that :class:`~mdeci.broker.sms.SmsFallback` carries out
on the loop. Planning reads the session and the queued rows, runs the channel selector
(the usage sums, the calendar and the subscriptions' classes live on this thread),
counts the usage of each SMS it decides to send and deletes rows whose TTL ended.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Protocol

from mdeci.broker.errors import WrongThreadError
from mdeci.broker.fencing import Fence
from mdeci.broker.sessions import SessionManager
from mdeci.broker.sms_policy import IP_CHANNEL, SMS_CHANNEL
from mdeci.broker.worker import DbWorker
from mdeci.channels import (
    Hold,
    Kind,
    NoChannel,
    Outgoing,
    SelectorPolicy,
    SendNow,
    Usage,
    UsageCounter,
    WeeklyCalendar,
    record_send,
    select,
)
from mdeci.channels.config import ChannelsConfig, Scope
from mdeci.channels.limits import first_exceeded
from mdeci.config import BrokerSmsConfig
from mdeci.errors import FrameError
from mdeci.frames import notify_bytes
from mdeci.store.calendars import SqlCalendars
from mdeci.store.queues import QueuedNotification
from mdeci.store.repo import BrokerStore
from mdeci.store.sessions import SessionStatus
from mdeci.store.usage import remove_delivered

#: The usage counters' user name for global limits (everybody's SMS together).
GLOBAL_USER = "*"
# Urgent rows read per look at a user beyond those already in flight.
BATCH = 32


class IpSide(Protocol):
    """What the SMS side asks of the IP side (:class:`~mdeci.broker.service.BrokerService`)."""

    @property
    def worker(self) -> DbWorker:
        """The database thread, where every store call of the SMS side runs."""

    @property
    def sessions(self) -> SessionManager:
        """The Session Manager: it holds each user's SMS fields too."""

    def is_connected(self, uri: str) -> bool:
        """``uri``'s IP channel is up (its session is CONNECTED)."""

    def tell(self, uri: str, data: bytes) -> bool:
        """Send a broker-initiated frame to ``uri`` over IP if it is CONNECTED."""

    def handle_sms_frame(self, uri: str, data: bytes) -> None:
        """A ``pub`` or ``ack`` from ``uri``'s phone: handled as if it came over IP."""

    def sub_class(self, sub_id: int) -> str | None:
        """The queue class live subscription ``sub_id`` asked for, if any."""

    def delivered_by_sms(self, uri: str, nseq: int) -> None:
        """``uri``'s ``nseq`` went by SMS: a later ack of it over IP is no second
        delivery."""

    @property
    def rows(self) -> Fence:
        """The epochs this broker holds its users at (mdeci/broker/session_rows.py)."""


@dataclass(frozen=True, slots=True)
class Look:
    """What the loop knows when a look at ``uri`` starts (the plan's input)."""

    uri: str
    msisdn: str
    connected: bool
    after: int  # connected users: the highest nseq already decided
    flying: frozenset[int]  # nseqs on their way by SMS
    policy: SelectorPolicy
    now: float


@dataclass(frozen=True, slots=True)
class Send:
    nseq: int
    published_at: float
    frame: bytes
    ttl: float
    qclass: str
    cost: float


@dataclass(frozen=True, slots=True)
class Dropped:
    """The row's TTL ended while the user was away: deleted by the plan."""

    nseq: int


@dataclass(frozen=True, slots=True)
class Note:
    nseq: int
    reason: str


@dataclass(frozen=True, slots=True)
class Limit:
    channel: str
    limit: str
    qclass: str


@dataclass(frozen=True, slots=True)
class Retry:
    delay: float


Step = Send | Dropped | Note | Limit | Retry


@dataclass(frozen=True, slots=True)
class Plan:
    steps: tuple[Step, ...]
    decided: int  # the highest nseq looked at


class SmsPlanner:
    """Plans looks at users (on the database thread) with ``usage`` and ``channels``."""

    def __init__(
        self,
        store: BrokerStore,
        config: BrokerSmsConfig,
        channels: ChannelsConfig,
        usage: UsageCounter,
    ) -> None:
        self.store = store
        self.config = config
        self.channels = channels
        self.usage = usage
        self.ip: IpSide | None = None  # the service, once bound
        self._global_limits = channels.limits_for("", scope=Scope.GLOBAL)
        self._free: dict[str, tuple[SelectorPolicy, SelectorPolicy]] = {}
        self._calendar_store = SqlCalendars(store.engine)
        self._calendars: dict[str, WeeklyCalendar | None] = {}
        # Every row may be of a class that allows SMS unless only the urgent class does
        # (then urgent rows alone are read, or a named class could never use SMS).
        self.normal_sms = any(
            SMS_CHANNEL in c.channels for c in channels.classes if c.name != channels.urgent_class
        )

    @property
    def worker(self) -> DbWorker | None:
        return None if self.ip is None else self.ip.worker

    def forget_calendar(self, uri: str) -> None:
        """``uri``'s device sent a new calendar: read it again (database thread)."""
        self._calendars.pop(uri, None)

    def _calendar(self, uri: str) -> WeeklyCalendar | None:
        """``uri``'s calendar as its device last sent it (read from SQL once), or None.
        On the database thread."""
        if uri not in self._calendars:
            stored = self._calendar_store.get(uri)
            self._calendars[uri] = None if stored is None else stored.calendar()
        return self._calendars[uri]

    def plan(self, look: Look) -> Plan | None:
        """The decisions for ``look.uri``'s queued rows (None: it is not away).

        On the database thread: it reads and writes the store and the usage counters.
        """
        if self.worker is None or not self.worker.on_thread():
            raise WrongThreadError("SMS plans run on the broker's database thread")
        if not look.connected:
            session = self.store.sessions.get_session(look.uri)
            if session is None or session.status is not SessionStatus.DISCONNECTED:
                return None
        if self._lost(look.uri):
            return None
        rows = self.store.queues.pending(
            look.uri,
            after_nseq=look.after,
            limit=len(look.flying) + BATCH,
            urgent_only=not self.normal_sms,
        )
        steps: list[Step] = []
        for row in rows:
            if row.nseq not in look.flying:
                steps.extend(self._decide(look, row))
        return Plan(tuple(steps), max((row.nseq for row in rows), default=0))

    def _lost(self, uri: str) -> bool:
        """Another broker holds ``uri`` now (its fence is told): this one plans nothing
        for the user, or both would send the same SMS. One read, as SMS plans are few."""
        fence = None if self.ip is None else self.ip.rows
        epoch = None if fence is None else fence.held_epochs.get(uri)
        if fence is None or epoch is None:
            return False  # a session made without SIP: not fenced
        if not fence.holds(uri):
            return True
        for lost in self.store.ownership.lost_of({uri: epoch}):
            fence.refused(lost)
            return True
        return False

    def _qclass(self, row: QueuedNotification) -> str:
        """The publish's class, else its subscription's, else by ``urgent``."""
        if row.qclass:
            return row.qclass
        if self.ip is not None:
            named = self.ip.sub_class(row.sub_id)
            if named:
                return named
        return self.channels.urgent_class if row.urgent else self.channels.default_class

    def _decide(self, look: Look, row: QueuedNotification) -> list[Step]:
        """The selector's answer for one row, as steps; on the database thread (an SMS
        it sends is counted here, so the next plan of any user sees it)."""
        uri, now, connected = look.uri, look.now, look.connected
        left = row.published_at + self.config.ttl - now
        if left <= 0 and not connected:
            remove_delivered(self.store.engine, uri, row.nseq)
            return [Dropped(row.nseq)]
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
            return [Note(row.nseq, why), Retry(decision.until - now)]
        if isinstance(decision, NoChannel):
            steps: list[Step] = [
                Limit(channel, limit, qclass) for channel, limit in decision.blocked
            ]
            if decision.blocked or not connected:
                why = "; ".join(f"{ch}: {limit}" for ch, limit in decision.blocked)
                steps.append(Note(row.nseq, f"sms not used ({decision.reason}) {why}".strip()))
            return steps
        if decision.channel.name != SMS_CHANNEL:
            # IP it is: the IP path carries every queued notification in order. Was SMS
            # the better choice, but for a limit? Then that limit is what decided.
            stopped = self._sms_stopped(uri, message, policy, over_global, connected, now)
            if stopped is None:
                return []
            return [
                Limit(SMS_CHANNEL, stopped, qclass),
                Note(row.nseq, f"sms not used (limit reached) sms: {stopped}"),
            ]
        if left <= 0:
            return []
        record_send(self.usage, message, decision, at=now)
        if self._global_limits:
            self.usage.add(
                GLOBAL_USER, SMS_CHANNEL, qclass, now, Usage(1, len(frame), decision.cost)
            )
        return [Send(row.nseq, row.published_at, frame, left, qclass, decision.cost)]

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


def _notify_frame(row: QueuedNotification) -> bytes | None:
    try:
        return notify_bytes(
            (
                row.nseq,
                row.sub_id,
                row.publisher_uri,
                row.msg_id,
                row.subject,
                row.attrs_cbor,
                row.payload,
                row.published_at,
            )
        )
    except FrameError:
        return None
