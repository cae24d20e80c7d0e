"""Interop with PJSIP (pjsua2 wheel), run in its own process (it aborts on misuse):
REGISTER with digest to our registrar, a call to our UAS with the inactive audio
placeholder + our application line, a move to another loopback address with re-REGISTER
and re-INVITE, then hang-up."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sip.sdp import parse_session
from tests.peers import missing
from tests.sip.interop.tools import Tool

pytestmark = pytest.mark.peer("pjsua2")
PEER = Path(__file__).with_name("pjsua_peer.py")


def _require_pjsua2() -> None:
    try:
        import pjsua2  # noqa: F401
    except ImportError:
        missing("pjsua2 (PJSIP Python binding)", "pip install pjsua2-python")


def test_pjsua_register_call_move_hangup(tmp_path: Path) -> None:
    _require_pjsua2()
    users = tmp_path / "users.txt"
    users.write_text("dev1 pj-secret\n")
    registrar = Tool(
        "registrar", "--listen", "127.0.0.1:0", "--domain", "example.org", "--users", str(users)
    )
    uas = Tool("uas", "--listen", "127.0.0.1:0")
    try:
        reg = f"{registrar.addr[0]}:{registrar.addr[1]}"
        target = f"{uas.addr[0]}:{uas.addr[1]}"
        run = subprocess.run(
            [sys.executable, str(PEER), reg, target, "dev1", "pj-secret", "example.org",
             "127.0.0.3"],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        events = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
        steps = {e["event"]: e for e in events}
        assert run.returncode == 0, run.stdout + run.stderr
        assert not [e for e in events if e["event"] == "error"], events
        assert steps["registered"]["ok"] and steps["confirmed"]["ok"], events
        assert steps["reregistered"]["ok"] and steps["reinvited"]["ok"], events
        assert steps["hungup"]["ok"], events
        # The registrar challenged (401) before it accepted (200), both times.
        codes = [e["code"] for e in events if e["event"] == "reg_state"]
        assert codes.count(200) >= 2, codes
        # Our answers: audio kept as an inactive placeholder, our line accepted.
        answers = [e["sdp"] for e in events if e["event"] == "answer"]
        assert len(answers) >= 2
        for sdp in answers:
            assert "m=audio" in sdp and "a=inactive" in sdp
            assert parse_session(sdp).port == 40000
        # The UAS saw the move: the second offer names the new address, o= version 2.
        first = uas.expect(r"^offer ")
        second = uas.expect(r"^offer ")
        assert "media=127.0.0.2:" in first and "version=1" in first
        assert "media=127.0.0.3:" in second and "version=2" in second
        uas.expect(r"^refreshed ")
        uas.expect(r"^ended ")
        registrar.expect(r"registered sip:dev1@example\.org .*127\.0\.0\.3")
    finally:
        registrar.stop()
        uas.stop()
