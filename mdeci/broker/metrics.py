"""The broker's Prometheus metrics and its health endpoints (``[metrics]``).

Theory of operation
-------------------
Counters move as events happen: :class:`MetricsSink` sits in front of the churn sink (as
:class:`mdeci.oplog.OperatorSink` does) and counts registrations, queued, delivered and
dropped notifications, sessions, moves, disconnections and SMS (count and spend). Values
that are state rather than events are read when Prometheus scrapes: sessions by state,
queue depth (total and deepest), live subscriptions and users come from one short read of
the store (timed: the database latency histogram), RUDP round-trip times from the live
associations. RUDP retransmissions and failures are summed over live associations plus
those already closed, so the counters never go back.

The HTTP server (aiohttp, already a dependency) answers ``/metrics`` (Prometheus text),
``/healthz`` (200 while the process serves) and ``/readyz`` (200 when the database
answers and the SIP endpoint is bound; 503 and the reason otherwise).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from mdeci.broker.db_health import DatabaseHealth
from mdeci.broker.sink import ChurnSink, FieldValue, Row, fields_emitter, rows_emitter
from mdeci.oplog import event as oplog_event
from mdeci.store import ops
from mdeci.store.errors import StoreError

if TYPE_CHECKING:
    # Imported when the endpoint starts: aiohttp is ~11 MB of a broker's memory, and most
    # brokers of a test or a small site run without [metrics].
    from aiohttp import web

log = logging.getLogger(__name__)
READY_TIMEOUT = 2.0  # seconds the readiness probe waits for the database


class BrokerMetrics:
    """Every metric of one broker, in its own registry (several brokers per process in
    tests). Names are documented in docs/operations.md "Metrics"."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.registrations = Counter(
            "mdeci_registrations", "REGISTER requests accepted (embedded registrar)", registry=r
        )
        self.published = Counter(
            "mdeci_notifications_published", "publications accepted (pub-ok)", registry=r
        )
        self.queued = Counter(
            "mdeci_notifications_queued", "notifications queued for a recipient", registry=r
        )
        self.delivered = Counter(
            "mdeci_notifications_delivered",
            "notifications acked by their recipient",
            ["channel"],
            registry=r,
        )
        self.dropped = Counter(
            "mdeci_notifications_dropped",
            "notifications dropped (overflow, sms: undeliverable by SMS, other)",
            ["reason"],
            registry=r,
        )
        self.sessions_started = Counter(
            "mdeci_sessions_started", "sessions set up (INVITE)", registry=r
        )
        self.moves = Counter("mdeci_moves", "re-INVITEs from a new address", registry=r)
        self.disconnections = Counter(
            "mdeci_disconnections", "RUDP associations given up (outage)", registry=r
        )
        self.sms_sent = Counter("mdeci_sms_sent", "notifications sent by SMS", registry=r)
        self.sms_spend = Counter("mdeci_sms_spend", "money spent on SMS ([sms] price)", registry=r)
        self.sessions = Gauge("mdeci_sessions", "stored sessions by state", ["state"], registry=r)
        self.queue_depth = Gauge("mdeci_queue_depth", "queued notifications, all users", registry=r)
        self.queue_depth_max = Gauge("mdeci_queue_depth_max", "the deepest user queue", registry=r)
        self.subscriptions = Gauge("mdeci_subscriptions", "live subscriptions", registry=r)
        self.users = Gauge("mdeci_users", "users in the store", registry=r)
        self.rudp_associations = Gauge(
            "mdeci_rudp_associations", "live RUDP associations", registry=r
        )
        self.rudp_rtt = Gauge(
            "mdeci_rudp_rtt_seconds", "smoothed RTT over live associations", ["stat"], registry=r
        )
        self.rudp_retransmissions = Counter(
            "mdeci_rudp_retransmissions", "RUDP retransmissions (timer and fast)", registry=r
        )
        self.rudp_failures = Counter(
            "mdeci_rudp_failures", "RUDP messages given up after max_retries", registry=r
        )
        self.db_latency = Histogram(
            "mdeci_db_query_seconds",
            "latency of the scrape's and the readiness probe's database reads",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
            registry=r,
        )
        self.db_up = Gauge("mdeci_db_up", "1 when the last database read succeeded", registry=r)
        for state in ("CONNECTED", "DISCONNECTED", "ENDED"):
            self.sessions.labels(state)
        for reason in ("overflow", "sms", "other"):
            self.dropped.labels(reason)
        # The labelled children of the per-notification counter, looked up once:
        # ``labels()`` per event is a measurable share of a delivery.
        self._delivered_ip = self.delivered.labels("ip")
        self._delivered_sms = self.delivered.labels("sms")
        for stat in ("mean", "max"):
            self.rudp_rtt.labels(stat)
        # RUDP counters last seen per live association (see the module docstring).
        self._rudp_seen: dict[int, tuple[int, int]] = {}

    def count(self, event: str, f: Mapping[str, FieldValue]) -> None:
        """Move the counters for one churn event."""
        if event == "registered":
            self.registrations.inc()
        elif event == "notify_queued" and f.get("channel") in (None, "ip"):
            self.queued.inc()
        elif event == "notify_delivered":
            (self._delivered_sms if f.get("channel") == "sms" else self._delivered_ip).inc()
        elif event == "notify_dropped":
            reason = f.get("reason")
            if f.get("channel") == "sms":
                self.dropped.labels("sms").inc()
            elif isinstance(reason, str) and reason.startswith("queue overflow"):
                self.dropped.labels("overflow").inc()
            else:
                self.dropped.labels("other").inc()
        elif event == "session_started":
            self.sessions_started.inc()
        elif event == "session_reinvited":
            if f.get("prev_addr") is not None and f.get("addr") != f.get("prev_addr"):
                self.moves.inc()
        elif event == "media_disconnected" and f.get("reason") != "session ended":
            self.disconnections.inc()  # an outage; a session ended is not one
        elif event == "sms_sent":
            self.sms_sent.inc()
            cost = f.get("cost")
            if isinstance(cost, int | float) and cost > 0:
                self.sms_spend.inc(cost)

    def count_rows(self, event: str, keys: tuple[str, ...], rows: Sequence[Row]) -> None:
        """:meth:`count` for a batch of events (see ``sink.emit_rows``). Queued and
        delivered notifications without a channel (ip) move their counter once, by the
        batch's count (an ``inc`` takes a lock); the others go one by one."""
        if "channel" not in keys:
            if event == "notify_queued":
                self.queued.inc(len(rows))
                return
            if event == "notify_delivered":
                self._delivered_ip.inc(len(rows))
                return
        for _, *values in rows:
            self.count(event, dict(zip(keys, values, strict=True)))

    def observe_rudp(self, peers: list[tuple[int, float | None, int, int]]) -> None:
        """Live associations as (id, srtt, retransmissions, failures)."""
        self.rudp_associations.set(len(peers))
        rtts = [srtt for _, srtt, _, _ in peers if srtt is not None]
        self.rudp_rtt.labels("mean").set(sum(rtts) / len(rtts) if rtts else 0.0)
        self.rudp_rtt.labels("max").set(max(rtts, default=0.0))
        seen: dict[int, tuple[int, int]] = {}
        for key, _, retrans, failed in peers:
            old_r, old_f = self._rudp_seen.get(key, (0, 0))
            if retrans >= old_r and failed >= old_f:
                self.rudp_retransmissions.inc(retrans - old_r)
                self.rudp_failures.inc(failed - old_f)
            else:  # a reset association: its counters started again
                self.rudp_retransmissions.inc(retrans)
                self.rudp_failures.inc(failed)
            seen[key] = (retrans, failed)
        self._rudp_seen = seen

    def observe_store(self, view: ops.Overview) -> None:
        for state in ("CONNECTED", "DISCONNECTED", "ENDED"):
            self.sessions.labels(state).set(view.sessions.get(state, 0))
        self.queue_depth.set(view.queue_total)
        self.queue_depth_max.set(view.queue_max)
        self.subscriptions.set(view.subscriptions)
        self.users.set(view.users)


class MetricsSink:
    """A churn sink in front of another: forwards every event and counts it."""

    def __init__(self, inner: ChurnSink, metrics: BrokerMetrics) -> None:
        self.inner = inner
        self.metrics = metrics
        self._inner_fields = fields_emitter(inner)
        self._inner_rows = rows_emitter(inner)

    def emit(self, event: str, uri: str, **fields: FieldValue) -> None:
        self.emit_fields(event, uri, fields)

    def emit_fields(self, event: str, uri: str, fields: Mapping[str, FieldValue]) -> None:
        """:meth:`emit` with the fields as one mapping (see ``sink.fields_emitter``)."""
        self._inner_fields(event, uri, fields)
        try:
            self.metrics.count(event, fields)
        except Exception:  # a metric must never stop delivery
            log.debug("metrics count failed", exc_info=True)

    def emit_rows(self, event: str, keys: tuple[str, ...], rows: Sequence[Row]) -> None:
        """Events handed over together (see ``sink.emit_rows``)."""
        self._inner_rows(event, keys, rows)
        try:
            self.metrics.count_rows(event, keys, rows)
        except Exception:  # a metric must never stop delivery
            log.debug("metrics count failed", exc_info=True)


@dataclass(slots=True)
class MetricsSources:
    """What the scrape and the probes read (given by :func:`mdeci.broker.app.run_broker`)."""

    engine: object  # sqlalchemy Engine (typed loosely: this module does not speak SQL)
    peers: Callable[[], list[tuple[int, float | None, int, int]]]
    published: Callable[[], int]
    sip_bound: Callable[[], bool]
    clock: Callable[[], float]
    health: DatabaseHealth = field(default_factory=DatabaseHealth)  # the broker's
    min_free_bytes: int = 0  # store.min_free_bytes: the readiness probe's free-space floor


class MetricsServer:
    """``/metrics``, ``/healthz``, ``/readyz`` on ``host:port``. :meth:`start`, :meth:`close`."""

    def __init__(self, metrics: BrokerMetrics, sources: MetricsSources) -> None:
        self.metrics = metrics
        self.sources = sources
        self._published_seen = 0
        self._runner: web.AppRunner | None = None
        self.local_addr: tuple[str, int] = ("", 0)

    async def start(self, host: str, port: int) -> tuple[str, int]:
        """Raises OSError when the address cannot be bound."""
        from aiohttp import web

        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        try:
            await site.start()
        except OSError:
            await self._runner.cleanup()
            raise
        server = site._server  # aiohttp keeps the bound socket there
        sockets = getattr(server, "sockets", None) or []
        bound = sockets[0].getsockname() if sockets else (host, port)
        self.local_addr = (str(bound[0]), int(bound[1]))
        return self.local_addr

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _read_store(self) -> ops.Overview:
        start = time.perf_counter()
        try:
            view = await asyncio.wait_for(
                asyncio.to_thread(ops.overview, self.sources.engine, self.sources.clock()),  # type: ignore[arg-type]
                READY_TIMEOUT,
            )
        except (StoreError, TimeoutError):
            self.metrics.db_up.set(0)
            raise
        self.metrics.db_latency.observe(time.perf_counter() - start)
        self.metrics.db_up.set(1)
        return view

    async def _metrics(self, _: web.Request) -> web.Response:
        from aiohttp import web  # loaded by start()

        published = self.sources.published()
        self.metrics.published.inc(max(0, published - self._published_seen))
        self._published_seen = published
        self.metrics.observe_rudp(self.sources.peers())
        try:
            self.metrics.observe_store(await self._read_store())
        except TimeoutError:
            oplog_event("database_error", level=logging.ERROR, where="metrics", error="timeout")
        except StoreError as exc:
            self.sources.health.failed("metrics", exc)
        else:
            self.sources.health.succeeded(wrote=False)
        body = generate_latest(self.metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _healthz(self, _: web.Request) -> web.Response:
        from aiohttp import web  # loaded by start()

        return web.Response(text="ok\n")

    async def _readyz(self, _: web.Request) -> web.Response:
        from aiohttp import web  # loaded by start()

        problems = []
        if not self.sources.sip_bound():
            problems.append("sip: not bound")
        start = time.perf_counter()
        try:
            await asyncio.wait_for(
                asyncio.to_thread(
                    ops.ping,
                    self.sources.engine,  # type: ignore[arg-type]
                    self.sources.clock(),
                    self.sources.min_free_bytes,
                ),
                READY_TIMEOUT,
            )
            self.metrics.db_latency.observe(time.perf_counter() - start)
            self.metrics.db_up.set(1)
            self.sources.health.succeeded()
        except TimeoutError:
            self.metrics.db_up.set(0)
            problems.append(f"database: no answer within {READY_TIMEOUT:g} s")
        except StoreError as exc:
            self.metrics.db_up.set(0)
            self.sources.health.failed("readyz", exc)
            problems.append(f"database: {str(exc).splitlines()[0][:200]}")
        if problems:
            return web.Response(status=503, text="not ready: " + "; ".join(problems) + "\n")
        return web.Response(text="ready\n")
