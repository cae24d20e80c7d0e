"""The one writer of session rows keeps the epoch each user is held at: a refusal is
told once, and every later call for that user is refused too (never let through
unfenced) until a new session claims the user again."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace

import pytest
from sqlalchemy import event

from mdeci.broker.delivery import AckMany, CheckHeld
from mdeci.broker.fencing import FencedQueues
from mdeci.broker.session_rows import SessionRows
from mdeci.broker.sessions import SetStatus, Status, StoreSession
from mdeci.broker.worker import DbWorker
from mdeci.store.base import make_engine
from mdeci.store.ownership import Held, Lost
from mdeci.store.repo import BrokerStore
from mdeci.store.sessions import SessionStatus

ALICE = "sip:alice@localhost"


def _row(call_id: str, *, refresh: bool = False) -> StoreSession:
    return StoreSession(
        uri=ALICE,
        call_id=call_id,
        local_tag="l",
        remote_tag="r",
        remote_target="<sip:alice@127.0.0.2>",
        route_set="",
        remote_sdp="v=0",
        media_addr="127.0.0.2:4000",
        session_key=b"k" * 32,
        msisdn=None,
        local_cseq=1,
        remote_cseq=1,
        started_at=1000.0,
        updated_at=1000.0,
        refresh=refresh,
    )


@pytest.fixture
def b(any_store: BrokerStore) -> Iterator[BrokerStore]:
    engine = make_engine(any_store.engine.url.render_as_string(hide_password=False))
    try:
        yield BrokerStore(engine, "b")
    finally:
        engine.dispose()


@pytest.fixture
async def worker() -> AsyncIterator[DbWorker]:
    w = DbWorker()
    try:
        yield w
    finally:
        w.close()


async def test_a_lost_user_stays_fenced_until_claimed_again(
    any_store: BrokerStore, b: BrokerStore, worker: DbWorker
) -> None:
    a = BrokerStore(any_store.engine, "a")
    rows = SessionRows(a, worker, lambda: 2000.0)
    told: list[Lost] = []
    rows.on_lost = told.append
    queues = FencedQueues(a)
    queues.fence = rows
    rows.write(_row("c1"))
    assert await worker.run(rows.holds, ALICE)
    a.queues.publish(
        "sip:bob@localhost", "m1", "s", b"\xa0", b"p", urgent=False, published_at=1.0,
        targets=[(ALICE, 1)], max_depth=10, policy="drop-oldest",
    )  # fmt: skip
    held = a.ownership.holder(ALICE)
    assert held == ("a", 1)
    assert b.ownership.take_over(ALICE, 1) == Held(2)

    rows.write(SetStatus(ALICE, Status.DISCONNECTED))
    rows.write(SetStatus(ALICE, Status.NONE))
    rows.write(_row("c1", refresh=True))
    assert await worker.run(queues.ack_many, AckMany([(ALICE, 1)])) == [0]
    assert await worker.run(queues.check_held, CheckHeld((ALICE,))) == {ALICE}
    assert told == [Lost(ALICE, "b", 2)]  # once, whatever else was refused
    assert not await worker.run(rows.holds, ALICE)
    # Nothing of a's reached the store: b's row, b's queue.
    row = b.sessions.get_session(ALICE)
    assert row is not None and row.status is SessionStatus.CONNECTED
    assert b.ownership.holder(ALICE) == ("b", 2)
    assert b.queues.depth(ALICE) == 1

    # Her next INVITE reaches a: a new session claims her again.
    rows.write(_row("c2"))
    assert await worker.run(rows.holds, ALICE)
    assert a.ownership.holder(ALICE) == ("a", 3)
    assert await worker.run(queues.ack_many, AckMany([(ALICE, 1)])) == [1]


async def test_a_session_ended_while_held_leaves_no_epoch_behind(
    any_store: BrokerStore, worker: DbWorker
) -> None:
    a = BrokerStore(any_store.engine, "a")
    rows = SessionRows(a, worker, lambda: 2000.0)
    rows.write(_row("c1"))
    rows.write(SetStatus(ALICE, Status.DISCONNECTED))
    assert await worker.run(rows.holds, ALICE)
    rows.write(SetStatus(ALICE, Status.NONE))
    assert not await worker.run(rows.holds, ALICE)
    assert await worker.run(lambda: dict(rows.held_epochs)) == {}
    row = a.sessions.get_session(ALICE)
    assert row is not None and row.status is SessionStatus.ENDED
    # Her next INVITE claims her again.
    rows.write(_row("c2"))
    assert await worker.run(rows.holds, ALICE)
    assert a.ownership.holder(ALICE) == ("a", 2)


async def test_a_claim_of_another_nodes_row_is_told_as_a_handoff(
    any_store: BrokerStore, b: BrokerStore, worker: DbWorker
) -> None:
    a = BrokerStore(any_store.engine, "a")
    rows_a = SessionRows(a, worker, lambda: 2000.0)
    rows_b = SessionRows(b, worker, lambda: 2001.0)
    told_a: list[tuple[str, str]] = []
    told_b: list[tuple[str, str]] = []
    rows_a.on_handoff = lambda uri, prev: told_a.append((uri, prev))
    rows_b.on_handoff = lambda uri, prev: told_b.append((uri, prev))
    rows_a.write(_row("c1"))  # a new row: nobody held her
    rows_a.write(_row("c1", refresh=True))
    rows_a.write(_row("c2"))  # a's own row again: no handoff
    assert await worker.run(rows_a.holds, ALICE)
    assert told_a == []
    rows_b.write(_row("c3"))  # her next INVITE reached b (a was lost or drained)
    assert await worker.run(rows_b.holds, ALICE)
    assert told_b == [(ALICE, "a")]
    assert b.ownership.holder(ALICE) == ("b", 3)


async def test_writes_queued_behind_a_busy_thread_are_committed_together(
    any_store: BrokerStore, worker: DbWorker
) -> None:
    """A burst of session writes (a restart's peers given up, a storm's re-INVITEs) costs
    one commit, not one each; what they hold is what separate commits would give."""
    a = BrokerStore(any_store.engine, "a")
    rows = SessionRows(a, worker, lambda: 2000.0)
    commits: list[object] = []

    def committed(conn: object) -> None:
        commits.append(conn)

    event.listen(any_store.engine, "commit", committed)
    try:
        started, release = threading.Event(), threading.Event()

        def hold() -> None:
            started.set()
            release.wait(10)

        worker.post("test", hold)
        users = [f"sip:u{i}@localhost" for i in range(20)]
        for uri in users:
            rows.write(replace(_row("c1"), uri=uri))
            rows.write(SetStatus(uri, Status.DISCONNECTED))
        rows.write(SetStatus(users[0], Status.NONE))
        await asyncio.to_thread(started.wait, 10)
        release.set()
        assert await worker.run(lambda: dict(rows.held_epochs)) == {u: 1 for u in users[1:]}
        assert len(commits) == 1
    finally:
        event.remove(any_store.engine, "commit", committed)
    statuses = [a.sessions.get_session(uri) for uri in users]
    assert [s.status if s else None for s in statuses] == [
        SessionStatus.ENDED,
        *[SessionStatus.DISCONNECTED] * 19,
    ]
