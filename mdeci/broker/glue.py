"""The broker core's store glue: carries out the sans-IO core's store commands.

Theory of operation
-------------------
:class:`~mdeci.broker.core.BrokerCore` decides and never touches the database: each of
its entry points that needs the store is a generator yielding typed store commands
(:class:`~mdeci.broker.delivery.AckMany`, :class:`~mdeci.broker.core.PublishMany`, ...).
:class:`Broker` drives one such step to its end in one synchronous call, on the
calling thread: it runs each command against the store, sends the result back in (or
throws the :class:`~mdeci.errors.StoreError` in: the core decides what a failure
means), and returns the step's answer. No hand-off per command or per message.

The queue calls for a user this broker holds (acks, delivery reads, overflow counts)
are fenced by the epoch it holds the user at (:mod:`mdeci.broker.fencing`): a user lost to
another broker gets nothing read and nothing deleted, and the fence hears of it.

After each call the glue hands each :class:`~mdeci.broker.delivery.Wake` the core
collected to the :class:`~mdeci.broker.delivery.QueueListener` (the service), and each
store failure and success to :class:`~mdeci.broker.db_health.DatabaseHealth`.

Threads: the service runs every call on its database thread (:mod:`mdeci.broker.worker`)
and calls :meth:`Broker.bind_thread`; from then on a call from any other thread raises
:class:`~mdeci.broker.errors.WrongThreadError` (a loud bug, not a silent race).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Any, TypeVar, cast

from mdeci.broker.addresses import Address
from mdeci.broker.config import BrokerCoreConfig
from mdeci.broker.core import (
    ActiveSubscriptions,
    AddSubscription,
    BrokerCore,
    ListSubscriptions,
    PrunePublished,
    PublishMany,
    PutCalendar,
    RemoveSubscription,
    RenewSubscription,
    StoreFailed,
    SweepExpired,
)
from mdeci.broker.db_health import DatabaseHealth
from mdeci.broker.delivery import (
    AckMany,
    CheckHeld,
    MissedMany,
    OutgoingNotify,
    PendingMany,
    QueueListener,
    RowClasses,
    Step,
    StoreCommand,
    TakeMissed,
)
from mdeci.broker.errors import WrongThreadError
from mdeci.broker.fencing import Fence, FencedQueues
from mdeci.broker.matcher import SubscriptionMatcher
from mdeci.broker.sink import ChurnSink
from mdeci.errors import FrameError, StoreError
from mdeci.frames import Frame
from mdeci.store.calendars import SqlCalendars
from mdeci.store.queue_rows import PublishResult, StoredRow
from mdeci.store.repo import BrokerStore
from mdeci.store.row_classes import row_classes
from mdeci.store.subscription_rows import Subscription

T = TypeVar("T")


# Carries out one store command; its result.
_Handler = Callable[[Any], object]


class Broker:
    """:class:`~mdeci.broker.core.BrokerCore` over ``store``; see the module docstring.

    ``clock`` gives UTC epoch seconds. Construction loads the live subscriptions into the
    matcher and raises :class:`StoreError` if the database fails.
    """

    def __init__(
        self,
        store: BrokerStore,
        config: BrokerCoreConfig,
        clock: Callable[[], float],
        log: ChurnSink | None = None,
    ) -> None:
        self.store = store
        self.core = BrokerCore(config, clock, log)
        self.health = DatabaseHealth()  # every database call of the broker reports to it
        self.listener: QueueListener | None = None
        self._on_owner: Callable[[], bool] | None = None  # see bind_thread
        # The delivery's queue calls, fenced once the service sets ``fence``.
        self.queues = FencedQueues(store)
        self._calendars = SqlCalendars(store.engine)
        # Each method looked up at each call (not bound once): a test may replace one.
        self._handlers: dict[type[StoreCommand[Any]], _Handler] = {
            AckMany: self.queues.ack_many,
            PendingMany: self.queues.pending_many,
            RowClasses: lambda c: row_classes(self.store.engine, c.uri, c.nseqs),
            CheckHeld: self.queues.check_held,
            MissedMany: lambda c: self.store.queues.missed_many(c.uris),
            TakeMissed: self.queues.take_missed,
            PublishMany: self._publish_many,
            PrunePublished: lambda c: self.store.queues.prune_published(c.before, c.limit),
            ActiveSubscriptions: lambda c: self.store.subscriptions.active_subscriptions(c.now),
            AddSubscription: lambda c: self.store.subscriptions.add_subscription(
                c.uri, c.subject, c.filter, c.ttl, c.now, c.qclass, in_order=c.in_order
            ),
            RemoveSubscription: lambda c: self.store.subscriptions.remove_subscription(
                c.uri, c.sub_id
            ),
            RenewSubscription: lambda c: self.store.subscriptions.renew_subscription(
                c.uri, c.sub_id, c.ttl, c.now
            ),
            ListSubscriptions: lambda c: self.store.subscriptions.list_subscriptions(c.uri, c.now),
            SweepExpired: lambda c: self.store.subscriptions.sweep_expired(c.now),
            PutCalendar: lambda c: self._calendars.put(c.uri, c.rules, c.utc_offset_minutes, c.now),
        }
        self._run(self.core.load())

    @property
    def fence(self) -> Fence | None:
        """The epochs this broker holds its users at (None: nothing is fenced)."""
        return self.queues.fence

    @fence.setter
    def fence(self, fence: Fence | None) -> None:
        self.queues.fence = fence
        self.core.fenced = fence is not None

    def _publish_many(self, command: PublishMany) -> tuple[list[PublishResult], list[StoredRow]]:
        written: list[StoredRow] = []
        results = self.store.queues.publish_many(
            command.requests,
            max_depth=command.max_depth,
            policy=command.policy,
            written=written,
        )
        return results, written

    # ------------------------------------------------------------------ driving

    def bind_thread(self, on_owner: Callable[[], bool] | None) -> None:
        """From now on the broker may be called only where ``on_owner()`` is true (the
        worker's ``on_thread``; None: anywhere)."""
        self._on_owner = on_owner

    def _owned(self) -> None:
        if self._on_owner is not None and not self._on_owner():
            raise WrongThreadError(
                "the broker core is bound to its database thread; called from another"
            )

    def _run(self, step: Step[T]) -> T:
        """Drive ``step`` to its end, carrying out each command it yields; its answer
        (or the StoreError it let through)."""
        handlers = self._handlers
        try:
            command = next(step)
            while True:
                try:
                    result = handlers[type(command)](command)
                except StoreError as exc:
                    command = step.throw(exc)
                else:
                    command = step.send(result)
        except StopIteration as stop:
            return cast(T, stop.value)
        finally:
            self._report()

    def _report(self) -> None:
        """Hand on what the core collected: health reports, then wake-ups."""
        core = self.core
        if core.health_events:
            reports, core.health_events = core.health_events, []
            for report in reports:
                if isinstance(report, StoreFailed):
                    self.health.failed(report.where, report.error, uri=report.uri)
                else:
                    self.health.succeeded(wrote=report.wrote)
        if core.events:
            wakes, core.events = core.events, []
            listener = self.listener
            if listener is not None:
                for kind, uri in wakes:
                    if kind == "queued":
                        listener.queued(uri)
                    else:
                        listener.acked(uri)

    # ------------------------------------------------------------------ the core's state

    @property
    def config(self) -> BrokerCoreConfig:
        return self.core.config

    @property
    def clock(self) -> Callable[[], float]:
        return self.core.clock

    @property
    def log(self) -> ChurnSink:
        """Where the core writes churn events (the service wraps it for the loop)."""
        return self.core.log

    @log.setter
    def log(self, sink: ChurnSink) -> None:
        self.core.log = sink

    @property
    def matcher(self) -> SubscriptionMatcher:
        return self.core.matcher

    @property
    def published(self) -> int:
        """Publications accepted since start (the metrics endpoint)."""
        return self.core.published

    @property
    def classes(self) -> frozenset[str]:
        """Queue classes a sub or pub may name (run_broker sets [channels]'s)."""
        return self.core.classes

    @classes.setter
    def classes(self, names: frozenset[str]) -> None:
        self.core.classes = names

    @property
    def sms_classes(self) -> frozenset[str]:
        """Those of :attr:`classes` that may use SMS."""
        return self.core.sms_classes

    @sms_classes.setter
    def sms_classes(self, names: frozenset[str]) -> None:
        self.core.sms_classes = names

    def release_due(self) -> None:
        """Send the notifications whose wait for a cheaper network ran out (a timer of
        the glue calls it; mdeci/broker/network_holds.py)."""
        self._owned()
        try:
            self.core.release_due()
        finally:
            self._report()

    # ------------------------------------------------------------------ frames

    def handle_frame(self, uri: str, data: bytes) -> list[Frame]:
        """:meth:`~mdeci.broker.core.BrokerCore.handle_frame`."""
        self._owned()
        return self._run(self.core.handle_frame(uri, data))

    def handle(self, uri: str, frame: Frame) -> list[Frame]:
        """:meth:`~mdeci.broker.core.BrokerCore.handle`."""
        self._owned()
        return self._run(self.core.handle(uri, frame))

    def handle_frames(self, batch: Sequence[tuple[str, bytes]]) -> list[list[Frame]]:
        """:meth:`~mdeci.broker.core.BrokerCore.handle_frames`."""
        self._owned()
        return self._run(self.core.handle_frames(batch))

    def handle_decoded(self, batch: Sequence[tuple[str, Frame | FrameError]]) -> list[list[Frame]]:
        """:meth:`~mdeci.broker.core.BrokerCore.handle_decoded`."""
        self._owned()
        return self._run(self.core.handle_decoded(batch))

    def handle_and_take(
        self, batch: Sequence[tuple[str, Frame | FrameError]], deliverable: Collection[str]
    ) -> tuple[list[list[Frame]], dict[str, list[OutgoingNotify]]]:
        """:meth:`~mdeci.broker.core.BrokerCore.handle_and_take`: one call, one hand-off."""
        self._owned()
        return self._run(self.core.handle_and_take(batch, deliverable))

    def sweep(self, now: float | None = None) -> list[Subscription]:
        """:meth:`~mdeci.broker.core.BrokerCore.sweep` (every user's next take reads the
        store: rows queued by another broker whose wake-up was lost are found there),
        then the fence's :meth:`~mdeci.broker.fencing.FencedQueues.check_all`."""
        self._owned()
        swept = self._run(self.core.sweep(now))
        self.queues.check_all()
        return swept

    def reload_subscriptions(self) -> None:
        """Read the live subscriptions again (another broker changed some)."""
        self._owned()
        self._run(self.core.load())

    def queued_elsewhere(self, uri: str) -> None:
        """:meth:`~mdeci.broker.delivery.Delivery.queued_elsewhere` (a wake-up from
        another broker, mdeci/store/wake.py)."""
        self._owned()
        fence = self.queues.fence
        if fence is not None and not fence.holds(uri):
            return  # every broker hears every wake-up; this user is another's
        self.core.queued_elsewhere(uri)
        self._report()

    def prune(self, now: float | None = None) -> int:
        """:meth:`~mdeci.broker.core.BrokerCore.prune`."""
        self._owned()
        return self._run(self.core.prune(now))

    # ------------------------------------------------------------------ delivery

    def flush_acks(self, uri: str | None = None) -> None:
        """:meth:`~mdeci.broker.delivery.Delivery.flush_acks`."""
        self._owned()
        self._run(self.core.flush_acks(uri))

    def forget_rows(self) -> None:
        """:meth:`~mdeci.broker.delivery.Delivery.forget_rows`."""
        self._owned()
        self.core.forget_rows()

    def in_flight(self, uri: str) -> tuple[int, ...]:
        """The nseqs sent to ``uri`` on this connection and not yet acked, in order."""
        self._owned()
        return self.core.in_flight(uri)

    def mark_connected(self, uri: str, addr: Address | None = None) -> None:
        """:meth:`~mdeci.broker.delivery.Delivery.mark_connected`."""
        self._owned()
        self._run(self.core.mark_connected(uri, addr))

    def mark_moved(self, uri: str, addr: Address) -> bool:
        """:meth:`~mdeci.broker.delivery.Delivery.mark_moved`."""
        self._owned()
        return self.core.mark_moved(uri, addr)

    def delivered_elsewhere(self, uri: str, nseq: int) -> None:
        """:meth:`~mdeci.broker.delivery.Delivery.delivered_elsewhere`."""
        self._owned()
        self.core.delivered_elsewhere(uri, nseq)

    def mark_disconnected(self, uri: str, reason: str) -> None:
        """:meth:`~mdeci.broker.delivery.Delivery.mark_disconnected`."""
        self._owned()
        self._run(self.core.mark_disconnected(uri, reason))

    def take_batch(self, uri: str) -> list[OutgoingNotify]:
        """The next notify frames for ``uri`` (:meth:`take_batches` for one user)."""
        return self.take_batches([uri]).get(uri, [])

    def take_batches(self, uris: Sequence[str]) -> dict[str, list[OutgoingNotify]]:
        """:meth:`~mdeci.broker.delivery.Delivery.take_batches`."""
        self._owned()
        return self._run(self.core.take_batches(uris))
