"""A list of link events that a test can await a condition on, instead of polling it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from mdeci.sms.link import LinkEvent


class EventLog:
    """Pass :meth:`append` as a runner's ``on_event``; await :meth:`wait_until`."""

    def __init__(self) -> None:
        self.items: list[LinkEvent] = []
        self._changed = asyncio.Event()

    def append(self, event: LinkEvent) -> None:
        self.items.append(event)
        self._changed.set()

    async def wait_until(self, predicate: Callable[[list[LinkEvent]], bool]) -> None:
        """Return once ``predicate(items)`` holds (checked after every new event)."""
        while not predicate(self.items):
            self._changed.clear()
            await self._changed.wait()
