"""``mdeci sub --class`` and ``mdeci pub --class`` through ``mdeci.cli.main`` against a
running agent with ``[network]`` and ``[calendar]``: a bulk publish made on the costly
network is held and goes once the agent moves to Wi-Fi; an urgent one goes at once."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from mdeci.agent import ApiClient, RunningAgent, run_agent
from mdeci.broker import Broker
from mdeci.cli import main
from mdeci.config.agent import (
    AgentCalendarConfig,
    CalendarRuleConfig,
    NetworkConfig,
    NetworkKindConfig,
)
from mdeci.store.repo import BrokerStore
from tests.agent.farend import GUARD, FarEnd, agent_config, lo_only
from tests.broker.conftest import FakeClock, WaitingSink, make_broker

NETWORK = NetworkConfig(
    kinds=(
        NetworkKindConfig(kind="wifi", prefixes=("127.0.0.3/32",)),
        NetworkKindConfig(kind="cellular", price_per_mb=5.0, prefixes=("127.0.0.0/8",)),
    )
)
CALENDAR = AgentCalendarConfig(rules=(CalendarRuleConfig(channel="wifi", p=0.9),))


@pytest.fixture
async def far(store: BrokerStore, clock: FakeClock, sink: WaitingSink) -> AsyncIterator[FarEnd]:
    broker: Broker = make_broker(store, clock, sink)
    broker.classes = frozenset({"urgent", "normal", "bulk"})  # run_broker: [channels]
    end = await FarEnd(broker).start()
    try:
        yield end
    finally:
        await end.stop()


@pytest.fixture
async def running(tmp_path: Path, far: FarEnd) -> AsyncIterator[RunningAgent]:
    config = dataclasses.replace(
        agent_config(tmp_path / "alice", "alice", "127.0.0.2", far),
        network=NETWORK,
        calendar=CALENDAR,
    )
    agent = await run_agent(config, address_source=lo_only)
    try:
        await asyncio.wait_for(agent.wait_connected(), GUARD)
        yield agent
    finally:
        await agent.close()


async def cli(*argv: str) -> int:
    return await asyncio.wait_for(asyncio.to_thread(main, list(argv)), GUARD)


async def test_sub_and_pub_class_on_the_command_line(
    running: RunningAgent, far: FarEnd, store: BrokerStore, capsys: pytest.CaptureFixture[str]
) -> None:
    sock = str(running.config.api_socket)
    assert await cli("sub", "news.#", "--class", "bulk", "--socket", sock) == 0
    (row,) = store.subscriptions.list_subscriptions("sip:alice@localhost", 0.0)
    assert row.qclass == "bulk"
    capsys.readouterr()
    assert await cli("sub", "x.*", "--class", "vip", "--socket", sock) == 2
    assert "unknown queue class 'vip'" in capsys.readouterr().err

    async with ApiClient(running.config.api_socket) as client:
        stream = ApiClient(running.config.api_socket)
        async with stream:
            records = stream.tail(0)
            # On cellular, a bulk publish waits for the Wi-Fi the calendar expects.
            assert await cli("pub", "news.big", "--class", "bulk", "--socket", sock) == 3
            assert capsys.readouterr().out.startswith("held ")
            status = (await client.call({"op": "status"}))["status"]
            assert status["buffered"] == 1
            # An urgent one goes at once, and overtakes the held one.
            assert await cli("pub", "news.now", "--class", "urgent", "--socket", sock) == 0
            assert capsys.readouterr().out.startswith("published ")
            first = await asyncio.wait_for(anext(records), GUARD)
            assert first["subject"] == "news.now"
            # Wi-Fi: the held one goes.
            await asyncio.wait_for(running.move_to("127.0.0.3"), GUARD)
            second = await asyncio.wait_for(anext(records), GUARD)
            assert second["subject"] == "news.big"
            await records.aclose()
    # The best figures it reports: cellular's measured RTT (loopback) below the configured
    # 100 ms, reported with the move to Wi-Fi.
    core = running.agent.core
    assert core is not None and core.device.best["cellular"].latency_ms < 100.0
    report = far.broker.core.devices["sip:alice@localhost"]
    assert report.network == "wifi"
    assert {b.network: b.latency_ms < 100.0 for b in report.best} == {
        "cellular": True,
        "wifi": False,
    }


async def test_sub_in_order_on_the_command_line(running: RunningAgent, store: BrokerStore) -> None:
    sock = str(running.config.api_socket)
    assert await cli("sub", "news.#", "--in-order", "--socket", sock) == 0
    assert await cli("sub", "misc.#", "--socket", sock) == 0
    rows = store.subscriptions.list_subscriptions("sip:alice@localhost", 0.0)
    assert {r.subject: r.in_order for r in rows} == {"news.#": True, "misc.#": False}
    # The agent's record keeps it, so a restored subscription asks for it again.
    core = running.agent.core
    assert core is not None
    recorded = {k.subject: k.in_order for k in core.files.subs.items}
    assert recorded == {"news.#": True, "misc.#": False}


async def test_calendar_on_the_command_line(
    running: RunningAgent, store: BrokerStore, capsys: pytest.CaptureFixture[str]
) -> None:
    from mdeci.store.calendars import SqlCalendars

    sock = str(running.config.api_socket)
    argv = ("calendar", "--rule", "wifi:0.9:mon-fri:8-19", "--rule", "wifi:0.2:sat,sun")
    assert await cli(*argv, "--utc-offset", "60", "--socket", sock) == 0
    assert capsys.readouterr().out.strip() == "calendar kept: 2 rules"
    stored = SqlCalendars(store.engine).get("sip:alice@localhost")
    assert stored is not None and stored.utc_offset_minutes == 60
    week = stored.calendar()
    monday_9_local = 4 * 86400 + 8 * 3600.0  # 1970-01-05 was a Monday; 08:00 UTC
    assert week.probability("wifi", monday_9_local) == 0.9
    assert week.probability("wifi", monday_9_local + 5 * 86400) == 0.2  # Saturday
    with pytest.raises(SystemExit) as refused:  # a usage error: argparse, before any I/O
        main(["calendar", "--rule", "wifi", "--socket", sock])
    assert refused.value.code == 2
    assert "expected CHANNEL:P" in capsys.readouterr().err
    assert await cli("calendar", "--rule", "wifi:2", "--socket", sock) == 2
    assert "p must be within 0..1" in capsys.readouterr().err


async def test_expect_on_the_command_line_is_dated_and_the_agents_own(
    running: RunningAgent, store: BrokerStore, capsys: pytest.CaptureFixture[str]
) -> None:
    from mdeci.store.calendars import SqlCalendars

    sock = str(running.config.api_socket)
    before = time.time()
    assert await cli("calendar", "--expect", "wifi:1:10m:2h", "--socket", sock) == 0
    assert capsys.readouterr().out.strip() == "calendar kept: 1 rules"
    stored = SqlCalendars(store.engine).get("sip:alice@localhost")
    assert stored is not None
    (rule,) = stored.rules
    assert rule.start_at is not None and rule.end_at is not None
    assert before + 600 <= rule.start_at <= time.time() + 600
    assert rule.end_at - rule.start_at == 7200
    # The agent decides its own publishes with it, and sends it, not the [calendar], at
    # every session start after.
    core = running.agent.core
    assert core is not None and core.device.calendar is not None
    assert core.device.calendar.probability("wifi", rule.start_at) == 1.0
    assert core.device.calendar.probability("wifi", before) == 0.0
    again = core.device.calendar_frame(1)
    assert again is not None and [r.rule() for r in again.rules] == [rule]
    with pytest.raises(SystemExit):
        main(["calendar", "--expect", "wifi:1:soon", "--socket", sock])
    assert "'soon' is not a duration" in capsys.readouterr().err
    assert await cli("calendar", "--socket", sock) == 2
    assert "give at least one --rule or --expect" in capsys.readouterr().err


async def test_calendar_through_the_client_library(
    running: RunningAgent, store: BrokerStore
) -> None:
    from mdeci.client import BadRequest, Client
    from mdeci.store.calendars import SqlCalendars

    async with Client(running.config.api_socket) as client:
        kept = await client.send_calendar([{"channel": "wifi", "p": 0.6}], utc_offset_minutes=-60)
        assert kept == 1
        with pytest.raises(BadRequest, match="p must be within"):
            await client.send_calendar([{"channel": "wifi", "p": 3}])
    stored = SqlCalendars(store.engine).get("sip:alice@localhost")
    assert stored is not None and stored.utc_offset_minutes == -60
    assert stored.calendar().probability("wifi", 0.0) == 0.6
