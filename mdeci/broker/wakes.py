"""The broker's side of the wake-ups between brokers (mdeci/store/wake.py): a thread
listening on PostgreSQL, handing each user woken to the service.

A URI heard goes, on the database thread and in order with everything else, to
:meth:`~mdeci.broker.glue.Broker.queued_elsewhere`: that user's next delivery reads the
store, and the core's wake-up reaches the service as any publish's does (a user this
broker does not serve is ignored there). Each (re)connection of the listener does the
same for every user served, for what was published while nobody listened. A change of
the subscriptions by another broker (or a reconnection) reloads the matcher, on the
database thread, once for however many changes are queued.
"""

from __future__ import annotations

import asyncio
import threading

from mdeci.broker.service import BrokerService
from mdeci.store import wake


class WakeListener:
    """Listens for ``service``'s store on a thread of its own; :meth:`close` stops it."""

    def __init__(self, service: BrokerService) -> None:
        self._service = service
        self._loop = asyncio.get_running_loop()
        self._stop = threading.Event()
        self._listening = threading.Event()
        self._node = service.broker.store.node
        self._reloading = False  # a reload of the subscriptions is queued (coalesced)
        url = service.broker.store.engine.url
        self._thread = threading.Thread(
            target=wake.listen,
            args=(url, self._heard, self._connected, self._stop),
            kwargs={"on_subscriptions": self._subscriptions},
            name="mdeci-wakes",
            daemon=True,
        )

    def start(self) -> None:
        self._thread.start()

    async def listening(self) -> None:
        """Return once the first LISTEN is in place (tests, start-up)."""
        await asyncio.to_thread(self._listening.wait)

    async def close(self) -> None:
        self._stop.set()
        self._listening.set()
        await asyncio.to_thread(self._thread.join)

    def _heard(self, uri: str) -> None:  # on the listener's thread
        self._loop.call_soon_threadsafe(self._wake, uri)

    def _connected(self) -> None:  # on the listener's thread
        self._listening.set()
        self._loop.call_soon_threadsafe(self._wake_all)

    def _subscriptions(self, node: str) -> None:  # on the listener's thread
        if node != self._node:
            self._loop.call_soon_threadsafe(self._reload)

    def _reload(self) -> None:
        if not self._reloading:
            self._reloading = True
            self._service.worker.post("subscriptions", self._reload_now)

    def _reload_now(self) -> None:  # on the database thread
        self._reloading = False
        self._service.broker.reload_subscriptions()

    def _wake(self, uri: str) -> None:
        service = self._service
        service.worker.post("wake-up", service.broker.queued_elsewhere, uri)

    def _wake_all(self) -> None:
        self._reload()
        for uri in self._service.users():
            self._wake(uri)
