"""The queue store when the database fails under it: a driver error on the driver's own
cursor worded as a StoreError, connections the server ends under that cursor, a commit
that fails."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import OperationalError

from mdeci.store.base import make_engine
from mdeci.store.errors import StoreError
from mdeci.store.queues import PublishRequest, SqlQueueStore, StoredRow, as_queued
from tests.store.test_queues import ALICE, PUB, publish


def test_ack_many_and_pending_many_report_driver_errors_as_store_errors(engine: Engine) -> None:
    """They run the driver's cursor directly: its errors are worded as SQLAlchemy's are
    (StoreError), and nothing is deleted."""
    q = SqlQueueStore(engine)
    publish(q, "m1", [(ALICE, 1)])
    with engine.begin() as conn:
        conn.exec_driver_sql("ALTER TABLE queued_notifications RENAME TO moved_away")
    try:
        with pytest.raises(StoreError, match=r"^pending failed: "):
            q.pending_many([(ALICE, 0, 5)])
        with pytest.raises(StoreError, match=r"^ack failed: "):
            q.ack_many([(ALICE, 1)])
    finally:
        with engine.begin() as conn:
            conn.exec_driver_sql("ALTER TABLE moved_away RENAME TO queued_notifications")
    assert q.depth(ALICE) == 1 and [n.nseq for n in q.pending(ALICE)] == [1]
    assert q.ack_many([(ALICE, 1)]) == [1] and q.depth(ALICE) == 0


def _kill(engine: Engine, pids: Sequence[int]) -> None:
    """End PostgreSQL backends ``pids`` from another connection, as a restart would."""
    killer = make_engine(engine.url.render_as_string(hide_password=False))
    try:
        with killer.connect() as conn:
            for pid in pids:
                assert conn.exec_driver_sql(f"SELECT pg_terminate_backend({int(pid)})").scalar()
    finally:
        killer.dispose()


def _pooled_pids(engine: Engine, n: int) -> list[int]:
    """Open ``n`` pooled connections at once and give them back; their backends' pids."""
    conns = [engine.connect() for _ in range(n)]
    try:
        return [int(c.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()) for c in conns]
    finally:
        for c in conns:
            c.close()


def test_postgresql_connections_killed_under_the_driver_cursor_cost_one_error(
    engine: Engine,
) -> None:
    """pending_many and ack_many run the driver's cursor, outside SQLAlchemy's error
    handling: a server that ends its connections (a restart, a failover) must cost one
    StoreError, not one per dead pooled connection (which the pool would hand out in
    turn)."""
    if engine.dialect.name != "postgresql":
        pytest.skip("a server-side kill of pooled connections: PostgreSQL only")
    q = SqlQueueStore(engine)
    publish(q, "m1", [(ALICE, 1)])
    for call in (lambda: q.pending_many([(ALICE, 0, 5)]), lambda: q.ack_many([(ALICE, 0)])):
        _kill(engine, _pooled_pids(engine, 3))
        failures = 0
        for _ in range(4):
            try:
                call()
            except StoreError:
                failures += 1
        assert failures == 1
    assert [[row[0] for row in rows] for rows in q.pending_many([(ALICE, 0, 5)])] == [[1]]


def test_a_postgresql_connection_killed_inside_ack_many_fails_on_the_driver_cursor(
    engine: Engine,
) -> None:
    """The kill comes after the transaction's own SET LOCAL (which SQLAlchemy runs and
    would handle), so the driver's cursor meets it: one StoreError, nothing deleted, and
    the next ack works."""
    if engine.dialect.name != "postgresql":
        pytest.skip("a server-side kill of the pooled connection: PostgreSQL only")
    q = SqlQueueStore(engine)
    publish(q, "m1", [(ALICE, 1)])
    seen: list[str] = []

    def kill_after(conn: Connection, _c: object, statement: str, *_args: object) -> None:
        seen.append(statement)
        if statement.startswith("SET LOCAL"):
            pid = conn.connection.dbapi_connection.info.backend_pid  # type: ignore[union-attr]
            _kill(engine, [pid])

    event.listen(engine, "after_cursor_execute", kill_after)
    try:
        with pytest.raises(StoreError, match=r"^ack failed: "):
            q.ack_many([(ALICE, 1)])
    finally:
        event.remove(engine, "after_cursor_execute", kill_after)
    assert any(s.startswith("SET LOCAL") for s in seen)
    assert q.depth(ALICE) == 1
    assert q.ack_many([(ALICE, 1)]) == [1] and q.depth(ALICE) == 0


def test_a_closed_sqlite_connection_under_the_driver_cursor_is_a_store_error(
    engine: Engine,
) -> None:
    """sqlite3 raises its own ProgrammingError ("Cannot operate on a closed database")
    when the driver's cursor is opened on a closed connection, and again when a cursor
    of it is closed: pending_many must turn that into one StoreError (the broker catches
    only StoreError), and the pool must open a new connection for the next call."""
    if engine.dialect.name != "sqlite":
        pytest.skip("sqlite3's closed connection; PostgreSQL's server-side kill is above")
    q = SqlQueueStore(engine)
    publish(q, "m1", [(ALICE, 1)])

    def close_it(dbapi_connection: Any, *_args: object) -> None:
        dbapi_connection.close()  # under the checked-out connection, as a crash would

    event.listen(engine.pool, "checkout", close_it, once=True)
    with pytest.raises(StoreError, match=r"^pending failed: "):
        q.pending_many([(ALICE, 0, 5)])
    assert [[row[0] for row in rows] for rows in q.pending_many([(ALICE, 0, 5)])] == [[1]]


@contextlib.contextmanager
def failing_commits(engine: Engine) -> Iterator[None]:
    """Every COMMIT that holds a new queued row fails, until the block ends: on
    PostgreSQL the server itself refuses it (a deferred constraint trigger, checked at
    COMMIT, whichever way the driver sent it); on SQLite SQLAlchemy's commit raises as
    a lost connection would."""
    if engine.dialect.name == "postgresql":
        with engine.begin() as conn:
            conn.exec_driver_sql(
                "CREATE FUNCTION refuse_commit() RETURNS trigger LANGUAGE plpgsql AS "
                "$$ BEGIN RAISE EXCEPTION 'refused at commit'; END $$"
            )
            conn.exec_driver_sql(
                "CREATE CONSTRAINT TRIGGER refuse_commit AFTER INSERT ON queued_notifications "
                "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION refuse_commit()"
            )
        try:
            yield
        finally:
            with engine.begin() as conn:
                conn.exec_driver_sql("DROP TRIGGER refuse_commit ON queued_notifications")
                conn.exec_driver_sql("DROP FUNCTION refuse_commit()")
        return

    def refuse(_conn: Connection) -> None:
        raise OperationalError("COMMIT", {}, Exception("server closed the connection"))

    event.listen(engine, "commit", refuse)
    try:
        yield
    finally:
        event.remove(engine, "commit", refuse)


def test_a_publish_whose_commit_fails_gives_no_written_rows(engine: Engine) -> None:
    """``written`` is filled after the commit: the rows of a batch whose COMMIT failed
    (rolled back here) are not handed to the caller, who would serve them from memory;
    the publish, sent again, is recorded (not taken for a duplicate)."""
    q = SqlQueueStore(engine)
    requests = [
        PublishRequest(PUB, f"m{n}", "z", b"\xa0", b"one", False, 1.0, [(ALICE, 1)]) for n in (1, 2)
    ]
    written: list[StoredRow] = []
    with failing_commits(engine), pytest.raises(StoreError, match=r"^publish failed: "):
        q.publish_many(requests, max_depth=10, policy="drop-oldest", written=written)
    assert written == [] and q.depth(ALICE) == 0 and q.last_nseq(ALICE) == 0
    results = q.publish_many(requests, max_depth=10, policy="drop-oldest", written=written)
    assert [r.duplicate for r in results] == [False, False]
    assert [as_queued(row) for row in written] == q.pending(ALICE)
    assert [n.nseq for n in q.pending(ALICE)] == [1, 2]
