"""The broker rides through restarts of its PostgreSQL server.

A PostgreSQL server of the test's own (:mod:`tests.faults.pgserver`), a broker on it
(``python -m mdeci broker``), alice subscribed and bob publishing through his agent's local
API at 50 per second, retrying what is refused (docs/faults.md). The server is stopped
twice mid-stream, each time until the broker has logged a failed database call, and
started again; bob's agent is restarted at the end, with a last publish after it. The run
(once per module, shared by the tests below) keeps what alice received, what bob was
answered, what ``/readyz`` said and what the broker logged.

The normal suite publishes 200; the ``bench`` variant the 1,000 of the specification.
"""

from __future__ import annotations

import asyncio
import re
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from mdeci.agent.api import ApiClient
from tests.e2e.harness_a import (
    GUARD,
    Child,
    agent_toml,
    broker_toml,
    check_exactly,
    is_connected,
    start_agent,
    stop,
    wait_status,
)
from tests.faults.children import Run
from tests.faults.pgserver import PgServer
from tests.faults.publisher import Refusal, RetryingPublisher

pytestmark = [pytest.mark.peer("postgres"), pytest.mark.slow]

RATE = 50.0
COUNT = 200
BENCH_COUNT = 1000
SUBJECT = "faults.pg"
METRICS = "[metrics]\nenabled = true\nport = 0\n"  # /readyz on a free port
MARKER = "end"  # published by bob after his agent restarted
# Internal text a refusal must not carry: driver and SQL details are for the operator log.
INTERNAL = re.compile(r"OperationalError|psycopg|sqlalchemy|SQL|Traceback|Error:", re.IGNORECASE)


@dataclass(frozen=True)
class OutageRun:
    published: list[str]  # what bob's agent took, in order
    states: dict[str, int]
    refusals: list[Refusal]
    received: list[dict[str, Any]]  # what alice's application got, the last one acked
    received_after_restart: list[dict[str, Any]]  # and after bob's agent restarted
    broker_log: str
    ready: dict[str, int]  # /readyz status before, during each outage, after


def _lines(log: str, event: str) -> list[str]:
    return [line for line in log.splitlines() if f"event={event}" in line]


async def _until(predicate: Callable[[], bool]) -> None:
    """Wait for a state of another process that has no event to await (its log): checked
    every 50 ms, bounded by GUARD."""

    async def loop() -> None:
        while not predicate():
            await asyncio.sleep(0.05)

    await asyncio.wait_for(loop(), GUARD)


def _get_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=GUARD) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


async def _readyz(broker: Child) -> int:
    return await asyncio.to_thread(_get_status, f"http://{broker.words['metrics']}/readyz")


async def _run(tmp: Path, count: int) -> OutageRun:
    server = PgServer()
    async with Run(tmp) as run:
        run.on_exit(server.close)
        await asyncio.to_thread(server.start)
        toml = broker_toml(tmp / "broker") + f'[store]\nurl = "{server.url}"\n' + METRICS
        broker, sip = await run.broker(toml)
        (_, a_sock), (bob, b_sock) = await run.subscribed_pair(
            start_agent(tmp, "alice", agent_toml(tmp / "alice", "alice", "127.0.0.1", sip)),
            start_agent(tmp, "bob", agent_toml(tmp / "bob", "bob", "127.0.0.1", sip)),
            SUBJECT,
        )
        tail = await run.tail(a_sock)
        publisher = run.publisher(RetryingPublisher(b_sock, SUBJECT, count, RATE))
        ready = {"before": await _readyz(broker)}
        for k in (1, 2):
            await publisher.wait(taken=count * k // 3)
            logged = len(_lines(broker.stderr(), "database_error"))
            await asyncio.to_thread(server.stop)
            # Down until the broker has met the outage (a publish failed on it).
            await _until(lambda: len(_lines(broker.stderr(), "database_error")) > logged)  # noqa: B023
            ready[f"outage {k}"] = await _readyz(broker)
            await asyncio.to_thread(server.resume)
        await publisher.finish()
        await asyncio.wait_for(tail.wait_count(len(publisher.taken)), GUARD)
        # alice's agent holds the highest nseq: the broker sends in nseq order, so every
        # notification of this phase is in.
        seen = len(tail.records)
        await wait_status(a_sock, lambda s: s["highest_nseq"] >= seen)
        received = list(tail.records)
        ready["after"] = await _readyz(broker)
        # bob's agent restarts: whatever its outbox still holds is sent again. A marker
        # published after it comes last to alice, so anything sent twice shows before it.
        await stop(bob)
        _, b_sock = await run.child(
            start_agent(tmp, "bob", agent_toml(tmp / "bob", "bob", "127.0.0.1", sip))
        )
        await wait_status(b_sock, is_connected)
        async with ApiClient(b_sock) as client:
            await asyncio.wait_for(
                client.call({"op": "pub", "subject": SUBJECT, "attrs": {}, "text": MARKER}), GUARD
            )
        await asyncio.wait_for(tail.wait_until(lambda r: r[-1].get("text") == MARKER), GUARD)
        return OutageRun(
            published=list(publisher.taken),
            states=dict(publisher.states),
            refusals=list(publisher.refusals),
            received=received,
            received_after_restart=list(tail.records),
            broker_log=broker.stderr(),
            ready=ready,
        )


def run_outage(count: int) -> OutageRun:
    with tempfile.TemporaryDirectory(prefix="mdeci-faults-pg-") as tmp:
        return asyncio.run(_run(Path(tmp), count))


@pytest.fixture(scope="module")
def outage() -> Iterator[OutageRun]:
    yield run_outage(COUNT)


# ------------------------------------------------------------------ checks


def check_delivery(run: OutageRun, count: int) -> None:
    assert run.published == [f"t{i}" for i in range(count)]
    check_exactly(run.received, run.published)


def check_refusals_retriable(run: OutageRun) -> None:
    # A 4xx is "never acceptable": the agent drops it, and a retry would be refused again.
    assert all(r.code is not None and r.code >= 500 for r in run.refusals), run.refusals


def check_refusals_temporary(run: OutageRun) -> None:
    for refusal in run.refusals:
        assert refusal.code == 503, refusal
        assert not INTERNAL.search(refusal.error), refusal


def check_outage_and_recovery_logged(run: OutageRun) -> None:
    assert _lines(run.broker_log, "database_error"), run.broker_log[-2000:]
    assert len(_lines(run.broker_log, "database_recovered")) >= 2, run.broker_log[-2000:]


# ------------------------------------------------------------------ tests


def test_subscriber_gets_exactly_the_published_set_in_order(outage: OutageRun) -> None:
    check_delivery(outage, COUNT)
    print(
        f"\npg restart x2: {COUNT} published at {RATE:.0f}/s, answers {outage.states}, "
        f"{len(outage.refusals)} refusals retried; 0 lost, 0 duplicated, order kept"
    )


def test_a_refused_publish_is_not_sent_again_after_the_agent_restarts(outage: OutageRun) -> None:
    check_exactly(outage.received_after_restart, [*outage.published, MARKER])


def test_the_publisher_is_refused_only_with_retriable_errors(outage: OutageRun) -> None:
    check_refusals_retriable(outage)


def test_readyz_says_not_ready_during_each_outage(outage: OutageRun) -> None:
    assert outage.ready == {"before": 200, "outage 1": 503, "outage 2": 503, "after": 200}


def test_publisher_sees_only_temporary_errors_without_internal_text(outage: OutageRun) -> None:
    check_refusals_temporary(outage)


def test_broker_logs_the_outage(outage: OutageRun) -> None:
    assert _lines(outage.broker_log, "database_error"), outage.broker_log[-2000:]


def test_broker_logs_the_recovery(outage: OutageRun) -> None:
    check_outage_and_recovery_logged(outage)


@pytest.mark.bench
def test_thousand_publishes_at_fifty_per_second_through_two_restarts() -> None:
    """The specified run: 1,000 at 50/s (20 s) through two restarts, nothing lost,
    nothing duplicated, order kept, only retriable refusals, the outage logged."""
    run = run_outage(BENCH_COUNT)
    check_delivery(run, BENCH_COUNT)
    check_refusals_retriable(run)
    assert _lines(run.broker_log, "database_error")
    print(
        f"\npg restart x2: {BENCH_COUNT} at {RATE:.0f}/s: answers {run.states}, "
        f"{len(run.refusals)} refusals retried; 0 lost, 0 duplicated, order kept"
    )
