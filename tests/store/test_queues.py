"""Idempotent publish, nseq allocation, overflow policies, pending/ack/missed."""

from __future__ import annotations

import collections
import uuid
from collections.abc import Sequence

import cbor2
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import delete, event, func, select
from sqlalchemy.engine import Engine

from mdeci.store._sql import relaxed_transaction
from mdeci.store.errors import InvalidArgument
from mdeci.store.models import QueuedRow
from mdeci.store.queues import (
    DeliveryRow,
    Dropped,
    Enqueued,
    OverflowPolicy,
    PublishRequest,
    PublishResult,
    QueuedNotification,
    SqlQueueStore,
    StoredRow,
    as_queued,
)

PUB = "sip:pub@example.com"
ALICE = "sip:alice@example.com"
BOB = "sip:bob@example.com"


def publish(
    q: SqlQueueStore,
    msg_id: str,
    targets: Sequence[tuple[str, int]],
    *,
    max_depth: int = 100,
    policy: OverflowPolicy = "drop-oldest",
    urgent: bool = False,
    at: float = 1000.0,
) -> PublishResult:
    return q.publish(
        PUB,
        msg_id,
        "stock.petr4",
        b"\xa1eStockePETR4",
        f"payload {msg_id}".encode(),
        urgent=urgent,
        published_at=at,
        targets=targets,
        max_depth=max_depth,
        policy=policy,
    )


def test_publish_queues_per_target_and_pending_returns_them(engine: Engine) -> None:
    q = SqlQueueStore(engine)
    result = publish(q, "m1", [(BOB, 7), (ALICE, 3)], urgent=True)
    assert result == PublishResult(
        matched=2,
        duplicate=False,
        queued=(Enqueued(ALICE, 1, 3, 1), Enqueued(BOB, 1, 7, 1)),
    )
    assert q.pending(ALICE) == [
        QueuedNotification(
            uri=ALICE,
            nseq=1,
            sub_id=3,
            publisher_uri=PUB,
            msg_id="m1",
            subject="stock.petr4",
            attrs_cbor=b"\xa1eStockePETR4",
            payload=b"payload m1",
            urgent=True,
            published_at=1000.0,
        )
    ]
    assert q.depth(ALICE) == 1 and q.depth(BOB) == 1 and q.depth(PUB) == 0


def test_no_targets_still_records_the_msg_id(engine: Engine) -> None:
    q = SqlQueueStore(engine)
    assert publish(q, "m1", []) == PublishResult(matched=0, duplicate=False)
    assert publish(q, "m1", [(ALICE, 1)]) == PublishResult(matched=0, duplicate=True)
    assert q.depth(ALICE) == 0


def test_duplicate_publish_returns_original_count_and_queues_nothing(engine: Engine) -> None:
    q = SqlQueueStore(engine)
    first = publish(q, "m1", [(ALICE, 1), (BOB, 2)])
    again = publish(q, "m1", [(ALICE, 1)])
    assert again == PublishResult(matched=2, duplicate=True)
    assert first.matched == 2 and not first.duplicate
    assert q.depth(ALICE) == 1 and q.depth(BOB) == 1
    # The same msg_id from another publisher is another message.
    other = q.publish(
        "sip:other@example.com",
        "m1",
        "s",
        b"",
        b"",
        urgent=False,
        published_at=1.0,
        targets=[(ALICE, 1)],
        max_depth=10,
        policy="drop-oldest",
    )
    assert not other.duplicate and other.queued == (Enqueued(ALICE, 2, 1, 2),)


def test_nseq_is_per_user_increasing_and_never_reused(engine: Engine) -> None:
    q = SqlQueueStore(engine)
    seen: dict[str, list[int]] = {ALICE: [], BOB: []}
    for n in range(5):
        targets = [(ALICE, 1), (BOB, 2)] if n % 2 else [(ALICE, 1)]
        for e in publish(q, f"m{n}", targets).queued:
            seen[e.uri].append(e.nseq)
    assert seen == {ALICE: [1, 2, 3, 4, 5], BOB: [1, 2]}
    # Ack everything: the queue is empty but the counter goes on.
    assert q.ack(ALICE, 5) == 5
    assert q.depth(ALICE) == 0 and q.last_nseq(ALICE) == 5
    assert publish(q, "m9", [(ALICE, 1)]).queued == (Enqueued(ALICE, 6, 1, 1),)
    assert q.last_nseq("sip:nobody@x") == 0


def test_same_user_twice_in_one_publish_gets_two_nseqs(engine: Engine) -> None:
    q = SqlQueueStore(engine)
    result = publish(q, "m1", [(ALICE, 1), (ALICE, 2)])
    assert result.queued == (Enqueued(ALICE, 1, 1, 1), Enqueued(ALICE, 2, 2, 2))


def test_pending_after_limit_and_urgent_only(engine: Engine) -> None:
    q = SqlQueueStore(engine)
    for n in range(6):
        publish(q, f"m{n}", [(ALICE, 1)], urgent=n % 3 == 0, at=1000.0 + n)
    assert [p.nseq for p in q.pending(ALICE)] == [1, 2, 3, 4, 5, 6]
    assert [p.nseq for p in q.pending(ALICE, after_nseq=2, limit=3)] == [3, 4, 5]
    assert [p.nseq for p in q.pending(ALICE, urgent_only=True)] == [1, 4]
    assert [p.published_at for p in q.pending(ALICE, 5)] == [1005.0]
    assert q.pending(BOB) == []
    with pytest.raises(InvalidArgument):
        q.pending(ALICE, limit=0)


def test_ack_deletes_up_to_and_counts(engine: Engine) -> None:
    q = SqlQueueStore(engine)
    for n in range(4):
        publish(q, f"m{n}", [(ALICE, 1), (BOB, 1)])
    assert q.ack(ALICE, 2) == 2
    assert q.ack(ALICE, 2) == 0
    assert q.ack(ALICE, 0) == 0
    assert [p.nseq for p in q.pending(ALICE)] == [3, 4]
    assert q.depth(BOB) == 4
    assert q.ack(ALICE, 100) == 2
    assert q.depth(ALICE) == 0


def test_ack_is_not_fsynced_and_leaves_the_connection_durable(engine: Engine) -> None:
    q = SqlQueueStore(engine)
    publish(q, "m0", [(ALICE, 1)])
    assert q.ack(ALICE, 1) == 1
    assert q.depth(ALICE) == 0
    if engine.dialect.name == "sqlite":
        # The pooled connection is FULL (2) again for the next publish.
        with engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 2
    # A failing ack rolls back and leaves the connection usable.
    with pytest.raises(InvalidArgument), relaxed_transaction(engine, "ack") as conn:
        conn.execute(delete(QueuedRow))
        raise InvalidArgument("boom")
    publish(q, "m1", [(ALICE, 1)])
    assert [p.nseq for p in q.pending(ALICE)] == [2]


def test_overflow_drop_oldest_reports_and_counts_missed(engine: Engine) -> None:
    q = SqlQueueStore(engine)
    for n in range(3):
        publish(q, f"m{n}", [(ALICE, n)], max_depth=3)
    result = publish(q, "m3", [(ALICE, 9), (BOB, 9)], max_depth=3)
    assert result.queued == (Enqueued(ALICE, 4, 9, 3), Enqueued(BOB, 1, 9, 1))
    assert result.dropped == (Dropped(ALICE, 1, 0, "m0", "drop-oldest"),)
    assert [p.nseq for p in q.pending(ALICE)] == [2, 3, 4]
    # A smaller bound later drops as many as needed to make room.
    result = publish(q, "m4", [(ALICE, 1)], max_depth=2)
    assert [d.nseq for d in result.dropped] == [2, 3]
    assert result.queued == (Enqueued(ALICE, 5, 1, 2),)
    assert [p.nseq for p in q.pending(ALICE)] == [4, 5]
    assert q.take_missed(ALICE) == 3
    assert q.take_missed(ALICE) == 0
    assert q.take_missed(BOB) == 0
    assert q.take_missed("sip:nobody@x") == 0
    # A dropped nseq is never handed out again.
    assert publish(q, "m5", [(ALICE, 1)], max_depth=10).queued[0].nseq == 6
    # max_depth=1 keeps only the newest.
    result = publish(q, "m6", [(ALICE, 1)], max_depth=1)
    assert [d.nseq for d in result.dropped] == [4, 5, 6]
    assert result.queued == (Enqueued(ALICE, 7, 1, 1),)
    assert [p.nseq for p in q.pending(ALICE)] == [7]


def test_overflow_refuse_newest_keeps_old_ones(engine: Engine) -> None:
    q = SqlQueueStore(engine)
    for n in range(2):
        publish(q, f"m{n}", [(ALICE, 1)], max_depth=2, policy="refuse-newest")
    result = publish(q, "m2", [(ALICE, 5), (BOB, 5)], max_depth=2, policy="refuse-newest")
    assert result == PublishResult(
        matched=2,
        duplicate=False,
        queued=(Enqueued(BOB, 1, 5, 1),),
        dropped=(Dropped(ALICE, None, 5, "m2", "refuse-newest"),),
    )
    assert [p.msg_id for p in q.pending(ALICE)] == ["m0", "m1"]
    publish(q, "m3", [(ALICE, 5)], max_depth=2, policy="refuse-newest")
    assert q.take_missed(ALICE) == 2
    # Refused ones consume no nseq: the next queued one follows on.
    q.ack(ALICE, 2)
    assert publish(q, "m4", [(ALICE, 1)], max_depth=2, policy="refuse-newest").queued == (
        Enqueued(ALICE, 3, 1, 1),
    )


def test_bad_arguments_are_refused_before_anything_is_stored(engine: Engine) -> None:
    q = SqlQueueStore(engine)
    with pytest.raises(InvalidArgument):
        publish(q, "m1", [(ALICE, 1)], max_depth=0)
    with pytest.raises(InvalidArgument):
        publish(q, "m1", [(ALICE, 1)], policy="drop-newest")  # type: ignore[arg-type]
    assert not publish(q, "m1", [(ALICE, 1)]).duplicate


def test_prune_published_forgets_old_msg_ids(engine: Engine) -> None:
    q = SqlQueueStore(engine)
    publish(q, "old", [(ALICE, 1)], at=100.0)
    publish(q, "edge", [(ALICE, 1)], at=200.0)
    publish(q, "new", [(ALICE, 1)], at=300.0)
    assert q.prune_published(200.0) == 1
    assert publish(q, "edge", [(ALICE, 1)]).duplicate
    assert publish(q, "new", [(ALICE, 1)]).duplicate
    # Past the horizon a re-sent msg_id is new again: the horizon must outlast retries.
    assert not publish(q, "old", [(ALICE, 1)]).duplicate


def test_prune_published_forgets_at_most_limit_the_oldest_first(engine: Engine) -> None:
    """A bounded chunk per call (the first prune of a table never pruned must not be one
    DELETE of all: PostgreSQL's statement timeout, SQLite's one writer)."""
    q = SqlQueueStore(engine)
    for n in range(5):
        publish(q, f"m{n}", [], at=100.0 + n)
    assert q.prune_published(200.0, limit=2) == 2
    assert [publish(q, f"m{n}", []).duplicate for n in range(2, 5)] == [True] * 3
    assert q.prune_published(200.0, limit=2) == 2  # m2, m3 (the re-sends were duplicates)
    assert q.prune_published(200.0, limit=2) == 1  # short: none older left
    assert q.prune_published(200.0, limit=2) == 0
    with pytest.raises(InvalidArgument):
        q.prune_published(200.0, limit=0)


def _counted(engine: Engine, uri: str) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).where(QueuedRow.uri == uri)).scalar_one())


def test_depth_counter_follows_every_write_to_the_queue(engine: Engine) -> None:
    q = SqlQueueStore(engine)
    steps: list[tuple[str, Sequence[tuple[str, int]], int, OverflowPolicy]] = [
        ("a", [(ALICE, 1), (BOB, 1), (ALICE, 2)], 5, "drop-oldest"),
        ("b", [(ALICE, 1)] * 4, 3, "drop-oldest"),
        ("c", [(ALICE, 1), (BOB, 2)], 3, "refuse-newest"),
        ("d", [(BOB, 1)] * 3, 2, "drop-oldest"),
    ]
    for msg_id, targets, max_depth, policy in steps:
        publish(q, msg_id, targets, max_depth=max_depth, policy=policy)
        for uri in (ALICE, BOB):
            assert q.depth(uri) == _counted(engine, uri) <= max(max_depth, 3)
    assert q.ack(ALICE, q.last_nseq(ALICE) - 1) > 0
    assert q.remove(BOB, q.last_nseq(BOB))
    assert not q.remove(BOB, q.last_nseq(BOB))
    for uri in (ALICE, BOB):
        assert q.depth(uri) == _counted(engine, uri)
    assert q.depth("sip:nobody@x") == 0


def test_one_user_more_often_than_max_depth_in_one_publish(engine: Engine) -> None:
    q = SqlQueueStore(engine)
    publish(q, "m0", [(ALICE, 9)])
    result = publish(q, "m1", [(ALICE, 1), (ALICE, 2), (ALICE, 3)], max_depth=2)
    # As if each target were queued in turn: the third one pushes out nseq 1 (older) and
    # nseq 2 (this publish's first), which is reported queued then dropped.
    assert result.queued == (
        Enqueued(ALICE, 2, 1, 2),
        Enqueued(ALICE, 3, 2, 2),
        Enqueued(ALICE, 4, 3, 2),
    )
    assert result.dropped == (
        Dropped(ALICE, 1, 9, "m0", "drop-oldest"),
        Dropped(ALICE, 2, 1, "m1", "drop-oldest"),
    )
    assert [(p.nseq, p.sub_id) for p in q.pending(ALICE)] == [(3, 2), (4, 3)]
    assert q.depth(ALICE) == 2 and q.take_missed(ALICE) == 2


def test_publish_statements_do_not_grow_with_the_targets(engine: Engine) -> None:
    """A fan-out of 100 runs a fixed handful of statements, not several per target."""
    q = SqlQueueStore(engine)
    targets = [(f"sip:u{n:03d}@example.com", n) for n in range(100)]
    publish(q, "warm", targets)
    statements: list[str] = []

    def count(*args: object) -> None:
        statements.append(str(args[2]))

    event.listen(engine, "before_cursor_execute", count)
    try:
        result = publish(q, "m1", targets)
    finally:
        event.remove(engine, "before_cursor_execute", count)
    assert len(result.queued) == 100 and {e.nseq for e in result.queued} == {2}
    # Record, lock counters, insert rows, update counters (+ BEGIN/commit chatter).
    assert len(statements) <= 8, statements


def test_publish_many_statements_do_not_grow_with_the_requests(engine: Engine) -> None:
    """A batch of 20 publishes runs the same handful of statements as one publish, not
    a record and an insert per publish (a round trip each on PostgreSQL)."""
    q = SqlQueueStore(engine)
    publish(q, "warm", [(ALICE, 1), (BOB, 2)])
    requests = [
        PublishRequest(PUB, f"m{n}", "s", b"\xa0", b"p", False, 1.0, [(ALICE, 1), (BOB, 2)])
        for n in range(20)
    ]
    statements: list[str] = []

    def count(*args: object) -> None:
        statements.append(str(args[2]))

    event.listen(engine, "before_cursor_execute", count)
    try:
        results = q.publish_many(requests, max_depth=100, policy="drop-oldest")
    finally:
        event.remove(engine, "before_cursor_execute", count)
    assert [r.queued[0].nseq for r in results] == list(range(2, 22))
    assert len(statements) <= 8, statements
    assert [n.msg_id for n in q.pending(BOB)] == ["warm", *(f"m{n}" for n in range(20))]


def test_publish_many_hands_over_the_rows_it_wrote_as_pending_reads_them(
    engine: Engine,
) -> None:
    """The rows of a batch (PostgreSQL writes them with one array per column,
    the shared columns once per publication) read back exactly as ``written`` has them:
    attrs, payloads, a queue class or none, urgency by request and by subscription."""
    q = SqlQueueStore(engine)
    requests = [
        PublishRequest(PUB, "m1", "a.b", b"\xa1aka", b"one", False, 1.5, [(BOB, 1), (ALICE, 2)]),
        PublishRequest(PUB, "m1", "a.b", b"\xa0", b"dup", False, 1.5, [(ALICE, 2)]),
        PublishRequest(
            "sip:other@example.com", "m1", "c", b"\xa0", b"", True, 2.0, [(ALICE, 3)], "alert"
        ),
        PublishRequest(
            PUB,
            "m2",
            "a.b",
            b"\xa0",
            b"two",
            False,
            2.5,
            [(BOB, 1), (ALICE, 2)],
            None,
            frozenset({2}),
        ),
        PublishRequest(PUB, "m3", "z", b"\xa0", b"three", False, 3.0, [(BOB, 4)]),
    ]
    written: list[StoredRow] = []
    q.publish_many(requests, max_depth=10, policy="drop-oldest", written=written)
    assert sorted(as_queued(row) for row in written) == sorted(q.pending(ALICE) + q.pending(BOB))
    assert [(n.nseq, n.msg_id, n.urgent, n.qclass) for n in q.pending(ALICE)] == [
        (1, "m1", False, None),
        (2, "m1", True, "alert"),
        (3, "m2", True, None),
    ]
    assert [(r[0], r[1]) for r in written] == [
        (ALICE, 1),
        (BOB, 1),
        (ALICE, 2),
        (ALICE, 3),
        (BOB, 2),
        (BOB, 3),
    ]
    single: list[StoredRow] = []  # one row: the plain insert
    q.publish_many(requests[4:5], max_depth=10, policy="drop-oldest", written=single)
    assert single == [] and q.depth(BOB) == 3  # a duplicate: nothing written
    q.publish_many(
        [PublishRequest(PUB, "m4", "z", b"\xa0", b"4", False, 4.0, [(BOB, 4)])],
        max_depth=10,
        policy="drop-oldest",
        written=single,
    )
    assert [as_queued(row) for row in single] == q.pending(BOB, after_nseq=3)


def test_publish_many_is_publish_in_turn_in_one_transaction(engine: Engine) -> None:
    q = SqlQueueStore(engine)

    def req(msg_id: str, targets: list[tuple[str, int]], pub: str = PUB) -> PublishRequest:
        return PublishRequest(pub, msg_id, "s", b"\xa0", msg_id.encode(), False, 1.0, targets)

    results = q.publish_many(
        [
            req("m1", [(BOB, 1), (ALICE, 2)]),
            req("m1", [(ALICE, 2)]),  # a duplicate of the first, in the same batch
            req("m2", [(ALICE, 3)]),
            req("m3", [(ALICE, 4)]),  # overflows: drops m1's notification, written above
            req("m4", []),
        ],
        max_depth=2,
        policy="drop-oldest",
    )
    assert results == [
        PublishResult(2, False, (Enqueued(ALICE, 1, 2, 1), Enqueued(BOB, 1, 1, 1))),
        PublishResult(2, True),
        PublishResult(1, False, (Enqueued(ALICE, 2, 3, 2),)),
        PublishResult(
            1, False, (Enqueued(ALICE, 3, 4, 2),), (Dropped(ALICE, 1, 2, "m1", "drop-oldest"),)
        ),
        PublishResult(0, False),
    ]
    assert [p.msg_id for p in q.pending(ALICE)] == ["m2", "m3"]
    assert q.depth(ALICE) == 2 == _counted(engine, ALICE) and q.take_missed(ALICE) == 1
    assert q.last_nseq(BOB) == 1 and q.publish_many([], max_depth=1, policy="drop-oldest") == []
    # All or nothing: a failing batch leaves no trace of its first, valid request.
    with pytest.raises(InvalidArgument):
        q.publish_many([req("m5", [(ALICE, 1)])], max_depth=0, policy="drop-oldest")
    assert q.last_nseq(ALICE) == 3


def _delivery_row(n: QueuedNotification) -> DeliveryRow:
    return (n.nseq, n.sub_id, n.publisher_uri, n.msg_id, n.subject, n.attrs_cbor, n.payload,
            n.published_at)  # fmt: skip


def test_pending_many_gives_the_types_the_notify_encoder_relies_on(engine: Engine) -> None:
    """The broker's encoder writes a row's values as they come from the driver (a row of
    another type takes the checked path): each driver gives exactly these types."""
    q = SqlQueueStore(engine)
    q.publish(
        PUB, "m1", "a.b", cbor2.dumps({"k": 1}), b"\x00p", urgent=True, published_at=5.0,
        targets=[(ALICE, 7)], max_depth=10, policy="drop-oldest",
    )  # fmt: skip
    ((row,),) = q.pending_many([(ALICE, 0, 5)])
    assert row == (1, 7, PUB, "m1", "a.b", cbor2.dumps({"k": 1}), b"\x00p", 5.0)
    assert [type(v) for v in row] == [int, int, str, str, str, bytes, bytes, float]


def test_ack_many_and_pending_many_match_one_user_at_a_time(engine: Engine) -> None:
    q = SqlQueueStore(engine)
    for n in range(5):
        publish(q, f"m{n}", [(ALICE, 1), (BOB, 2)])
    reads = [(BOB, 1, 2), (ALICE, 0, 10), (PUB, 0, 3)]
    assert q.pending_many(reads) == [[_delivery_row(n) for n in q.pending(*r)] for r in reads]
    assert q.pending_many(reads)[0][0][0] == 2
    with pytest.raises(InvalidArgument):
        q.pending_many([(ALICE, 0, 0)])
    assert q.ack_many([(BOB, 2), (ALICE, 4), (PUB, 9)]) == [2, 4, 0]
    assert [n.nseq for n in q.pending(ALICE)] == [5]
    assert [n.nseq for n in q.pending(BOB)] == [3, 4, 5]
    assert q.depth(ALICE) == 1 and q.depth(BOB) == 3


def test_missed_many_reads_the_counts_to_take_without_taking_them(engine: Engine) -> None:
    q = SqlQueueStore(engine)
    for n in range(4):
        publish(q, f"m{n}", [(ALICE, 1), (BOB, 1)] if n < 1 else [(ALICE, 1)], max_depth=2)
    assert q.missed_many([BOB, ALICE, "sip:nobody@x"]) == {ALICE: 2}
    assert q.missed_many([]) == {}
    assert q.take_missed(ALICE) == 2 and q.missed_many([ALICE, BOB]) == {}


def test_acks_of_many_users_take_a_few_statements_not_three_each(engine: Engine) -> None:
    """A fan-out's round of acks (one per recipient) takes a few statements for all the
    users, not three per user (each a round trip on PostgreSQL)."""
    q = SqlQueueStore(engine)
    users = [f"sip:u{i:02d}@x" for i in range(40)]
    for n in range(3):
        publish(q, f"m{n}", [(u, 1) for u in users])
    statements: list[str] = []
    event.listen(engine, "before_cursor_execute", lambda *a: statements.append(a[2]))
    # Out of URI order, one user without a counter row, one acking nothing.
    acks = [(u, 2) for u in reversed(users[1:])] + [("sip:none@x", 5), (users[0], 0)]
    assert q.ack_many(acks) == [2] * 39 + [0, 0]
    assert len([s for s in statements if not s.startswith(("PRAGMA", "SET"))]) <= 3
    assert [n.nseq for n in q.pending(users[5])] == [3] and q.depth(users[5]) == 1
    assert q.depth(users[0]) == 3 and q.depth("sip:none@x") == 0


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    queued=st.lists(st.integers(0, 4), min_size=4, max_size=4),
    acks=st.lists(st.tuples(st.integers(0, 4), st.integers(0, 6)), min_size=1, max_size=6),
)
def test_ack_many_is_ack_in_turn(
    engine: Engine, queued: list[int], acks: list[tuple[int, int]]
) -> None:
    """Whatever the users (repeated or not, queued or not) and uptos: the counts, what is
    left and the depths are those of one ``ack`` after the other."""
    users = [f"sip:{uuid.uuid4().hex[:8]}@x" for _ in range(5)]  # the 5th never queued
    q = SqlQueueStore(engine)
    for user, count in zip(users, queued, strict=False):
        for n in range(count):
            publish(q, f"{user}-{n}", [(user, 1)])
    left = dict(zip(users, queued, strict=False))
    expected = []
    for i, upto in acks:
        gone = min(
            max(upto - (queued[i] - left[users[i]]) if i < 4 else 0, 0), left.get(users[i], 0)
        )
        expected.append(gone)
        if i < 4:
            left[users[i]] -= gone
    assert q.ack_many([(users[i], upto) for i, upto in acks]) == expected
    for user in users[:4]:
        assert q.depth(user) == left[user] == len(q.pending(user)) == _counted(engine, user)


_USERS = ("sip:u0@x", "sip:u1@x", "sip:u2@x")


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    st.lists(
        st.tuples(
            st.lists(st.tuples(st.sampled_from(_USERS), st.integers(1, 3)), max_size=5),
            st.integers(1, 4),
            st.sampled_from(["drop-oldest", "refuse-newest"]),
        ),
        min_size=1,
        max_size=8,
    )
)
def test_publish_follows_the_overflow_rules_one_target_at_a_time(
    engine: Engine, plan: list[tuple[list[tuple[str, int]], int, OverflowPolicy]]
) -> None:
    """publish against a model of the rules (module docstring), target by target in URI
    order: with room (the short path) and overflowing (the full walk) alike."""
    q = SqlQueueStore(engine)
    tag = uuid.uuid4().hex[:8]  # users of their own: the engine outlives one example
    queues: dict[str, collections.deque[tuple[int, int, str]]] = {}
    last: dict[str, int] = {}
    for n, (targets, max_depth, policy) in enumerate(plan):
        msg_id = f"{tag}-{n}"
        mine = [(f"{uri}{tag}", sub_id) for uri, sub_id in targets]
        queued: list[Enqueued] = []
        dropped: list[Dropped] = []
        for uri, sub_id in sorted(mine, key=lambda t: t[0]):
            queue = queues.setdefault(uri, collections.deque())
            if len(queue) >= max_depth and policy == "refuse-newest":
                dropped.append(Dropped(uri, None, sub_id, msg_id, policy))
                continue
            while len(queue) >= max_depth:
                old_nseq, old_sub, old_msg = queue.popleft()
                dropped.append(Dropped(uri, old_nseq, old_sub, old_msg, policy))
            last[uri] = last.get(uri, 0) + 1
            queue.append((last[uri], sub_id, msg_id))
            queued.append(Enqueued(uri, last[uri], sub_id, len(queue)))
        result = publish(q, msg_id, mine, max_depth=max_depth, policy=policy)
        assert result.queued == tuple(queued)
        assert result.dropped == tuple(dropped)
    for uri, queue in queues.items():
        assert [(p.nseq, p.sub_id, p.msg_id) for p in q.pending(uri)] == list(queue)
        assert q.depth(uri) == len(queue)
