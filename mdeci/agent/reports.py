"""What the agent core's events do outside it (sans-IO): churn log lines, counts and the
recent records, the listeners' records, the results of pending requests, and a log line
for every alert.

The handles are the adapter's (``mdeci.agent.aio``: asyncio futures and queues); this
module only calls the methods the protocols below name. The churn log is injected once
opened; a failure to write it is the core's ``last_error`` (``on_churn_error``).
"""

from __future__ import annotations

import logging
from collections import Counter, deque
from collections.abc import Callable, Mapping
from typing import Any, Generic, Protocol, TypeVar

from mdeci.agent.errors import NotConnected
from mdeci.agent.events import (
    Alert,
    ChurnRecord,
    CoreEvent,
    Delivered,
    LeaseRenewed,
    LimitNotice,
    RequestDone,
    RequestFailed,
    StateChanged,
    StoreReplaced,
    SubscriptionChanged,
)
from mdeci.agent.machine import Status
from mdeci.churnlog import Event
from mdeci.errors import ChurnLogError
from mdeci.frames import Frame

log = logging.getLogger("mdeci.agent")

RECENT_EVENTS = 2048  # churn records kept for wait_event (bounded)


class Request(Protocol):
    """A pending request's handle (an asyncio future)."""

    def done(self) -> bool: ...

    def set_result(self, result: Frame, /) -> None: ...

    def set_exception(self, exception: BaseException, /) -> None: ...


class Listener(Protocol):
    """A ``tail`` listener's handle (an asyncio queue)."""

    def put_nowait(self, item: dict[str, Any], /) -> None: ...


class ChurnWriter(Protocol):
    """The churn log (``mdeci.churnlog.ChurnLog``)."""

    def append(
        self, event: Event | str, uri: str, fields: Mapping[str, object], /
    ) -> dict[str, Any]: ...


R = TypeVar("R", bound=Request)
L = TypeVar("L", bound=Listener)


class Reports(Generic[R, L]):
    """The agent's record of its core's events, and who hears of them."""

    def __init__(self, aor: str, on_churn_error: Callable[[str], None]) -> None:
        self.aor = aor
        self.churn: ChurnWriter | None = None  # set once the churn log is open
        self.counts: Counter[str] = Counter()
        self.recent: deque[dict[str, Any]] = deque(maxlen=RECENT_EVENTS)
        self.requests: dict[int, R] = {}  # by request number
        self.listeners: set[L] = set()
        self._on_churn_error = on_churn_error

    def handle(self, event: CoreEvent) -> bool | None:
        """Carry ``event`` out; for a state change, whether the agent is connected now."""
        if isinstance(event, ChurnRecord):
            self.record(event.event, dict(event.fields))
        elif isinstance(event, Delivered):
            record = dict(event.record)  # one record for all the listeners
            self._tell(lambda: record)
        elif isinstance(event, RequestDone):
            request = self.requests.pop(event.req, None)
            if request is not None and not request.done():
                request.set_result(event.frame)
        elif isinstance(event, RequestFailed):
            request = self.requests.pop(event.req, None)
            if request is not None and not request.done():
                request.set_exception(event.error)
        elif isinstance(event, Alert):
            log.warning("%s: %s", event.kind, event.message)
        elif isinstance(event, StoreReplaced):
            log.warning(
                "broker store is now %s: %d subscription(s) sent again", event.new, event.restored
            )
            self._tell(lambda: {"store_replaced": event.new, "restored": event.restored})
        elif isinstance(event, SubscriptionChanged):
            level = logging.INFO if event.reason == "unsubscribed" else logging.WARNING
            what = "ended" if event.replaces is None else f"replaces {event.replaces}"
            log.log(level, "subscription %s (%s) %s: %s",
                    event.sub_id, event.subject, what, event.reason)  # fmt: skip
            self._tell(lambda: {"subscription": event.to_json()})
        elif isinstance(event, LeaseRenewed):
            log.debug("subscription %s renewed until %.3f", event.sub_id, event.expires_at)
        elif isinstance(event, LimitNotice):
            log.warning("broker limit: %s", event.frame)
        elif isinstance(event, StateChanged):
            return event.status is Status.CONNECTED
        return None

    def record(self, event: Event, fields: dict[str, Any]) -> None:
        """A churn log line (kept, and counted, even when the log cannot be written)."""
        fields = {k: v for k, v in fields.items() if v is not None}
        record: dict[str, Any] = {"event": str(event), "uri": self.aor, **fields}
        if self.churn is not None:
            try:
                record = self.churn.append(event, self.aor, fields)
            except ChurnLogError as exc:
                self._on_churn_error(str(exc))
        self.counts[str(event)] += 1
        self.recent.append(record)

    def close(self) -> None:
        """Fail every pending request: the agent is shutting down."""
        for request in self.requests.values():
            if not request.done():
                request.set_exception(NotConnected("the agent is shutting down"))

    def _tell(self, make: Callable[[], dict[str, Any]]) -> None:
        for listener in list(self.listeners):
            listener.put_nowait(make())
