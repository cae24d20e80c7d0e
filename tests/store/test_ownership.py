"""One owner per user, fenced: two store handles on one database as two brokers."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import replace

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from mdeci.store.base import make_engine
from mdeci.store.ownership import Held, Lost, SqlOwnership
from mdeci.store.queue_rows import DeliveryRow
from mdeci.store.queues import SqlQueueStore
from mdeci.store.sessions import SessionStatus, SqlSessionStore
from tests.store.test_sessions import ALICE, _session

GUARD = 30.0  # seconds: only against a hang


@pytest.fixture
def other(engine: Engine) -> Iterator[Engine]:
    """A second engine on the same database: another broker's handle."""
    eng = make_engine(engine.url.render_as_string(hide_password=False))
    try:
        yield eng
    finally:
        eng.dispose()


def _queue(engine: Engine, *nseqs: int) -> None:
    queues = SqlQueueStore(engine)
    for n in nseqs:
        queues.publish(
            "sip:bob@example.com",
            f"m{n}",
            "s",
            b"\xa0",
            b"p",
            urgent=False,
            published_at=1000.0 + n,
            targets=[(ALICE, 7)],
            max_depth=100,
            policy="drop-oldest",
        )


def _queued(engine: Engine) -> list[int]:
    return [row.nseq for row in SqlQueueStore(engine).pending(ALICE, 0, 100)]


def _nseqs(read: list[DeliveryRow] | Lost) -> list[int]:
    assert isinstance(read, list), read
    return [row[0] for row in read]


def test_a_new_session_raises_the_epoch_and_names_its_owner(engine: Engine, other: Engine) -> None:
    a, b = SqlSessionStore(engine), SqlSessionStore(other)
    assert a.upsert_session(_session(), owner="a") == Held(1)
    assert SqlOwnership(other, "b").holder(ALICE) == ("a", 1)
    # A refresh by the holder keeps the epoch.
    assert a.upsert_session(_session(remote_cseq=102), owner="a", held=1) == Held(1)
    # alice's new INVITE reaches b: b holds her from now on, whatever a thought.
    assert b.upsert_session(_session(call_id="c2@host"), owner="b") == Held(2)
    assert SqlOwnership(engine, "a").holder(ALICE) == ("b", 2)
    # a's refresh of the session it lost writes nothing.
    assert a.upsert_session(_session(remote_cseq=103), owner="a", held=1) == Lost(ALICE, "b", 2)
    got = a.get_session(ALICE)
    assert got is not None and got.call_id == "c2@host" and got.remote_cseq == 101
    # Nor does its status change.
    lost = a.set_status_held(ALICE, SessionStatus.DISCONNECTED, 2000.0, 1)
    assert lost == Lost(ALICE, "b", 2)
    assert b.set_status_held(ALICE, SessionStatus.DISCONNECTED, 2000.0, 2) == replace(
        _session(call_id="c2@host"), status=SessionStatus.DISCONNECTED, updated_at=2000.0
    )


def test_a_broker_that_lost_the_user_can_neither_read_nor_ack_nor_remove(
    engine: Engine, other: Engine
) -> None:
    SqlSessionStore(engine).upsert_session(_session(), owner="a")
    a, b = SqlOwnership(engine, "a"), SqlOwnership(other, "b")
    _queue(engine, 1, 2, 3, 4)
    assert _nseqs(a.pending(ALICE, 0, 10, 1)) == [1, 2, 3, 4]
    assert a.ack(ALICE, 1, 1) == 1
    assert b.take_over(ALICE, 1) == Held(2)
    gone = Lost(ALICE, "b", 2)
    assert a.pending(ALICE, 0, 10, 1) == gone
    assert a.ack(ALICE, 3, 1) == gone
    assert a.remove(ALICE, 4, 1) == gone
    assert a.take_missed(ALICE, 1) == gone
    assert _queued(engine) == [2, 3, 4]  # a changed nothing
    assert SqlQueueStore(engine).depth(ALICE) == 3
    # b, the holder, can.
    assert _nseqs(b.pending(ALICE, 1, 10, 2)) == [2, 3, 4]
    assert b.remove(ALICE, 4, 2) is True
    assert b.ack(ALICE, 2, 2) == 1
    assert b.take_missed(ALICE, 2) == 0
    assert _queued(other) == [3]
    assert SqlQueueStore(other).depth(ALICE) == 1
    assert b.ack(ALICE, 3, 2) == 1
    # An empty queue at the right epoch is empty, not lost.
    assert b.pending(ALICE, 0, 10, 2) == []


def test_take_missed_takes_the_overflow_count_once(engine: Engine) -> None:
    SqlSessionStore(engine).upsert_session(_session(), owner="a")
    queues = SqlQueueStore(engine)
    for n in range(3):
        queues.publish(
            "sip:bob@example.com",
            f"m{n}",
            "s",
            b"\xa0",
            b"p",
            urgent=False,
            published_at=1000.0,
            targets=[(ALICE, 7)],
            max_depth=1,
            policy="drop-oldest",
        )
    own = SqlOwnership(engine, "a")
    assert own.take_missed(ALICE, 1) == 2
    assert own.take_missed(ALICE, 1) == 0


def test_a_user_without_a_session_row_is_held_by_nobody(engine: Engine) -> None:
    own = SqlOwnership(engine, "a")
    assert own.holder(ALICE) is None
    assert own.take_over(ALICE, 0) == Lost(ALICE, "", 0)
    assert own.ack(ALICE, 5, 0) == Lost(ALICE, "", 0)


def _waiting_for_locks(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                sa.text(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND wait_event_type = 'Lock' "
                    "AND query LIKE 'UPDATE sessions SET owner%'"
                )
            ).scalar_one()
        )


def test_of_two_takeovers_from_one_epoch_exactly_one_wins(engine: Engine, other: Engine) -> None:
    SqlSessionStore(engine).upsert_session(_session(), owner="a")
    url = engine.url.render_as_string(hide_password=False)
    engines = [make_engine(url) for _ in range(2)]
    brokers = [SqlOwnership(eng, f"n{i}") for i, eng in enumerate(engines)]
    results: list[Held | Lost] = []
    blocker = other.connect()
    pg = engine.dialect.name == "postgresql"
    if pg:
        # Both takeovers queue on the row's lock, then race for it once it is free.
        blocker.execute(sa.text("SELECT 1 FROM sessions WHERE uri = :u FOR UPDATE"), {"u": ALICE})
    threads = [
        threading.Thread(target=lambda o=o: results.append(o.take_over(ALICE, 1))) for o in brokers
    ]
    for t in threads:
        t.start()
    if pg:
        deadline = time.monotonic() + GUARD
        while _waiting_for_locks(engine) < 2:
            assert time.monotonic() < deadline, "the takeovers never waited for the lock"
        blocker.commit()
    blocker.close()
    for t in threads:
        t.join(GUARD)
    for eng in engines:
        eng.dispose()
    assert sorted(results, key=lambda r: isinstance(r, Lost)) in (
        [Held(2), Lost(ALICE, "n0", 2)],
        [Held(2), Lost(ALICE, "n1", 2)],
    ), results
    winner = SqlOwnership(engine, "x").holder(ALICE)
    assert winner is not None and winner[1] == 2
    assert Lost(ALICE, winner[0], 2) in results


def test_batched_acks_are_fenced_per_user_and_the_lost_ones_named(
    engine: Engine, other: Engine
) -> None:
    bob = "sip:bob@example.com"
    sessions = SqlSessionStore(engine)
    sessions.upsert_session(_session(), owner="a")
    sessions.upsert_session(_session(uri=bob, call_id="c9@host"), owner="a")
    queues = SqlQueueStore(engine)
    for n in range(3):
        queues.publish(
            "sip:carol@example.com",
            f"m{n}",
            "s",
            b"\xa0",
            b"p",
            urgent=False,
            published_at=1000.0,
            targets=[(ALICE, 7), (bob, 8)],
            max_depth=100,
            policy="drop-oldest",
        )
    a = SqlOwnership(engine, "a")
    assert SqlOwnership(other, "b").take_over(ALICE, 1) == Held(2)
    held = {ALICE: 1, bob: 1}
    assert a.lost_of(held) == [Lost(ALICE, "b", 2)]
    assert a.lost_of({bob: 1}) == []
    # The delivery's read, fenced: nothing for alice at a's stale epoch, b's rows at b's.
    reads = [(ALICE, 0, 10), (bob, 0, 10)]
    assert [len(r) for r in queues.pending_many(reads, held)] == [0, 3]
    assert [len(r) for r in queues.pending_many(reads, {ALICE: 2})] == [3, 3]
    counts, lost = a.ack_many(queues, [(ALICE, 2), (bob, 2)], held)
    assert (counts, lost) == ([0, 2], [Lost(ALICE, "b", 2)])
    assert (queues.depth(ALICE), queues.depth(bob)) == (3, 1)
    # A user the caller holds no epoch for is not fenced (a session made without SIP).
    counts, lost = a.ack_many(queues, [(ALICE, 1)], {})
    assert (counts, lost) == ([1], [])


def test_a_new_sessions_claim_names_the_owner_it_replaced(engine: Engine, other: Engine) -> None:
    a, b = SqlSessionStore(engine), SqlSessionStore(other)

    def prev(got: Held | Lost) -> str:
        assert isinstance(got, Held), got
        return got.prev_owner

    assert prev(a.upsert_session(_session(), owner="a")) == ""  # a new row
    assert prev(a.upsert_session(_session(), owner="a")) == "a"
    assert prev(a.upsert_session(_session(), owner="a", held=2)) == ""  # a refresh
    assert prev(b.upsert_session(_session(call_id="c2@host"), owner="b")) == "a"
    assert SqlOwnership(engine, "a").holder(ALICE) == ("b", 3)
