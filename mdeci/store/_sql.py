"""Helpers shared by the repositories: one transaction per operation, error translation,
and the dialect's ``INSERT ... ON CONFLICT`` (SQLite and PostgreSQL spell it alike).

Every write transaction starts with a write statement. On SQLite the driver opens the
transaction at the first write, so the write lock is taken (waiting up to the busy
timeout) before anything is read; a transaction that read first and wrote later could
fail with SQLITE_BUSY instead of waiting. On PostgreSQL that first write also takes the
row locks that serialise concurrent callers.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import SQLAlchemyError

from mdeci.store.errors import StoreError


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
        raise StoreError(f"{what} failed: {exc.__class__.__name__}: {exc}") from exc


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
        raise StoreError(f"{what} failed: {exc.__class__.__name__}: {exc}") from exc


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
        raise StoreError(f"{what} failed: {exc.__class__.__name__}: {exc}") from exc


def insert_on_conflict(conn: Connection, model: Any) -> Any:
    """``INSERT`` for ``model`` that supports ``on_conflict_do_update/nothing``.

    Raises:
        StoreError: the dialect is neither SQLite nor PostgreSQL.
    """
    name = conn.dialect.name
    if name == "postgresql":
        return postgresql.insert(model)
    if name == "sqlite":
        return sqlite.insert(model)
    raise StoreError(f"unsupported database dialect {name!r} (SQLite or PostgreSQL only)")
