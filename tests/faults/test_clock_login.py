# ruff: noqa: F811 - the store fixture of test_clock_cores is imported by name
"""A failed-login lockout across a wall-clock jump: a lockout is a duration, so a clock
set forward must not end it (docs/faults.md, "Clock jumps")."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from mdeci.store.repo import BrokerStore
from sip.errors import SipError
from tests.broker.conftest import FakeClock, WaitingSink
from tests.broker.test_service import GUARD
from tests.broker.test_sip_endpoint import Device, open_device, start_broker
from tests.faults.test_clock_cores import store  # noqa: F401 - fixture
from tests.store.conftest import sqlite_path, sqlite_template  # noqa: F401 - fixtures

HOUR = 3600.0


async def test_a_forward_wall_clock_jump_does_not_end_a_login_lockout(
    tmp_path: Path, store: BrokerStore
) -> None:
    clock = FakeClock()
    running = await start_broker(tmp_path, store, clock, WaitingSink())
    devices: list[Device] = []
    try:
        guesser = await open_device(devices, "alice", "127.0.0.2", password="guess")
        for _ in range(5):  # the default ThrottleConfig locks after 5 failures, for 30 s
            with pytest.raises(SipError):
                await asyncio.wait_for(guesser.ua.register(running.sip_addr, 600), GUARD)
        # The right password from the locked address (a new port) is not checked.
        honest = await open_device(devices, "alice", "127.0.0.2")
        with pytest.raises(SipError):
            await asyncio.wait_for(honest.ua.register(running.sip_addr, 600), GUARD)
        clock.advance(HOUR)  # NTP steps the clock; no time has passed
        with pytest.raises(SipError):
            await asyncio.wait_for(honest.ua.register(running.sip_addr, 600), GUARD)
    finally:
        for device in devices:
            await device.close()
        await running.close()
