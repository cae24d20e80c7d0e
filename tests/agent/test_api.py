"""The local API and the client commands, through ``mdeci.cli.main``, against a running
agent whose broker is the loopback far end."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from mdeci.agent import ApiClient, RunningAgent, run_agent
from mdeci.broker import Broker
from mdeci.cli import main
from mdeci.store.repo import BrokerStore
from tests.agent.farend import GUARD, FarEnd, agent_config, lo_only
from tests.broker.conftest import FakeClock, WaitingSink, make_broker


@pytest.fixture
async def far(store: BrokerStore, clock: FakeClock, sink: WaitingSink) -> AsyncIterator[FarEnd]:
    broker: Broker = make_broker(store, clock, sink)
    end = await FarEnd(broker).start()
    try:
        yield end
    finally:
        await end.stop()


@pytest.fixture
async def running(tmp_path: Path, far: FarEnd) -> AsyncIterator[RunningAgent]:
    agent = await run_agent(
        agent_config(tmp_path / "alice", "alice", "127.0.0.2", far), address_source=lo_only
    )
    try:
        await asyncio.wait_for(agent.wait_connected(), GUARD)
        yield agent
    finally:
        await agent.close()


async def cli(*argv: str) -> int:
    # main() runs its own event loop: in a thread, beside the agent's.
    return await asyncio.wait_for(asyncio.to_thread(main, list(argv)), GUARD)


async def test_client_commands(running: RunningAgent, capsys: pytest.CaptureFixture[str]) -> None:
    sock = str(running.config.api_socket)
    assert (
        await cli("sub", "stocks.*", "--filter", "price < 25", "--ttl", "600", "--socket", sock)
        == 0
    )
    out = capsys.readouterr().out
    assert out.startswith("subscribed ")
    sub_id = out.split()[1]

    assert await cli("subs", "--socket", sock) == 0
    table = capsys.readouterr().out
    assert sub_id in table and "stocks.*" in table and "price < 25" in table

    args = ("pub", "stocks.petr4", "--attr", "price=20", "--attr", "name=PETR4")
    assert await cli(*args, "--payload", "hi", "--socket", sock) == 0
    assert capsys.readouterr().out.startswith("published ")
    await running.agent.wait_event("notify_delivered", nseq=1)

    assert await cli("tail", "--from", "0", "--count", "1", "--socket", sock) == 0
    record = json.loads(capsys.readouterr().out)
    assert (record["nseq"], record["text"], record["attrs"]) == (
        1,
        "hi",
        {"price": 20, "name": "PETR4"},
    )

    assert await cli("status", "--socket", sock) == 0
    status = capsys.readouterr().out
    assert "CONNECTED" in status and "127.0.0.2" in status and "sip:alice@localhost" in status

    assert await cli("unsub", sub_id, "--socket", sock) == 0
    assert capsys.readouterr().out.strip() == f"unsubscribed {sub_id}"
    assert running.agent.subscriptions == ()


async def test_errors_are_one_line(
    running: RunningAgent, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sock = str(running.config.api_socket)
    assert await cli("sub", "bad..subject", "--socket", sock) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("mdeci sub: error: ") and "\n" not in err

    missing = tmp_path / "nobody.sock"
    assert await cli("status", "--socket", str(missing)) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"mdeci status: error: cannot reach the agent at {missing}: is `mdeci agent` running?"
    )


async def test_tail_streams_live_and_pub_buffers_when_down(
    running: RunningAgent, far: FarEnd
) -> None:
    async with ApiClient(running.config.api_socket) as client:
        await client.call({"op": "sub", "subject": "t.#"})
        stream = ApiClient(running.config.api_socket)
        async with stream:
            records = stream.tail(0)  # replays the inbox too: no race with the listener
            pending = asyncio.ensure_future(anext(records))
            answer = await client.call({"op": "pub", "subject": "t.x", "text": "live"})
            assert answer["state"] == "published"
            record = await asyncio.wait_for(pending, GUARD)
            assert record["text"] == "live"
            await records.aclose()
        await far.stop()
        answer = await client.call({"op": "pub", "subject": "t.y", "text": "later"})
        assert answer["state"] == "buffered"
        status = (await client.call({"op": "status"}))["status"]
        assert (status["status"], status["buffered"]) == ("DISCONNECTED", 1)
        subs = await client.call({"op": "subs"})
        assert subs["stale"] is True and [i["subject"] for i in subs["items"]] == ["t.#"]


async def test_sub_class_and_calendar_through_the_socket(
    running: RunningAgent, far: FarEnd, store: BrokerStore
) -> None:
    """An application names its subscription's queue class and sends the
    device's calendar through the API (what an ``mdeci agent`` process offers)."""
    from mdeci.agent.errors import ApiError
    from mdeci.store.calendars import SqlCalendars

    far.broker.classes = frozenset({"urgent", "normal", "bulk"})  # run_broker: [channels]
    async with ApiClient(running.config.api_socket) as client:
        await client.call({"op": "sub", "subject": "digest.*", "qclass": "bulk"})
        (row,) = store.subscriptions.list_subscriptions("sip:alice@localhost", 0.0)
        assert row.qclass == "bulk"
        with pytest.raises(ApiError, match="unknown queue class 'vip'"):
            await client.call({"op": "sub", "subject": "x.*", "qclass": "vip"})
        with pytest.raises(ApiError, match=r"rules\.p must be within 0\.\.1"):
            await client.call({"op": "calendar", "rules": [{"channel": "ip", "p": 2}]})
        with pytest.raises(ApiError, match="bad request"):
            await client.call({"op": "calendar", "rules": [{"channel": "ip", "x": 1}]})
        with pytest.raises(ApiError, match="'rules' must be a list of objects"):
            await client.call({"op": "calendar", "rules": "ip"})
        assert SqlCalendars(store.engine).get("sip:alice@localhost") is None  # unchanged
        rules = [{"channel": "ip", "p": 0.75, "weekdays": 0x1F, "start_hour": 8, "end_hour": 18}]
        done = await client.call({"op": "calendar", "rules": rules, "utc_offset_minutes": 60})
        assert done == {"ok": True, "rules": 1}
    stored = SqlCalendars(store.engine).get("sip:alice@localhost")
    assert stored is not None and stored.utc_offset_minutes == 60
    week = stored.calendar()  # epoch 0 is a Thursday; local time is UTC + 1 h
    assert week.probability("ip", 0.0) == 0.0  # 01:00 local
    assert week.probability("ip", 8 * 3600.0) == 0.75  # 09:00 local
