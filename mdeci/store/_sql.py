"""Helpers shared by the repositories: one transaction per operation, error translation
(:func:`store_error` names the cause: a full disk, an unreachable server, anything else),
and the dialect's ``INSERT ... ON CONFLICT`` (SQLite and PostgreSQL spell it alike).

Every write transaction starts with a write statement. On SQLite the driver opens the
transaction at the first write, so the write lock is taken (waiting up to the busy
timeout) before anything is read; a transaction that read first and wrote later could
fail with SQLITE_BUSY instead of waiting. On PostgreSQL that first write also takes the
row locks that serialise concurrent callers.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Table
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError, OperationalError, SQLAlchemyError

from mdeci.store.errors import StorageFull, StoreError, StoreUnavailable

# SQLite's result code for a write the disk cannot hold (sqlite3.Error.sqlite_errorcode).
_SQLITE_FULL = 13
# PostgreSQL SQLSTATEs of a server that is going away or not there yet (admin_shutdown,
# crash_shutdown, cannot_connect_now); class 08 is every connection exception.
_PG_GOING = frozenset({"57P01", "57P02", "57P03"})


def store_error(what: str, exc: Exception) -> StoreError:
    """The :class:`StoreError` for driver error ``exc`` raised while doing ``what``.

    Its class names the cause a peer may be told (:class:`StorageFull`,
    :class:`StoreUnavailable`, else :class:`StoreError`); its message keeps the driver's
    text for the operator's log.
    """
    return _kind(exc)(f"{what} failed: {exc.__class__.__name__}: {exc}")


def _kind(exc: Exception) -> type[StoreError]:
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return StoreUnavailable
    orig = exc.orig if isinstance(exc, DBAPIError) else exc
    sqlstate = getattr(orig, "sqlstate", None)
    if isinstance(sqlstate, str) and sqlstate:
        if sqlstate.startswith("53"):
            return StorageFull
        if sqlstate.startswith("08") or sqlstate in _PG_GOING:
            return StoreUnavailable
        return StoreError
    if getattr(orig, "sqlite_errorcode", None) == _SQLITE_FULL or (
        "database or disk is full" in str(orig)
    ):
        return StorageFull
    # psycopg raises OperationalError without a SQLSTATE when no server answered
    # (connection refused, reset, closed by a restart).
    if isinstance(exc, OperationalError) and type(orig).__module__.startswith("psycopg"):
        return StoreUnavailable
    return StoreError


@contextmanager
def transaction(engine: Engine, what: str) -> Iterator[Connection]:
    """Run one operation in one transaction, committed on exit (durable when it returns).

    Raises:
        StoreError: the database failed; the transaction was rolled back.
    """
    try:
        with engine.begin() as conn:
            yield conn
    except SQLAlchemyError as exc:
        raise store_error(what, exc) from exc


@contextmanager
def relaxed_transaction(engine: Engine, what: str) -> Iterator[Connection]:
    """One transaction whose commit does not wait for the disk (no fsync): only for
    writes whose loss in a crash merely repeats work, never loses any (an ack: the
    notifications come again and the agent drops them by nseq). The next durable commit
    flushes it anyway (SQLite's WAL is one file; PostgreSQL's WAL is sequential).

    SQLite: ``synchronous=NORMAL`` for this transaction, ``FULL`` again afterwards;
    PostgreSQL: ``SET LOCAL synchronous_commit = off``.

    Raises:
        StoreError: the database failed; the transaction was rolled back.
    """
    try:
        with engine.connect() as conn:
            lite = conn.dialect.name == "sqlite"
            # The pragma runs outside SQLite's transaction (the driver begins at the
            # first write); SET LOCAL is inside PostgreSQL's and ends with it.
            conn.exec_driver_sql(
                "PRAGMA synchronous=NORMAL" if lite else "SET LOCAL synchronous_commit = off"
            )
            try:
                yield conn
                conn.commit()
            finally:
                if lite:
                    conn.rollback()
                    conn.exec_driver_sql("PRAGMA synchronous=FULL")
                    conn.commit()
    except SQLAlchemyError as exc:
        raise store_error(what, exc) from exc


@contextmanager
def reading(engine: Engine, what: str) -> Iterator[Connection]:
    """A connection for reads only.

    Raises:
        StoreError: the database failed.
    """
    try:
        with engine.connect() as conn:
            yield conn
    except SQLAlchemyError as exc:
        raise store_error(what, exc) from exc


def forget_old_pages(engine: Engine, what: str) -> bool:
    """After a secret was cleared: SQLite copies the write-ahead log into the database
    file and truncates it, so the old pages, and the secret in them, leave the ``-wal``
    file now rather than at some later checkpoint. Whether it completed: a reader in
    the middle of a transaction leaves it to the next checkpoint, and a failure changes
    nothing already committed. PostgreSQL: nothing to do here (its write-ahead log is
    the server's).
    """
    if engine.dialect.name != "sqlite":
        return True
    try:
        with engine.connect() as conn:
            busy = conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)").scalar_one()
    except SQLAlchemyError:
        return False  # the commit stands; the next checkpoint takes the pages
    return int(busy) == 0


def insert_on_conflict(conn: Connection, model: Any) -> Any:
    """``INSERT`` for ``model`` that supports ``on_conflict_do_update/nothing``.

    Raises:
        StoreError: the dialect is neither SQLite nor PostgreSQL.
    """
    return _insert(conn.dialect.name, model)


def upsert_statement(
    engine: Engine,
    table: Table,
    keys: Sequence[str],
    update: Sequence[str],
    expressions: Mapping[str, Any] | None = None,
) -> Any:
    """``INSERT INTO table ... ON CONFLICT (keys) DO UPDATE`` setting each column of
    ``update`` to the value the insert gave it, and each of ``expressions`` to its
    expression; the values are bound when it runs (``conn.execute(stmt, {column:
    value})``). A repository builds it once: a statement built per call costs more than
    SQLite takes to run it (SQLAlchemy coerces and keys every literal value).

    Raises:
        StoreError: the dialect is neither SQLite nor PostgreSQL.
    """
    stmt = _insert(engine.dialect.name, table)
    values = {name: stmt.excluded[name] for name in update}
    return stmt.on_conflict_do_update(
        index_elements=[table.c[name] for name in keys],
        set_={**values, **(expressions or {})},
    )


def _insert(name: str, model: Any) -> Any:
    if name == "postgresql":
        return postgresql.insert(model)
    if name == "sqlite":
        return sqlite.insert(model)
    raise StoreError(f"unsupported database dialect {name!r} (SQLite or PostgreSQL only)")
