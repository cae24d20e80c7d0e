"""The churn log and the agent's own files on a disk that fills up.

Each run has a 1 MB tmpfs of its own, filled with ballast once the processes run (what
an operator deletes to free space). In the first, the broker's churn log is on it: alice
subscribes and stays online, bob publishes while the log cannot be written, the ballast
is deleted and bob publishes again. In the second, alice's state_dir is on it: alice
publishes, bob publishes to her, the ballast is deleted and bob publishes again. Each run
(once per module) is shared by the tests after it.
"""

from __future__ import annotations

import asyncio
import errno
import json
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from mdeci.agent.api import ApiClient
from tests.e2e.harness_a import (
    GUARD,
    Child,
    Tail,
    agent_toml,
    broker_toml,
    check_exactly,
    is_connected,
    start_agent,
    start_broker,
    stop,
    wait_status,
)
from tests.faults.children import start_all
from tests.faults.publisher import ApiLine
from tests.faults.tmpfs import Tmpfs

pytestmark = pytest.mark.slow

SIZE = "1m"
CHUNK = 4096
FULL = 20  # publishes while the churn log cannot be written
AFTER = 5  # publishes once space is freed
SUBJECT = "faults.churnlog"
RESEND_WAIT = 5.0  # seconds for alice's agent to record what it could not write, once it can


async def _delivered_logged(churn: Path, nseq: int) -> None:
    while True:
        records = [json.loads(line) for line in churn.read_bytes().splitlines()]
        if any(r["event"] == "notify_delivered" and r.get("nseq") == nseq for r in records):
            return
        await asyncio.sleep(0.05)


@dataclass(frozen=True)
class ChurnLogRun:
    published: list[str]  # texts bob's agent was answered ``published`` for, in order
    received: list[dict[str, Any]]
    log_before_free: bytes  # the churn log as it was while the disk was full
    log_after: bytes
    broker_stderr: str
    broker_alive: bool


def _fill(path: Path) -> None:
    """Write ``path`` until the disk refuses: no byte left for anyone else."""
    with path.open("wb", buffering=0) as out:
        for _ in range(1 << 16):  # bounded: 256 MB, far beyond any small tmpfs
            try:
                out.write(b"\0" * CHUNK)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
                return
    raise AssertionError(f"{path} never filled")


async def _publish(line: ApiLine, text: str) -> None:
    answer = await line.call({"op": "pub", "subject": SUBJECT, "text": text})
    assert answer.get("ok") and answer["state"] == "published", answer


async def _run(tmp: Path) -> ChurnLogRun:
    disk = Tmpfs(SIZE)
    broker: Child | None = None
    agents: list[Child] = []
    tail: Tail | None = None
    line: ApiLine | None = None
    churn = disk.path / "broker-churn.log"
    try:
        toml = broker_toml(tmp / "broker") + f'[churnlog]\npath = "{churn}"\n'
        broker, sip = await start_broker(tmp, toml)
        a_sock, b_sock = await start_all(
            agents,
            start_agent(tmp, "alice", agent_toml(tmp / "alice", "alice", "127.0.0.1", sip)),
            start_agent(tmp, "bob", agent_toml(tmp / "bob", "bob", "127.0.0.1", sip)),
        )
        await wait_status(a_sock, is_connected)
        await wait_status(b_sock, is_connected)
        async with ApiClient(a_sock) as client:
            await asyncio.wait_for(
                client.call({"op": "sub", "subject": SUBJECT, "ttl": 600}), GUARD
            )
        tail = await Tail(a_sock).start()
        line = await ApiLine.open(b_sock)

        ballast = disk.path / "ballast"
        _fill(ballast)
        published: list[str] = []
        for i in range(FULL):
            await _publish(line, f"f{i}")
            published.append(f"f{i}")
        await asyncio.wait_for(tail.wait_count(len(published)), GUARD)
        log_before_free = churn.read_bytes()

        ballast.unlink()  # the operator frees space
        for i in range(AFTER):
            await _publish(line, f"a{i}")
            published.append(f"a{i}")
        await asyncio.wait_for(tail.wait_count(len(published)), GUARD)
        await wait_status(a_sock, lambda s: s["highest_nseq"] >= len(published))
        # The broker logs a delivery when the agent's ack reaches it, after the agent
        # has the notification; the file gives no event to await, so it is read until
        # the last delivery is there (bounded by GUARD).
        await asyncio.wait_for(_delivered_logged(churn, len(published)), GUARD)
        return ChurnLogRun(
            published=published,
            received=list(tail.records),
            log_before_free=log_before_free,
            log_after=churn.read_bytes(),
            broker_stderr=broker.stderr(),
            broker_alive=broker.proc.returncode is None,
        )
    finally:
        if line is not None:
            await line.close()
        if tail is not None:
            await tail.close()
        for agent in agents:
            await stop(agent)
        if broker is not None:
            await stop(broker)
        disk.close()


@dataclass(frozen=True)
class AgentStateRun:
    refused: dict[str, Any]  # alice's answer to a publish while her state_dir is full
    alerts: dict[str, int]  # alice's alerts once bob's notifications came in meanwhile
    received_while_full: int
    published: list[str]  # bob's texts, in order
    received: list[dict[str, Any]]
    own_after_free: dict[str, Any]  # alice's answer to a publish once space is freed
    resent_without_reconnect: bool  # the unrecorded ones were handed over in the same session
    agent_stderr: str


async def _run_agent(tmp: Path) -> AgentStateRun:
    disk = Tmpfs(SIZE)
    broker: Child | None = None
    agents: list[Child] = []
    tail: Tail | None = None
    lines: list[ApiLine] = []
    try:
        broker, sip = await start_broker(tmp, broker_toml(tmp / "broker"))
        alice_toml = agent_toml(disk.path / "alice", "alice", "127.0.0.1", sip)
        a_sock, b_sock = await start_all(
            agents,
            start_agent(tmp, "alice", alice_toml),
            start_agent(tmp, "bob", agent_toml(tmp / "bob", "bob", "127.0.0.1", sip)),
        )
        await wait_status(a_sock, is_connected)
        await wait_status(b_sock, is_connected)
        async with ApiClient(a_sock) as client:
            await asyncio.wait_for(
                client.call({"op": "sub", "subject": SUBJECT, "ttl": 600}), GUARD
            )
        tail = await Tail(a_sock).start()
        alice = await ApiLine.open(a_sock)
        lines.append(alice)
        bob = await ApiLine.open(b_sock)
        lines.append(bob)

        ballast = disk.path / "ballast"
        _fill(ballast)
        refused = await alice.call({"op": "pub", "subject": SUBJECT + ".own", "text": "own0"})
        published: list[str] = []
        for i in range(AFTER):
            await _publish(bob, f"n{i}")
            published.append(f"n{i}")
        status = await wait_status(a_sock, lambda s: s["alerts"].get("state", 0) >= 2)
        received_while_full = len(tail.records)

        ballast.unlink()  # the operator frees space
        try:
            await asyncio.wait_for(tail.wait_count(len(published)), RESEND_WAIT)
            resent = True
        except TimeoutError:
            resent = False
        for i in range(AFTER, 2 * AFTER):
            await _publish(bob, f"n{i}")
            published.append(f"n{i}")
        own = await alice.call({"op": "pub", "subject": SUBJECT + ".own", "text": "own1"})
        if not resent:  # what gets the queue moving meanwhile: a new session
            await alice.close()
            lines.remove(alice)
            await tail.close()
            await stop(agents.pop(0))
            child, a_sock = await start_agent(tmp, "alice", alice_toml)
            agents.insert(0, child)
            tail = await Tail(a_sock).start()
        await asyncio.wait_for(tail.wait_count(len(published)), GUARD)
        return AgentStateRun(
            refused=refused,
            alerts=dict(status["alerts"]),
            received_while_full=received_while_full,
            published=published,
            received=list(tail.records),
            own_after_free=own,
            resent_without_reconnect=resent,
            agent_stderr=agents[0].stderr(),
        )
    finally:
        for line in lines:
            await line.close()
        if tail is not None:
            await tail.close()
        for agent in agents:
            await stop(agent)
        if broker is not None:
            await stop(broker)
        disk.close()


@pytest.fixture(scope="module")
def churn_full() -> Iterator[ChurnLogRun]:
    with tempfile.TemporaryDirectory(prefix="mdeci-faults-churnlog-") as tmp:
        yield asyncio.run(_run(Path(tmp)))


def test_delivery_goes_on_while_the_churn_log_cannot_be_written(churn_full: ChurnLogRun) -> None:
    check_exactly(churn_full.received, churn_full.published)
    assert churn_full.broker_alive


def test_a_churn_log_write_failure_is_logged_for_the_operator(churn_full: ChurnLogRun) -> None:
    errors = [line for line in churn_full.broker_stderr.splitlines() if "churnlog_error" in line]
    assert errors, churn_full.broker_stderr[-2000:]
    assert "No space left on device" in errors[0], errors[0]


def test_the_churn_log_resumes_once_space_is_freed(churn_full: ChurnLogRun) -> None:
    assert churn_full.log_after.startswith(churn_full.log_before_free)
    new = [
        json.loads(text)
        for text in churn_full.log_after[len(churn_full.log_before_free) :].splitlines()
    ]
    delivered = {r["nseq"] for r in new if r["event"] == "notify_delivered"}
    after = range(FULL + 1, FULL + AFTER + 1)  # the nseq of the publishes after freeing space
    assert delivered >= set(after), new


def test_the_churn_log_holds_only_whole_lines(churn_full: ChurnLogRun) -> None:
    """A write the full disk cut short leaves no part of a line for the next to be glued to."""
    assert churn_full.log_after.endswith(b"\n")
    for text in churn_full.log_after.splitlines():
        json.loads(text)


@pytest.fixture(scope="module")
def agent_full() -> Iterator[AgentStateRun]:
    with tempfile.TemporaryDirectory(prefix="mdeci-faults-agentdisk-") as tmp:
        yield asyncio.run(_run_agent(Path(tmp)))


def test_a_publish_the_agent_cannot_record_is_refused_with_the_cause(
    agent_full: AgentStateRun,
) -> None:
    assert agent_full.refused.get("ok") is False, agent_full.refused
    assert "No space left on device" in agent_full.refused["error"], agent_full.refused
    assert agent_full.own_after_free.get("ok") is True, agent_full.own_after_free


def test_notifications_the_agent_cannot_record_are_not_handed_over_and_alerted(
    agent_full: AgentStateRun,
) -> None:
    assert agent_full.received_while_full == 0
    assert agent_full.alerts.get("state", 0) >= 1, agent_full.alerts


def test_nothing_is_lost_or_duplicated_once_the_agent_has_space_again(
    agent_full: AgentStateRun,
) -> None:
    check_exactly(agent_full.received, agent_full.published)


def test_unrecorded_notifications_come_again_without_a_new_session(
    agent_full: AgentStateRun,
) -> None:
    assert agent_full.resent_without_reconnect
