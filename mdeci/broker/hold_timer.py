"""The timer of the notifications held for a cheaper network: twice a second it looks
at the earliest wait's end (:attr:`NetworkHolds.earliest`, one attribute read on the
loop) and, once it has passed, the database thread releases what is due
(mdeci/broker/network_holds.py); the delivery then sends it on the network the device is
on. Nothing held: no call to the database thread (a call there every tick slowed a
fan-out measurably)."""

from __future__ import annotations

import asyncio
import contextlib

from mdeci.broker.glue import Broker
from mdeci.broker.worker import DbWorker

#: Seconds between looks: a held notification leaves at most this late.
HOLD_TICK = 0.5


class HoldTimer:
    """Calls :meth:`Broker.release_due` on the database thread every :data:`HOLD_TICK`."""

    def __init__(self, worker: DbWorker, broker: Broker, tick: float = HOLD_TICK) -> None:
        self._worker = worker
        self._broker = broker
        self._tick = tick
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="hold-timer")

    async def _run(self) -> None:
        core = self._broker.core
        while True:
            await asyncio.sleep(self._tick)
            holds = core.holds
            due = holds.earliest if holds is not None else None
            if due is not None and due <= core.clock():
                await self._worker.run(self._broker.release_due)

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
