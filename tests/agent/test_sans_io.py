"""The agent core is sans-IO in fact: its modules import no I/O, no clock and no file
state, and the core runs on state kept in memory (the Protocols of files.py)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from mdeci.agent.core import AgentCore
from mdeci.agent.events import Register, SendFrame
from mdeci.agent.machine import State
from mdeci.frames import List, Subs, decode, encode
from tests.agent.memfiles import MemoryFiles
from tests.agent.test_machine import Walk

AGENT = Path(__file__).resolve().parents[2] / "mdeci" / "agent"
# The core and what it is made of; the glue (aio, media, api, daemon, ipmonitor, sms,
# the backends) and the file implementation (state) own the I/O.
CORE = (
    "core",
    "machine",
    "events",
    "files",
    "intake",
    "requests",
    "subscriptions",
    "offer",
    "outcomes",
    "backoff",
    "errors",
)
IO_MODULES = {"asyncio", "socket", "time", "os", "selectors", "threading", "fcntl", "pathlib"}
GLUE = {
    "mdeci.agent.aio",
    "mdeci.agent.state",
    "mdeci.agent.media",
    "mdeci.agent.quic_media",
    "mdeci.agent.api",
}


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


@pytest.mark.parametrize("module", CORE)
def test_core_modules_import_no_io_and_no_glue(module: str) -> None:
    imported = _imports(AGENT / f"{module}.py")
    assert {name.split(".")[0] for name in imported} & IO_MODULES == set()
    assert imported & GLUE == set()


def test_the_core_connects_on_files_kept_in_memory() -> None:
    walk = Walk()
    core: AgentCore = walk.core
    assert isinstance(walk.files, MemoryFiles)
    core.start(walk.now)
    assert core.next_command() == Register(600)
    walk.sip = Register(600)
    walk.answer_sip(0)  # REGISTER: 200, then INVITE
    walk.pump()
    walk.answer_sip(0)  # INVITE: 200, then the probe
    probe = [c for c in iter(core.next_command, None) if isinstance(c, SendFrame)]
    (frame,) = [decode(c.data) for c in probe]
    assert isinstance(frame, List)
    core.frame_received(walk.now, encode(Subs(req=frame.req)))
    assert core.state is State.CONNECTED and walk.files.nseq.store_id == "store-1"
