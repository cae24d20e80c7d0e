"""A PJSIP (pjsua2) device against the broker: REGISTER with digest to the embedded
registrar, INVITE to sip:broker with the inactive audio placeholder + our line, a move
to 127.0.0.3 with re-REGISTER and a re-INVITE (challenged again), then BYE. The device
runs in its own process (tests/sip/interop/pjsua_peer.py): pjsua2 aborts on misuse."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

from mdeci.broker.app import RunningBroker
from mdeci.store.repo import BrokerStore
from mdeci.store.sessions import SessionStatus
from tests.broker.conftest import WaitingSink
from tests.broker.test_sip_endpoint import ALICE, PASSWORDS, running  # noqa: F401
from tests.peers import missing

pytestmark = pytest.mark.peer("pjsua2")
PEER = Path(__file__).resolve().parents[1] / "sip" / "interop" / "pjsua_peer.py"
ROOT = Path(__file__).resolve().parents[2]


async def test_pjsua_device_registers_calls_moves_and_hangs_up(
    running: RunningBroker,  # noqa: F811
    store: BrokerStore,
    sink: WaitingSink,
) -> None:
    try:
        import pjsua2  # noqa: F401
    except ImportError:
        missing("pjsua2 (PJSIP Python binding)", "pip install pjsua2-python")
    broker = f"{running.sip_addr[0]}:{running.sip_addr[1]}"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(PEER), broker, broker, "alice", PASSWORDS["alice"], "example.org",
        "127.0.0.3", cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        out, err = await asyncio.wait_for(proc.communicate(), 120)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    events = [json.loads(line) for line in out.decode().splitlines() if line.startswith("{")]
    steps = {e["event"]: e for e in events}
    assert proc.returncode == 0, out.decode() + err.decode()
    assert not [e for e in events if e["event"] == "error"], events
    assert steps["registered"]["ok"] and steps["confirmed"]["ok"], events
    assert steps["reregistered"]["ok"] and steps["reinvited"]["ok"], events
    assert steps["hungup"]["ok"], events

    started = await sink.wait_for("session_started", ALICE)
    assert started.fields["addr"] == "127.0.0.2:43001"
    reinvited = await sink.wait_for("session_reinvited", ALICE)
    assert reinvited.fields["addr"] == "127.0.0.3:43002"
    assert reinvited.fields["prev_addr"] == "127.0.0.2:43001"
    await sink.wait_for("session_ended", ALICE)
    session = store.sessions.get_session(ALICE)
    assert session is not None and session.status is SessionStatus.ENDED
    assert session.remote_sdp.count("m=") == 2  # the placeholder audio line, then ours
    registered = [e for e in sink.named("registered") if e.uri == ALICE]
    assert any(str(e.fields["addr"]).startswith("127.0.0.3:") for e in registered)
