"""SMS fallback of the broker: urgent notifications of DISCONNECTED users go by SMS.

Theory of operation (PROTOCOL.md §7, docs/channels.md "Broker integration")
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
deleted as well. When IP comes back (:meth:`SmsFallback.ip_back`) every buffer of the
user still in flight is cancelled; those notifications are still queued and the IP
flush sends them; if an SMS copy got there first, the agent's gate refuses the IP copy
(and still acks it), so nothing reaches the application twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass

import cbor2

from mdeci.broker.sink import ChurnSink
from mdeci.channels import (
    CachedUsage,
    Channel,
    Hold,
    Kind,
    Limit,
    NoChannel,
    Outgoing,
    Period,
    SelectorPolicy,
    Tariff,
    UsageCounter,
    record_send,
    select,
)
from mdeci.config import BrokerSmsConfig, SmsGatewayKind
from mdeci.errors import FrameError
from mdeci.frames import Notify, decode, encode
from mdeci.sms import sms_tariff
from mdeci.sms.config import SmsConfig
from mdeci.sms.gateway import LinkRunner, SimulatedNetwork, SmsGateway
from mdeci.sms.link import BufferAcknowledged, BufferExpired, FrameReceived, LinkEvent, SmsLink
from mdeci.store.errors import StoreError
from mdeci.store.queues import QueuedNotification
from mdeci.store.repo import BrokerStore
from mdeci.store.sessions import SessionStatus
from mdeci.store.usage import SqlUsage, remove_delivered

log = logging.getLogger(__name__)

URGENT = "urgent"
SMS_CHANNEL = "sms"
# Urgent rows read per look at a user beyond those already in flight.
BATCH = 32


def sms_policy(config: BrokerSmsConfig, link: SmsConfig | None = None) -> SelectorPolicy:
    """The selector policy of ``[sms]``: an IP channel and the SMS channel with its limits.

    The IP figures are the thesis' MNO data plan's; while IP is DISCONNECTED only SMS is
    available, so they matter only to a class that may wait (none by default).
    """
    limits: list[Limit] = []
    if config.day_messages is not None:
        limits.append(Limit(period=Period.DAY, channel=SMS_CHANNEL, messages=config.day_messages))
    if config.month_messages is not None:
        limits.append(
            Limit(period=Period.MONTH, channel=SMS_CHANNEL, messages=config.month_messages)
        )
    if config.month_money is not None:
        limits.append(Limit(period=Period.MONTH, channel=SMS_CHANNEL, money=config.month_money))
    return SelectorPolicy(
        channels=(
            Channel(name="ip", tariff=Tariff(price=0.0), energy_mw=1500.0, latency_ms=250.0),
            Channel(
                name=SMS_CHANNEL,
                kind=Kind.SMS,
                tariff=sms_tariff(config.price, link),
                energy_mw=config.energy_mw,
                latency_ms=config.latency_ms,
            ),
        ),
        limits=tuple(limits),
    )


def link_config(config: BrokerSmsConfig) -> SmsConfig:
    """The broker's SMS link settings from ``[sms]``."""
    return SmsConfig(
        ack_timeout=config.ack_timeout,
        ack_timeout_max=config.ack_timeout_max,
        default_ttl=config.ttl,
    )


def make_gateway(config: BrokerSmsConfig) -> SmsGateway:
    """The gateway ``[sms] gateway`` names (the simulated one is a private network)."""
    if config.gateway is SmsGatewayKind.KANNEL:
        from mdeci.sms.kannel import KannelConfig, KannelGateway

        return KannelGateway(
            KannelConfig(
                sendsms_url=config.kannel_sendsms_url,
                username=config.kannel_username,
                password=config.kannel_password,
                callback_host=config.kannel_callback.host,
                callback_port=config.kannel_callback.port,
            )
        )
    if config.gateway is SmsGatewayKind.SMPP:
        from mdeci.sms.smpp import SmppConfig, SmppGateway

        return SmppGateway(
            SmppConfig(
                host=config.smpp_address.host,
                port=config.smpp_address.port,
                system_id=config.smpp_system_id,
                password=config.smpp_password,
            )
        )
    return SimulatedNetwork().gateway(config.number)


@dataclass(frozen=True, slots=True)
class _InFlight:
    uri: str
    nseq: int
    published_at: float


class SmsFallback:
    """The broker's SMS side; :meth:`start`, then :meth:`close` at the end.

    ``clock`` is the broker's (epoch seconds: TTLs, limits' calendar periods, latencies);
    the link's retransmission timers run on the event loop's clock.
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
        policy: SelectorPolicy | None = None,
        default_msisdns: dict[str, str] | None = None,
    ) -> None:
        self.store = store
        self.config = config
        self.clock = clock
        self.log = log_sink
        # Period sums read once from SQL, then kept exact by record_send (one broker per
        # database): the selector adds microseconds, not a query per limit.
        self.usage: UsageCounter = (
            usage if usage is not None else CachedUsage(SqlUsage(store.engine))
        )
        cfg = link_config(config)
        self.policy = policy if policy is not None else sms_policy(config, cfg)
        self.link = SmsLink(config.number, cfg)
        self.runner = LinkRunner(self.link, gateway, self._on_event)
        self._defaults = dict(default_msisdns or {})
        self._buffers: dict[int, _InFlight] = {}
        self._by_user: dict[str, dict[int, int]] = {}  # uri -> nseq -> buffer id
        self._blocked: dict[str, set[int]] = {}  # nseqs already logged as blocked
        self._users_by_number: dict[str, str] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self.received: list[tuple[str, bytes]] = []  # MO frames (sender, frame)
        self.errors = 0
        self._started = False

    async def start(self) -> None:
        """Start the gateway, then look at every user stored DISCONNECTED."""
        await self.runner.start()
        self._started = True
        with contextlib.suppress(StoreError):
            for rec in self.store.sessions.sessions_with_status(SessionStatus.DISCONNECTED):
                self.kick(rec.uri)

    async def close(self) -> None:
        self._started = False
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        await self.runner.close()

    # ------------------------------------------------------------------ the service's calls

    def in_flight(self, uri: str) -> tuple[int, ...]:
        """nseqs of ``uri`` on their way by SMS (not yet acknowledged or expired)."""
        return tuple(sorted(self._by_user.get(uri, {})))

    def kick(self, uri: str) -> None:
        """Send ``uri``'s queued urgent notifications by SMS if it is DISCONNECTED."""
        if not self._started:
            return
        try:
            self._kick(uri)
        except StoreError as exc:
            self.errors += 1  # retried at the next kick (publish, disconnection, start)
            log.warning("sms fallback for %s: %s", uri, exc)

    def ip_back(self, uri: str) -> None:
        """``uri`` is CONNECTED again: stop its SMS buffers; IP delivers what is queued."""
        timer = self._timers.pop(uri, None)
        if timer is not None:
            timer.cancel()
        flying = self._by_user.pop(uri, {})
        for buffer_id in flying.values():
            self.link.cancel(buffer_id)
            self._buffers.pop(buffer_id, None)
        self._blocked.pop(uri, None)
        if flying and self._started:
            self.runner.poke()

    # ------------------------------------------------------------------ internals

    def _msisdn(self, uri: str) -> str | None:
        session = self.store.sessions.get_session(uri)
        if session is None or session.status is not SessionStatus.DISCONNECTED:
            return None
        return session.msisdn or self._defaults.get(uri)

    def _kick(self, uri: str) -> None:
        msisdn = self._msisdn(uri)
        if msisdn is None:
            return
        self._users_by_number[msisdn] = uri
        flying = self._by_user.setdefault(uri, {})
        rows = self.store.queues.pending(uri, limit=len(flying) + BATCH, urgent_only=True)
        now = self.clock()
        for row in rows:
            if row.nseq not in flying:
                self._offer(uri, msisdn, row, now)

    def _offer(self, uri: str, msisdn: str, row: QueuedNotification, now: float) -> None:
        left = row.published_at + self.config.ttl - now
        if left <= 0:
            remove_delivered(self.store.engine, uri, row.nseq)
            self.log.emit(
                "notify_dropped", uri, nseq=row.nseq, channel=SMS_CHANNEL, reason="ttl ended"
            )
            return
        frame = _notify_frame(row)
        if frame is None:
            return  # unsendable rows are the IP path's to report
        message = Outgoing(user=uri, qclass=URGENT, size=len(frame), first_seen=row.published_at)
        decision = select(self.policy, message, available={SMS_CHANNEL}, usage=self.usage, now=now)
        if isinstance(decision, Hold):
            self._retry_at(uri, decision.until - now)
            return
        if isinstance(decision, NoChannel):
            blocked = self._blocked.setdefault(uri, set())
            if row.nseq not in blocked:
                blocked.add(row.nseq)
                why = "; ".join(f"{ch}: {limit}" for ch, limit in decision.blocked)
                self.log.emit(
                    "notify_queued",
                    uri,
                    nseq=row.nseq,
                    channel=SMS_CHANNEL,
                    reason=f"sms not used ({decision.reason}) {why}".strip(),
                )
                log.info("sms for %s nseq %d not sent: %s %s", uri, row.nseq, decision.reason, why)
            return
        buffer_id = self.runner.send_frame(msisdn, frame, ttl=left)
        self._buffers[buffer_id] = _InFlight(uri, row.nseq, row.published_at)
        self._by_user.setdefault(uri, {})[row.nseq] = buffer_id
        record_send(self.usage, message, decision, at=now)
        self.log.emit(
            "sms_sent",
            uri,
            nseq=row.nseq,
            channel=SMS_CHANNEL,
            bytes=len(frame),
            cost=decision.cost,
            reason=f"to {msisdn}",
        )

    def _retry_at(self, uri: str, delay: float) -> None:
        if uri in self._timers:
            return
        loop = asyncio.get_running_loop()

        def again() -> None:
            self._timers.pop(uri, None)
            self.kick(uri)

        self._timers[uri] = loop.call_later(max(0.0, delay), again)

    def _on_event(self, event: LinkEvent) -> None:
        if isinstance(event, FrameReceived):
            self._on_mo(event.sender, event.frame)
            return
        flight = self._buffers.pop(event.buffer_id, None)
        if flight is None:
            return
        self._by_user.get(flight.uri, {}).pop(flight.nseq, None)
        try:
            remove_delivered(self.store.engine, flight.uri, flight.nseq)
        except StoreError:
            # Stays queued: IP delivers it again later and the agent's gate refuses it.
            self.errors += 1
        if isinstance(event, BufferAcknowledged):
            latency = max(0.0, (self.clock() - flight.published_at) * 1000.0)
            self.log.emit(
                "notify_delivered",
                flight.uri,
                nseq=flight.nseq,
                channel=SMS_CHANNEL,
                latency_ms=latency,
            )
        elif isinstance(event, BufferExpired):
            self.log.emit(
                "notify_dropped",
                flight.uri,
                nseq=flight.nseq,
                channel=SMS_CHANNEL,
                reason=f"undeliverable by sms: ttl ended after {event.sms_sent} sms",
            )

    def _on_mo(self, sender: str, frame: bytes) -> None:
        uri = self._users_by_number.get(sender, f"tel:{sender}")
        self.received.append((sender, frame))
        op = "?"
        with contextlib.suppress(FrameError):
            op = decode(frame).op
        self.log.emit("sms_received", uri, channel=SMS_CHANNEL, bytes=len(frame), reason=f"op={op}")


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
