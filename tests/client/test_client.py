"""mdeci.client against a real broker and agent: results, typed errors, the cursor."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from mdeci.client import (
    AgentUnavailable,
    BadRequest,
    Client,
    CursorError,
    FileCursor,
    NotConnected,
    Position,
    PublishState,
    Refused,
)
from tests.agent.farend import GUARD
from tests.client.conftest import Deployment


async def test_publish_tells_accepted_and_buffered_apart(deployment: Deployment) -> None:
    async with Client(deployment.socket) as client:
        await client.subscribe("stocks.*")
        accepted = await asyncio.wait_for(client.publish("stocks.a", {"Price": 1}, "x"), GUARD)
        assert (accepted.state, accepted.accepted, accepted.matched) == (
            PublishState.ACCEPTED,
            True,
            1,
        )
        await deployment.stop_broker()
        await asyncio.wait_for(
            deployment.alice.agent.wait_until(
                lambda: deployment.alice.status().status.value != "CONNECTED"
            ),
            GUARD,
        )
        buffered = await asyncio.wait_for(client.publish("stocks.a", {"Price": 2}, b"y"), GUARD)
        assert (buffered.state, buffered.accepted) == (PublishState.BUFFERED, False)
        with pytest.raises(NotConnected):
            await client.subscribe("news.*")
        await deployment.start_broker()
        stream = await client.notifications()
        async with stream:
            await asyncio.wait_for(deployment.alice.wait_connected(), GUARD)
            got = await asyncio.wait_for(anext(stream), GUARD)
            if got.payload == b"x":  # its notification may have waited for the restart
                got = await asyncio.wait_for(anext(stream), GUARD)
        assert (got.msg_id, got.payload) == (buffered.msg_id, b"y")


async def test_typed_errors_for_bad_requests_and_refusals(deployment: Deployment) -> None:
    async with Client(deployment.socket) as client:
        with pytest.raises(BadRequest):
            await client.publish("no spaces allowed", {})
        with pytest.raises((BadRequest, Refused)) as info:
            await client.subscribe("stocks.*", "Price <")
        assert "position" in str(info.value) or "filter" in str(info.value)
    with pytest.raises(AgentUnavailable):
        async with Client(deployment.tmp / "nobody.sock"):
            pass


async def test_a_cursor_resumes_after_its_last_ack(deployment: Deployment, tmp_path: Path) -> None:
    path = tmp_path / "cursor.json"
    async with Client(deployment.socket) as client:
        await client.subscribe("stocks.*")
        stream = await client.notifications(FileCursor(path))
        for text in ("a", "b", "c"):
            await client.publish("stocks.a", {}, text)
        async with stream:
            first = await asyncio.wait_for(anext(stream), GUARD)
            await stream.ack(first, state={"done": [first.text]})
            second = await asyncio.wait_for(anext(stream), GUARD)
            assert second.text == "b"  # handed over, never acknowledged
        cursor = FileCursor(path)
        assert cursor.position is not None and cursor.position.nseq == first.nseq
        assert cursor.state == {"done": ["a"]}
        async with await client.notifications(cursor) as again:
            replayed = [(await asyncio.wait_for(anext(again), GUARD)).text for _ in range(2)]
        assert replayed == ["b", "c"]


def test_a_cursor_file_that_is_not_one_is_a_cursor_error(tmp_path: Path) -> None:
    path = tmp_path / "cursor.json"
    path.write_text("[1, 2]")
    with pytest.raises(CursorError):
        FileCursor(path)
    FileCursor(tmp_path / "new.json").save(Position("s", 3), {"k": 1})
    assert FileCursor(tmp_path / "new.json").position == Position("s", 3)
