"""A broker whose wall clock jumps one hour forward mid-stream, as NTP makes it jump.

The broker runs under Debian's libfaketime with its offset read from a file at every
clock read (``FAKETIME_TIMESTAMP_FILE`` + ``FAKETIME_NO_CACHE=1``); the monotonic clock
is left alone (``FAKETIME_DONT_FAKE_MONOTONIC=1``), so only ``time.time()`` jumps. The
agents run on the real clock. alice subscribes to ``clock.short`` with a TTL of 30
minutes (longer than the test, shorter than the jump) and to ``clock.long`` with a TTL of
2 hours; bob publishes alternately to both, and the offset goes from +0 to +3600 s
half-way, then a few more to ``clock.long`` once the jump expired both registrations.
docs/faults.md ("Clock jumps") says what must happen: the short subscription expires at
the jump (TTLs are absolute wall-clock times), the long one matches throughout, nothing
accepted is lost or duplicated, and neither session drops, not even when the bindings
expire (every timer of the session runs on the monotonic clock).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from mdeci.agent.api import ApiClient
from tests.e2e.harness_a import (
    GUARD,
    Child,
    agent_toml,
    api_status,
    broker_toml,
    check_exactly,
    is_connected,
    spawn,
    start_agent,
    wait_status,
)
from tests.faults.children import Run

LIBFAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        shutil.which("faketime") is None or not LIBFAKETIME.exists(),
        reason="Debian's faketime (libfaketime) is not installed",
    ),
]

JUMP = 3600.0
SHORT_TTL = 1800  # outlives the test, not the jump
LONG_TTL = 7200  # outlives both
PER_PHASE = 20  # publishes to each subject before and after the jump
AFTER_EXPIRY = 5  # publishes to clock.long once the jump expired the registrations
EXPIRY_POLL = 0.1  # the churn log is a file: read again until the sweep's lines are in
SESSION_WORDS = ("session_ended", "media_disconnected", "session_started")


@dataclass(frozen=True)
class JumpRun:
    short_expires_at: float  # the broker's answer to the sub, before the jump
    real_at_sub: float  # the test's (unfaked) time.time() then
    matched: list[tuple[str, int]]  # (text, matched) of each publish, in order
    states: list[str]  # the agent's state answer to each publish
    received: list[dict[str, Any]]
    subs_after: list[str]  # alice's live subscriptions after the jump
    ended_after: list[str]  # those the agent lists as ended
    before: dict[str, dict[str, Any]]  # agents' status before the jump
    after: dict[str, dict[str, Any]]  # and after the last delivery
    broker_churn: list[dict[str, Any]]
    broker_alive: bool


def _subject(i: int) -> str:
    if i >= 4 * PER_PHASE:
        return "clock.long"
    return "clock.short" if i % 2 == 0 else "clock.long"


def _text(i: int) -> str:
    return f"{_subject(i).rpartition('.')[2]}-{i}"


def _set_offset(offset_file: Path, offset: str) -> None:
    # libfaketime reads the file at every clock read and takes an empty file for the real
    # clock: write_text's truncate-then-write would let a read in between step back an hour.
    staged = offset_file.with_suffix(".new")
    staged.write_text(f"{offset}\n")
    staged.replace(offset_file)


def _faketime_prefix(offset_file: Path) -> list[str]:
    return [
        "env",
        f"LD_PRELOAD={LIBFAKETIME}",
        f"FAKETIME_TIMESTAMP_FILE={offset_file}",
        "FAKETIME_NO_CACHE=1",
        # libfaketime's default wraps every timed wait of a thread (the store worker's
        # hand-offs) in a slow monotonic fix-up: ~80 ms per hand-off instead of < 1 ms,
        # enough to time sessions out on its own.
        "FAKETIME_FORCE_MONOTONIC_FIX=0",
        "FAKETIME_DONT_FAKE_MONOTONIC=1",
    ]


async def _start_faked_broker(tmp: Path, offset_file: Path) -> tuple[Child, tuple[str, int]]:
    config = tmp / "broker.toml"
    config.write_text(broker_toml(tmp / "broker"))
    child = await spawn(
        "broker",
        ["broker", "--config", str(config), "--listen-sip", "127.0.0.1:0",
         "--listen-media", "127.0.0.1:0"],
        tmp / "logs",
        prefix=_faketime_prefix(offset_file),
    )  # fmt: skip
    assert child.ready.split()[:2] == ["broker", "listening"], child.ready
    host, _, port = child.words["sip"].rpartition(":")
    return child, (host, int(port))


def _churn(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


async def _until_logged(path: Path, event: str, count: int) -> None:
    while sum(1 for r in _churn(path) if r["event"] == event) < count:
        await asyncio.sleep(EXPIRY_POLL)


async def _run(tmp: Path) -> JumpRun:
    offset_file = tmp / "faketime"
    _set_offset(offset_file, "+0")
    async with Run(tmp) as run:
        broker, sip = await run.child(_start_faked_broker(tmp, offset_file))
        (_, a_sock), (_, b_sock) = await run.agents(
            start_agent(tmp, "alice", agent_toml(tmp / "alice", "alice", "127.0.0.1", sip)),
            start_agent(tmp, "bob", agent_toml(tmp / "bob", "bob", "127.0.0.1", sip)),
        )
        await wait_status(a_sock, is_connected)
        await wait_status(b_sock, is_connected)
        async with ApiClient(a_sock) as client:
            real_at_sub = time.time()
            short = await asyncio.wait_for(
                client.call(
                    {"op": "sub", "subject": "clock.short", "ttl": SHORT_TTL, "lease": False}
                ),
                GUARD,
            )
            await asyncio.wait_for(
                client.call(
                    {"op": "sub", "subject": "clock.long", "ttl": LONG_TTL, "lease": False}
                ),
                GUARD,
            )
        tail = await run.tail(a_sock)
        before = {"alice": await api_status(a_sock), "bob": await api_status(b_sock)}

        line = await run.line(b_sock)
        matched: list[tuple[str, int]] = []
        states: list[str] = []
        churn = tmp / "broker" / "broker-churn.log"
        for i in range(4 * PER_PHASE + AFTER_EXPIRY):
            if i == 2 * PER_PHASE:
                _set_offset(offset_file, f"+{JUMP:.0f}")  # mid-stream: NTP steps the clock
            if i == 4 * PER_PHASE:
                # The bindings (600 s) are past their expiry on the broker's clock: its
                # sweep (every 5 s) removes them; the sessions must not mind.
                await asyncio.wait_for(_until_logged(churn, "registration_expired", 2), GUARD)
            answer = await line.call(
                {"op": "pub", "subject": _subject(i), "attrs": {"i": i}, "text": _text(i)}
            )
            assert answer.get("ok"), answer
            states.append(str(answer["state"]))
            matched.append((_text(i), int(answer["matched"])))

        expected = sum(1 for _, m in matched if m)
        await asyncio.wait_for(tail.wait_count(expected), GUARD)
        async with ApiClient(a_sock) as client:
            listed = await asyncio.wait_for(client.call({"op": "subs"}), GUARD)
        after = {"alice": await api_status(a_sock), "bob": await api_status(b_sock)}
        return JumpRun(
            short_expires_at=float(short["expires_at"]),
            real_at_sub=real_at_sub,
            matched=matched,
            states=states,
            received=list(tail.records),
            subs_after=[str(s["subject"]) for s in listed["items"] if s["state"] != "ended"],
            ended_after=[str(s["subject"]) for s in listed["items"] if s["state"] == "ended"],
            before=before,
            after=after,
            broker_churn=_churn(churn),
            broker_alive=broker.proc.returncode is None,
        )


@pytest.fixture(scope="module")
def jump() -> Iterator[JumpRun]:
    with tempfile.TemporaryDirectory(prefix="mdeci-faults-clock-") as tmp:
        yield asyncio.run(_run(Path(tmp)))


def test_the_broker_ran_on_the_faked_wall_clock(jump: JumpRun) -> None:
    # expires_at is the broker's wall clock + TTL: before the jump that is the real time.
    assert abs(jump.short_expires_at - (jump.real_at_sub + SHORT_TTL)) < 30
    stamps = [datetime.fromisoformat(r["ts"]).timestamp() for r in jump.broker_churn]
    assert stamps, "the broker wrote no churn log"
    # The churn log is stamped with the wall clock: one step of about an hour, in order.
    steps = [b - a for a, b in itertools.pairwise(stamps)]
    assert len([s for s in steps if s >= JUMP - 60]) == 1, steps
    assert min(steps) >= 0
    assert jump.broker_alive


def test_nothing_accepted_is_lost_or_duplicated_across_the_jump(jump: JumpRun) -> None:
    assert set(jump.states) == {"published"}
    expected = [text for text, m in jump.matched if m]
    check_exactly(jump.received, expected)
    print(
        f"\nclock jump +{JUMP:.0f} s mid-stream: {len(jump.matched)} published, "
        f"{len(expected)} delivered exactly once in order"
    )


def test_a_ttl_shorter_than_the_jump_ends_at_the_jump(jump: JumpRun) -> None:
    half = 2 * PER_PHASE
    short_before = [m for t, m in jump.matched[:half] if t.startswith("short")]
    short_after = [m for t, m in jump.matched[half : 2 * half] if t.startswith("short")]
    assert short_before == [1] * PER_PHASE
    assert short_after == [0] * PER_PHASE
    assert jump.subs_after == ["clock.long"]
    assert jump.ended_after == ["clock.short"]
    expired = [r for r in jump.broker_churn if r["event"] == "subscription_expired"]
    assert len(expired) == 1, expired


def test_a_ttl_longer_than_the_jump_matches_throughout(jump: JumpRun) -> None:
    longs = [m for t, m in jump.matched if t.startswith("long")]
    assert longs == [1] * (2 * PER_PHASE + AFTER_EXPIRY)


def test_no_session_drops_across_the_jump(jump: JumpRun) -> None:
    for name in ("alice", "bob"):
        before, after = jump.before[name], jump.after[name]
        assert after["status"] == "CONNECTED", after
        assert after["call_id"] == before["call_id"], (before, after)
        assert after["attempts"] == before["attempts"], (before, after)
        assert after["failed_attempts"] == before["failed_attempts"], (before, after)
    ended = [r for r in jump.broker_churn if r["event"] in SESSION_WORDS]
    assert [r["event"] for r in ended] == ["session_started", "session_started"], ended


def test_sessions_outlive_the_registrations_the_jump_expired(jump: JumpRun) -> None:
    expired = [r["uri"] for r in jump.broker_churn if r["event"] == "registration_expired"]
    assert sorted(expired) == ["sip:alice@localhost", "sip:bob@localhost"]
    late = [t for t, m in jump.matched[4 * PER_PHASE :] if m]
    assert len(late) == AFTER_EXPIRY
    texts = [r.get("text") for r in jump.received]
    assert texts[-AFTER_EXPIRY:] == late
