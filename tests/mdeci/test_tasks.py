"""A background task that fails is logged at once, with its traceback; a cancelled or
finished one says nothing."""

from __future__ import annotations

import asyncio
import logging

import pytest

from mdeci.tasks import spawn

LOG = logging.getLogger("tests.tasks")


class Broken(RuntimeError):
    pass


async def _fail() -> None:
    raise Broken("the delivery task's bug")


async def _wait_forever() -> None:
    await asyncio.Event().wait()


async def test_a_failed_task_is_logged_when_it_fails(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger="tests.tasks")
    task = spawn(_fail(), LOG, "delivery")
    await asyncio.wait([task])
    await asyncio.sleep(0)  # done callbacks run on the loop's next turn
    [record] = caplog.records
    assert record.getMessage() == "delivery failed"
    assert record.exc_info is not None and isinstance(record.exc_info[1], Broken)


async def test_a_cancelled_or_finished_task_logs_nothing(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="tests.tasks")
    waiting = spawn(_wait_forever(), LOG, "waiting")
    done = spawn(asyncio.sleep(0, result=7), LOG, "quick")
    waiting.cancel()
    await asyncio.wait([waiting, done])
    await asyncio.sleep(0)
    assert done.result() == 7
    assert caplog.records == []
