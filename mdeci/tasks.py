"""Background tasks whose failure is logged when it happens.

asyncio reports an exception nobody retrieved only when the task is garbage-collected,
which may be much later or never; a broker's or agent's own task that fails is a bug the
operator must see at once, with its traceback.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def spawn(coro: Coroutine[Any, Any, T], log: logging.Logger, what: str) -> asyncio.Task[T]:
    """Run ``coro`` as a task; if it ends with an exception, ``log`` says ``what`` failed."""
    task = asyncio.get_running_loop().create_task(coro)
    task.add_done_callback(functools.partial(_report, log, what))
    return task


def _report(log: logging.Logger, what: str, task: asyncio.Task[Any]) -> None:
    if task.cancelled():
        return
    exc = task.exception()
    if exc is not None:
        log.error("%s failed", what, exc_info=exc)
