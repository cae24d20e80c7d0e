"""The broker's view of the database: what a peer is told when it fails, and when the
operator's log hears about it.

One boundary for peers: every ``error`` frame and SIP answer the broker gives for a
store failure comes from :func:`mdeci.broker.refusal.refusal`, which carries a stable
code and the error's
:attr:`~mdeci.errors.StoreError.public` text, never the driver's text, the SQL, a host
or a port (those stay in the exception's message, for the log).

One owner of health: :class:`DatabaseHealth` hears every failure and every success of
the broker's database calls. The first failure of an outage writes ``database_error``
with the details; the failures after it in the same outage are only counted (a publisher
retrying at 50/s would otherwise write 50 lines a second); the first success after it
writes ``database_recovered`` with the outage's duration and that count. A read that
works does not end an outage of a full disk (reads go on where writes fail): only a
write does, so that a scrape between two refused publishes does not split the outage.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from mdeci.errors import StorageFull, StoreError
from mdeci.oplog import event as oplog_event


class DatabaseHealth:
    """Whether the broker's last database call failed, since when, and how often.

    Called from the database thread and the event loop alike, hence the lock.
    ``clock`` measures the outage (monotonic: a wall-clock step must not stretch it).
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._since: float | None = None  # when the current outage began
        self._kinds: set[type[StoreError]] = set()  # the causes logged in this outage
        self._failures = 0

    @property
    def failing(self) -> bool:
        """True from a failure until the next success."""
        return self._since is not None

    def failed(
        self,
        where: str,
        exc: StoreError,
        *,
        uri: str | None = None,
        method: str | None = None,
        source: str | None = None,
    ) -> None:
        """Report a failed database call made for ``where`` (a frame of ``uri``, a SIP
        ``method`` from ``source``); logs ``database_error`` at the first failure of an
        outage (and at the first of each other cause in it)."""
        with self._lock:
            if self._since is None:
                self._since = self._clock()
            self._failures += 1
            first = type(exc) not in self._kinds
            self._kinds.add(type(exc))
        if first:
            oplog_event(
                "database_error",
                level=logging.ERROR,
                where=where,
                error=str(exc),
                uri=uri,
                method=method,
                source=source,
            )

    def succeeded(self, *, wrote: bool = True) -> None:
        """Report a database call that worked (``wrote``: it committed a write); logs
        ``database_recovered`` if it ends an outage."""
        if not self.failing:  # the common case takes no lock
            return
        with self._lock:
            since, failures = self._since, self._failures
            if since is None or (not wrote and StorageFull in self._kinds):
                return
            self._since, self._failures = None, 0
            self._kinds.clear()
        oplog_event(
            "database_recovered",
            level=logging.WARNING,
            outage_s=round(self._clock() - since, 3),
            failures=failures,
        )
