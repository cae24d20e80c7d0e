"""The queue store's driver statements (mdeci/store/queue_sql.py), each run on SQLite and
on PostgreSQL: those compiled from SQLAlchemy Core, the repeated ones for several sizes,
and PostgreSQL's array statements that stay SQL text."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import bindparam, insert, select
from sqlalchemy.engine import Connection, Engine

from mdeci.store.models import QueueCounterRow, SessionRow
from mdeci.store.queue_sql import QueueSql, Repeated, driver_dialect, queue_sql

ROW = ("sip:a@x", 1, 7, "sip:p@x", "m1", "news.a", b"\xa0", b"hi", False, 1.5, None)


def run(conn: Connection, sql: str, params: Any = ()) -> list[tuple[Any, ...]]:
    result = conn.exec_driver_sql(sql, params)
    return [tuple(r) for r in result] if result.returns_rows else []


def counters(conn: Connection) -> dict[str, tuple[int, int, int]]:
    rows = run(conn, "SELECT uri, last_nseq, depth, missed FROM queue_counters")
    return {uri: (last, depth, missed) for uri, last, depth, missed in rows}


def check_single_row_statements(conn: Connection, sql: QueueSql) -> None:
    assert run(conn, sql.lock.sql(2), ("sip:a@x", "sip:b@x")) == [
        ("sip:a@x", 0, 0),
        ("sip:b@x", 0, 0),
    ]
    run(conn, sql.set_counter, (1, 1, 2, "sip:a@x"))
    run(conn, sql.insert_row, ROW)
    assert run(conn, sql.pending, ("sip:a@x", 0, 10)) == [
        (1, 7, "sip:p@x", "m1", "news.a", b"\xa0", b"hi", 1.5)
    ]
    assert run(conn, sql.pending, ("sip:a@x", 1, 10)) == []
    assert run(conn, sql.missed.sql(2), ("sip:a@x", "sip:b@x")) == [("sip:a@x", 2)]
    run(conn, sql.lock_one, ("sip:a@x",))
    assert conn.exec_driver_sql(sql.ack, ("sip:a@x", 1)).rowcount == 1
    run(conn, sql.shrink, (1, "sip:a@x"))
    assert counters(conn)["sip:a@x"] == (1, 0, 2)
    # Locking again keeps what is there.
    assert run(conn, sql.lock.sql(1), ("sip:a@x",)) == [("sip:a@x", 1, 0)]


def _session(conn: Connection, uri: str, epoch: int) -> None:
    text = {k: "x" for k in ("call_id", "local_tag", "remote_tag", "remote_target")}
    text |= {k: "" for k in ("route_set", "remote_sdp", "media_addr")}
    times = {"local_cseq": 1, "remote_cseq": 1, "started_at": 0.0, "updated_at": 0.0}
    values = {"uri": uri, "session_key": b"\0", "status": "CONNECTED", "owner": "a"}
    conn.execute(insert(SessionRow).values(**values, **text, **times, epoch=epoch))


def check_held_statements(conn: Connection, sql: QueueSql) -> None:
    run(conn, sql.insert_row, ROW)
    assert run(conn, sql.pending_held, ("sip:a@x", 0, 3, 10)) == []  # no session row
    _session(conn, "sip:a@x", 3)
    assert [r[0] for r in run(conn, sql.pending_held, ("sip:a@x", 0, 3, 10))] == [1]
    assert run(conn, sql.pending_held, ("sip:a@x", 0, 2, 10)) == []  # another epoch


def check_record(conn: Connection, sql: QueueSql) -> None:
    pairs = [("sip:p@x", f"m{i}", 1, 2.0) for i in range(3)]
    flat = tuple(v for pair in pairs for v in pair)
    assert sorted(run(conn, sql.record.sql(3), flat)) == [(p, m) for p, m, _, _ in pairs]
    assert run(conn, sql.record.sql(3), flat) == []  # published before: none is new


def check_sqlite_acks(conn: Connection, sql: QueueSql) -> None:
    run(conn, sql.lock.sql(2), ("sip:a@x", "sip:b@x"))
    run(conn, sql.insert_row, [ROW, ("sip:a@x", 2, *ROW[2:]), ("sip:b@x", 1, *ROW[2:])])
    run(conn, sql.ack_lock.sql(2), ("sip:a@x", "sip:b@x"))
    gone = run(conn, sql.ack_delete.sql(2), ("sip:a@x", 2, "sip:b@x", 0))
    assert gone == [("sip:a@x",), ("sip:a@x",)]
    _session(conn, "sip:a@x", 3)
    _session(conn, "sip:b@x", 5)
    held = run(conn, sql.hold_lite.sql(2), ("sip:a@x", 3, "sip:b@x", 4))
    assert held == [("sip:a@x",)]


def check_postgresql_arrays(conn: Connection, sql: QueueSql) -> None:
    new = run(conn, sql.record_unnest, (["sip:p@x", "sip:p@x"], ["u1", "u2"], [1, 2], [1.0, 2.0]))
    assert sorted(new) == [("sip:p@x", "u1"), ("sip:p@x", "u2")]
    assert run(conn, sql.matched, ("sip:p@x", "u2")) == [(2,)]
    run(conn, sql.lock.sql(2), ("sip:a@x", "sip:b@x"))
    # Two rows of publication 1, one of publication 2, as by_column lays them out.
    run(
        conn,
        sql.insert_unnest,
        (
            ["sip:a@x", "sip:b@x", "sip:a@x"],
            [1, 1, 2],
            [7, 8, 9],
            [False, True, False],
            [1, 1, 2],
            ["sip:p@x", "sip:q@x"],
            ["u1", "u2"],
            ["news.a", "news.b"],
            [b"\xa0", b"\xa0"],
            [b"one", b"two"],
            [1.0, 2.0],
            [None, "bulk"],
        ),
    )
    rows = run(conn, "SELECT uri, nseq, msg_id, urgent, payload, qclass FROM queued_notifications")
    assert sorted(rows) == [
        ("sip:a@x", 1, "u1", False, b"one", None),
        ("sip:a@x", 2, "u2", False, b"two", "bulk"),
        ("sip:b@x", 1, "u1", True, b"one", None),
    ]
    run(conn, "UPDATE queue_counters SET depth = 2 WHERE uri = 'sip:a@x'")
    run(conn, "UPDATE queue_counters SET depth = 1 WHERE uri = 'sip:b@x'")
    assert run(conn, sql.ack_lock_pg, (["sip:b@x", "sip:a@x"],)) == [("sip:a@x",), ("sip:b@x",)]
    gone = run(conn, sql.ack_delete_pg, (["sip:a@x", "sip:b@x"], [2, 0]))
    assert gone == [("sip:a@x", 2)]
    assert counters(conn)["sip:a@x"][1] == 0 and counters(conn)["sip:b@x"][1] == 1
    assert run(conn, sql.drop_oldest, ("sip:b@x", "sip:b@x", 1)) == [(1, 8, "u1")]
    _session(conn, "sip:a@x", 3)
    _session(conn, "sip:b@x", 5)
    held = run(conn, sql.hold_pg, (["sip:a@x", "sip:b@x"], [3, 4]))
    assert held == [("sip:a@x",)]


CHECKS: dict[str, tuple[Callable[[Connection, QueueSql], None], frozenset[str]]] = {
    "single": (
        check_single_row_statements,
        frozenset(
            {"insert_row", "pending", "lock_one", "ack", "shrink", "set_counter", "lock", "missed"}
        ),
    ),
    "record": (check_record, frozenset({"record"})),
    "held": (check_held_statements, frozenset({"pending_held"})),
    "sqlite": (check_sqlite_acks, frozenset({"ack_lock", "ack_delete", "hold_lite"})),
    "postgresql": (
        check_postgresql_arrays,
        frozenset(
            {
                "record_unnest",
                "insert_unnest",
                "ack_lock_pg",
                "ack_delete_pg",
                "hold_pg",
                "matched",
                "drop_oldest",
            }
        ),
    ),
}


def statements(sql: QueueSql) -> set[str]:
    return {k for k in vars(sql) if k != "dialect_name"}


@pytest.mark.parametrize("check", list(CHECKS))
def test_each_statement_runs_on_its_backend(engine: Engine, check: str) -> None:
    name = engine.dialect.name
    if check in ("sqlite", "postgresql") and check != name:
        pytest.skip(f"{check}'s statements only")
    sql = queue_sql(engine.dialect)
    conn = engine.connect()
    try:
        CHECKS[check][0](conn, sql)
    finally:
        conn.rollback()
        conn.close()


def test_every_statement_of_the_dialect_is_run(engine: Engine) -> None:
    name = engine.dialect.name
    covered = set().union(
        *(names for check, (_, names) in CHECKS.items() if check not in ("sqlite", "postgresql")),
        CHECKS[name][1],
    )
    assert statements(queue_sql(engine.dialect)) == covered


@pytest.mark.parametrize("n", [1, 3, 17])
def test_a_repeated_statement_is_what_core_compiles_for_n_items(engine: Engine, n: int) -> None:
    dialect = driver_dialect(engine.dialect)
    c = QueueCounterRow
    core = select(c.uri).where(c.uri.in_([bindparam(f"u{i}") for i in range(n)]))
    repeated = Repeated.split(
        lambda k: select(c.uri).where(c.uri.in_([bindparam(f"u{i}") for i in range(k)])),
        dialect,
        lambda k: tuple(f"u{i}" for i in range(k)),
        start=" IN (",
        end=")",
    )
    assert repeated.sql(n) == str(core.compile(dialect=dialect))
