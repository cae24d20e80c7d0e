"""examples/ledger_app.py through mdeci.client against a real broker and agent: killed
mid-stream and restarted, its ledger holds every notification once, in order."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path

from tests.agent.farend import GUARD
from tests.client.conftest import Deployment

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "examples" / "ledger_app.py"


async def start_app(dep: Deployment, cursor: Path, until: int) -> asyncio.subprocess.Process:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(APP),
        "--socket",
        str(dep.socket),
        "--cursor",
        str(cursor),
        "--filter",
        "Stock == 'PETR4'",
        "--work",
        "0.1",  # 1.5 s for a burst of 15: the kill lands in the middle of it
        "--until",
        str(until),
        stdout=asyncio.subprocess.PIPE,
        env=env,
    )
    assert proc.stdout is not None
    first = await asyncio.wait_for(proc.stdout.readline(), GUARD)
    assert first.startswith(b"ready "), first
    return proc


async def publish(dep: Deployment, texts: list[str]) -> list[str]:
    ids = []
    for text in texts:
        result = await asyncio.wait_for(
            dep.bob.publish("stocks.br", {"Stock": "PETR4"}, text.encode()), GUARD
        )
        assert result.state == "published"
        ids.append(result.msg_id)
    return ids


async def test_ledger_app_killed_mid_stream_resumes_without_loss_or_repeat(
    deployment: Deployment, tmp_path: Path
) -> None:
    cursor = tmp_path / "app" / "cursor.json"
    app = await start_app(deployment, cursor, until=30)
    ids = await publish(deployment, [f"m{i}" for i in range(15)])
    assert app.stdout is not None
    for _ in range(5):  # the app is busy with the burst: kill it in the middle
        line = await asyncio.wait_for(app.stdout.readline(), GUARD)
        assert line.startswith(b"got ")
    app.send_signal(signal.SIGKILL)
    assert await asyncio.wait_for(app.wait(), GUARD) == -signal.SIGKILL
    before = json.loads(cursor.read_text())["state"]["ledger"]
    assert 5 <= len(before) < 15  # stopped mid-stream

    ids += await publish(deployment, [f"m{i}" for i in range(15, 30)])  # while it is down
    again = await start_app(deployment, cursor, until=30)
    assert await asyncio.wait_for(again.wait(), GUARD) == 0

    ledger = json.loads(cursor.read_text())["state"]["ledger"]
    assert [entry["msg_id"] for entry in ledger] == ids
    assert [entry["text"] for entry in ledger] == [f"m{i}" for i in range(30)]
    assert [entry["nseq"] for entry in ledger] == list(range(1, 31))
    # One subscription: the restart found it instead of subscribing twice.
    subs = await deployment.alice.agent.list_subscriptions()
    assert len(subs) == 1
