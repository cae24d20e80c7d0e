"""Run a whole broker in-process: store, churn log, :class:`BrokerService` and the SIP
endpoint, from one :class:`~mdeci.config.BrokerConfig`.

``mdeci broker`` calls :func:`run_broker` and waits for a signal; the demo and the tests
call it directly::

    running = await run_broker(load_broker_config("configs/broker.toml"))
    print(running.sip_addr, running.media_addr)
    ...
    await running.close()
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from mdeci.broker.admin import AdminError, AdminServer
from mdeci.broker.endpoint import Address, BrokerSipEndpoint
from mdeci.broker.errors import BrokerError
from mdeci.broker.glue import Broker
from mdeci.broker.hold_timer import HoldTimer
from mdeci.broker.metrics import BrokerMetrics, MetricsServer, MetricsSink, MetricsSources
from mdeci.broker.network_holds import NetworkHolds
from mdeci.broker.service import BrokerService
from mdeci.broker.sink import ChurnLogSink, ChurnSink
from mdeci.broker.sms import SmsFallback
from mdeci.broker.sms_policy import make_gateway
from mdeci.broker.ua_config import broker_password
from mdeci.broker.wakes import WakeListener
from mdeci.broker.worker import DbWorker, LoopSink
from mdeci.churnlog import ChurnLog, Role
from mdeci.config import BrokerConfig
from mdeci.errors import ConfigError
from mdeci.oplog import OperatorSink
from mdeci.oplog import event as oplog_event
from mdeci.sms.counterfile import COUNTER_FILE, JsonCounters
from mdeci.sms.gateway import SmsGateway
from mdeci.store.base import make_engine
from mdeci.store.migrate import upgrade
from mdeci.store.repo import BrokerStore


def endpoint_config(config: BrokerConfig) -> None:
    """Check the SIP endpoint's settings of ``config`` as the broker does at start (an
    external registrar needs the broker's own credentials). Raises :class:`ConfigError`."""
    broker_password(config)


@dataclass(slots=True, eq=False)
class RunningBroker:
    """A started broker: its bound addresses and parts. Call :meth:`close` once."""

    config: BrokerConfig
    store: BrokerStore
    broker: Broker
    service: BrokerService
    endpoint: BrokerSipEndpoint
    sip_addr: Address
    media_addr: Address
    sms: SmsFallback | None = None
    metrics: BrokerMetrics | None = None
    metrics_addr: Address | None = None  # where /metrics, /healthz, /readyz answer
    _metrics_server: MetricsServer | None = None
    _admin: AdminServer | None = None
    _owned_log: ChurnLog | None = None
    _owns_store: bool = False
    _wakes: WakeListener | None = None
    _holds: HoldTimer | None = None
    _closed: bool = field(default=False)

    async def close(self) -> None:
        """Stop the SIP endpoint, then the service; dispose of what :func:`run_broker`
        opened (engine, churn log). Stored state stays for the next start."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._admin is not None:
                await self._admin.close()
            if self._metrics_server is not None:
                await self._metrics_server.close()
            await self.endpoint.close()
        finally:
            if self.sms is not None:
                await self.sms.close()
            if self._wakes is not None:
                await self._wakes.close()
            if self._holds is not None:
                await self._holds.close()
            await self.service.close()
            if self._owned_log is not None:
                self._owned_log.close()
            if self._owns_store:
                self.store.engine.dispose()


async def run_broker(
    config: BrokerConfig,
    *,
    sip_listen: Address | None = None,
    media_listen: Address | None = None,
    store: BrokerStore | None = None,
    log: ChurnSink | None = None,
    clock: Callable[[], float] = time.time,
    random: Callable[[int], bytes] = secrets.token_bytes,
    migrate: bool = True,
    expire_interval: float = 5.0,
    sms_gateway: SmsGateway | None = None,
    monotonic: Callable[[], float] = time.monotonic,
) -> RunningBroker:
    """Start a broker from ``config``; returns once both sockets are bound.

        ``sip_listen`` / ``media_listen`` override ``[sip]`` / ``[media]`` host and port (0:
        any free port). Without ``store`` the database at ``[store] url`` is migrated to the
        Alembic head (``migrate``) and opened; without ``log`` the churn log file of
        ``[churnlog]`` is opened. ``clock`` is wall-clock epoch seconds; ``monotonic`` times
    the durations a clock step must not change (login lockouts). With ``[sms]
        enabled``, urgent notifications of DISCONNECTED users go by SMS through
        ``sms_gateway`` (default: the gateway ``[sms] gateway`` names).

        Raises:
            BrokerError: a socket cannot be bound, or the external registrar refuses us.
            StoreError: the database cannot be migrated or used.
            ConfigError: settings that do not fit together; ChurnLogError: the log file.
    """
    sip_host, sip_port = sip_listen or (config.sip.host, config.sip.port)
    media_host, media_port = media_listen or (config.media.host, config.media.port)
    endpoint_config(config)
    owns_store = store is None
    if store is None:
        try:
            config.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"cannot create data_dir {config.data_dir}: {exc.strerror}") from None
        if migrate:
            await asyncio.to_thread(upgrade, config.store.url)
        store = BrokerStore(make_engine(config.store.url), config.node)
    owned_log: ChurnLog | None = None
    if log is None:
        owned_log = ChurnLog(
            config.churnlog.path,
            config.node,
            clock,
            max_bytes=config.churnlog.max_bytes,
            backups=config.churnlog.backups,
            role=Role.BROKER,
            # One write per loop turn, not per line (two lines per notification).
            defer=asyncio.get_running_loop().call_soon,
        )
        log = ChurnLogSink(owned_log)
    metrics = BrokerMetrics()
    # Operator events as log lines too (mdeci.oplog), and the event counters.
    sink: ChurnSink = MetricsSink(OperatorSink(log), metrics)
    metrics_server: MetricsServer | None = None
    admin: AdminServer | None = None
    service: BrokerService | None = None
    sms: SmsFallback | None = None
    wakes: WakeListener | None = None
    holds: HoldTimer | None = None
    # The core and the store run on this thread from the first statement on: even the
    # core's start-up read of the subscriptions keeps off the event loop.
    worker = DbWorker()
    try:
        broker = await worker.run(Broker, store, config.core, clock, sink)
        broker.classes = frozenset(c.name for c in config.channels.classes)
        broker.sms_classes = frozenset(
            c.name for c in config.channels.classes if "sms" in c.channels
        )
        await worker.run(_attach_holds, broker, config, sink)
        try:
            service = await BrokerService.open(broker, media_host, media_port, config.rudp, worker)
        except OSError as exc:
            raise BrokerError(
                f"cannot listen for media on {media_host}:{media_port}: {exc.strerror or exc}"
            ) from None
        # A user another broker held: the churn log's handoff (docs/protocol.md §8).
        handoffs = LoopSink(sink, service.to_loop)
        service.rows.on_handoff = lambda uri, prev: handoffs.emit("handoff", uri, prev_node=prev)
        if config.media.advertise is not None:
            service.advertise = (config.media.advertise.host, config.media.advertise.port)
        service.accept = config.media.transports
        if "quic" in config.media.transports:
            try:
                await service.open_quic(media_host, config.media.quic_port, config.media.quic)
            except OSError as exc:
                raise BrokerError(
                    f"cannot listen for QUIC on {media_host}:{config.media.quic_port}: "
                    f"{exc.strerror or exc}"
                ) from None
        service.start()
        holds = HoldTimer(worker, broker)
        holds.start()
        if config.sms.enabled:
            defaults = {
                f"sip:{u.user}@{config.domain}": u.msisdn for u in config.auth.users if u.msisdn
            }
            gateway = sms_gateway if sms_gateway is not None else make_gateway(config.sms)
            sms = SmsFallback(
                store,
                config.sms,
                gateway,
                sink,
                clock,
                channels=config.channels,
                default_msisdns=defaults,
                counters=JsonCounters(config.data_dir / COUNTER_FILE),
            )
            service.attach_sms(sms)  # before start: start looks at users and may tell them
            await sms.start()
        endpoint = BrokerSipEndpoint(
            config,
            store,
            service,
            sink,
            clock=clock,
            random=random,
            expire_interval=expire_interval,
            monotonic=monotonic,
        )
        try:
            sip_addr = await endpoint.start(sip_host, sip_port)
        except OSError as exc:
            raise BrokerError(
                f"cannot listen for SIP on {sip_host}:{sip_port}: {exc.strerror or exc}"
            ) from None
        if service.sms is not None:
            await service.sms.load_keys()  # the users the endpoint just stored
        if store.engine.dialect.name == "postgresql":
            # Publications of other brokers for this one's users (mdeci/store/wake.py).
            wakes = WakeListener(service)
            wakes.start()
        if config.metrics.enabled:
            metrics_server = await _start_metrics(config, metrics, store, service, endpoint, clock)
        admin = await _start_admin(config, store, endpoint, clock)
    except BaseException:
        if admin is not None:
            await admin.close()
        if metrics_server is not None:
            await metrics_server.close()
        if sms is not None:
            await sms.close()
        if wakes is not None:
            await wakes.close()
        if holds is not None:
            await holds.close()
        if service is not None:
            await service.close()
        else:
            worker.close()
        if owned_log is not None:
            owned_log.close()
        if owns_store:
            store.engine.dispose()
        raise
    return RunningBroker(
        config=config,
        store=store,
        broker=broker,
        service=service,
        endpoint=endpoint,
        sip_addr=sip_addr,
        media_addr=service.local_addr,
        sms=sms,
        metrics=metrics,
        metrics_addr=metrics_server.local_addr if metrics_server is not None else None,
        _metrics_server=metrics_server,
        _admin=admin,
        _owned_log=owned_log,
        _owns_store=owns_store,
        _wakes=wakes,
        _holds=holds,
    )


def _attach_holds(broker: Broker, config: BrokerConfig, sink: ChurnSink) -> None:
    """The core's network holds (on the database thread, which owns the core)."""
    channels = config.channels

    def sub_class(sub_id: int) -> str | None:
        compiled = broker.core.matcher.get(sub_id)
        return None if compiled is None else compiled.qclass or None

    def sub_in_order(sub_id: int) -> bool:
        compiled = broker.core.matcher.get(sub_id)
        return compiled is not None and compiled.in_order

    broker.core.holds = NetworkHolds(
        channels.networks,
        channels.classes_of(),
        sink,
        broker.core.clock,
        urgent_class=channels.urgent_class,
        default_class=channels.default_class,
        sub_class=sub_class,
        sub_in_order=sub_in_order,
    )


async def _start_metrics(
    config: BrokerConfig,
    metrics: BrokerMetrics,
    store: BrokerStore,
    service: BrokerService,
    endpoint: BrokerSipEndpoint,
    clock: Callable[[], float],
) -> MetricsServer:
    def peers() -> list[tuple[int, float | None, int, int]]:
        out = []
        for _uri, peer in service.peers():
            stats = peer.stats
            srtt = peer.connection.rto.srtt
            retrans = stats.retransmissions + stats.fast_retransmissions
            out.append((id(peer), srtt, retrans, stats.messages_failed))
        return out

    sources = MetricsSources(
        engine=store.engine,
        peers=peers,
        published=lambda: service.broker.published,
        sip_bound=lambda: endpoint.bound,
        clock=clock,
        health=service.broker.health,
        min_free_bytes=config.store.min_free_bytes,
    )
    server = MetricsServer(metrics, sources)
    host, port = config.metrics.host, config.metrics.port
    try:
        await server.start(host, port)
    except OSError as exc:
        raise BrokerError(f"cannot listen for metrics on {host}:{port}: {exc.strerror}") from None
    return server


async def _start_admin(
    config: BrokerConfig,
    store: BrokerStore,
    endpoint: BrokerSipEndpoint,
    clock: Callable[[], float],
) -> AdminServer | None:
    """The admin socket; a broker serves without one (logged) if it cannot be made."""
    admin = AdminServer(
        config.admin_socket,
        store.engine,
        endpoint,
        clock=clock,
    )
    try:
        await admin.start()
    except (OSError, AdminError) as exc:
        oplog_event(
            "admin_socket_failed",
            level=logging.WARNING,
            path=str(config.admin_socket),
            error=str(getattr(exc, "strerror", None) or exc),
        )
        return None
    return admin
