"""The statements of one ``publish_many`` transaction, for each kind of database.

:meth:`~mdeci.store.queues.SqlQueueStore.publish_many` plans a batch of publishes in
memory; what it reads and writes goes through a :class:`PublishTx`:

1. :meth:`~PublishTx.record_and_lock`: record the (publisher, msg_id) pairs and create
   or lock the counter rows of every recipient of the batch, in URI order; the pairs
   that were new and each counter as it stands;
2. rarely, :meth:`~PublishTx.matched` (a duplicate's original count) and
   :meth:`~PublishTx.drop_oldest` (an overflow, after :meth:`~PublishTx.write_rows` of
   what it must see);
3. :meth:`~PublishTx.write_rows` and :meth:`~PublishTx.finish` (the counters written
   back, the other brokers told); the commit follows.

On SQLite (:class:`SqlPublishTx`) each is a statement run through SQLAlchemy, one after
the other: the database is a file of this process, a statement costs no round trip.

On PostgreSQL (:func:`pg_publish_tx`) every statement is a round trip to the server, and
a batch is half a dozen of them. The driver's pipeline mode sends the statements
without waiting for each one's answer: step 1 is one round trip (``BEGIN``, the record
and the locks together), step 3 and the ``COMMIT`` another. The server still runs them
one after the other, in the order sent, in one transaction, so the locks are taken in
the order the statements give (pairs, then counter rows in URI order) and the commit is
durable when the call returns; only the waits are fewer. An error of any statement
aborts the rest and comes out at the latest with the COMMIT's answer, as a
:class:`StoreError`; the transaction is rolled back and nothing was recorded.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any, Protocol, cast

from psycopg import Pipeline
from psycopg.pq import TransactionStatus
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import SQLAlchemyError

from mdeci.store._sql import store_error, transaction
from mdeci.store.queue_rows import PublishRequest, StoredRow, by_column
from mdeci.store.queue_sql import DROP_OLDEST, MATCHED, QueueSql
from mdeci.store.wake import NOTIFY_OTHERS

IDLE = TransactionStatus.IDLE
# Publishes recorded per SQLite statement: 4 parameters each, within SQLite's smallest
# limit on a statement's parameters (999).
RECORD_CHUNK = 200
# Users whose counter rows one statement locks: 1 parameter each, within the same limit.
LOCK_CHUNK = 500

#: A counter row as locked: (last_nseq, depth).
CounterRow = tuple[int, int]


class PublishTx(Protocol):
    """The reads and writes of one publish transaction; see the module docstring."""

    def record_and_lock(
        self, requests: Sequence[PublishRequest], uris: list[str]
    ) -> tuple[set[tuple[str, str]], dict[str, CounterRow]]:
        """Record the requests' pairs, then lock the counter rows of ``uris`` (sorted),
        creating the missing ones; the pairs that were new, and each user's counter."""

    def matched(self, publisher_uri: str, msg_id: str) -> int:
        """The matched count recorded for a pair recorded before."""

    def drop_oldest(self, uri: str, count: int) -> list[tuple[int, int, str]]:
        """Delete ``uri``'s ``count`` oldest queued rows; their (nseq, sub_id, msg_id)."""

    def write_rows(self, rows: list[StoredRow]) -> None:
        """Insert queued rows (tuples in QUEUE_COLUMNS order)."""

    def finish(self, updates: list[tuple[int, int, int, str]], uris: list[str]) -> None:
        """Write the counters back ((last_nseq, depth, missed added, uri) each) and tell
        the other brokers holding one of ``uris``; the last statements before commit."""


def _chunks(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _counters(rows: Iterator[Any] | list[Any], into: dict[str, CounterRow]) -> None:
    for uri, last, depth in rows:
        into[str(uri)] = (int(last), int(depth))


class SqlPublishTx:
    """:class:`PublishTx` over a SQLAlchemy connection in a transaction (SQLite's)."""

    def __init__(self, conn: Connection, sql: QueueSql, node: str = "") -> None:
        self._conn = conn
        self._sql = sql
        self._node = node if conn.dialect.name == "postgresql" else ""

    def record_and_lock(
        self, requests: Sequence[PublishRequest], uris: list[str]
    ) -> tuple[set[tuple[str, str]], dict[str, CounterRow]]:
        # The driver's own multi-row INSERT ... ON CONFLICT DO NOTHING RETURNING:
        # SQLAlchemy's per-row parameter processing of it is a visible share of a publish.
        recorded: set[tuple[str, str]] = set()
        for chunk in _chunks(requests, RECORD_CHUNK):
            params: list[object] = []
            for req in chunk:
                params += (req.publisher_uri, req.msg_id, len(req.targets), req.published_at)
            sql = self._sql.record.sql(len(chunk))
            for uri, msg_id in self._conn.exec_driver_sql(sql, tuple(params)):
                recorded.add((str(uri), str(msg_id)))
        counters: dict[str, CounterRow] = {}
        for part in _chunks(uris, LOCK_CHUNK):
            _counters(
                self._conn.exec_driver_sql(self._sql.lock.sql(len(part)), tuple(part)), counters
            )
        return recorded, counters

    def matched(self, publisher_uri: str, msg_id: str) -> int:
        params = {"publisher_uri": publisher_uri, "msg_id": msg_id}
        return int(self._conn.execute(MATCHED, params).scalar_one())

    def drop_oldest(self, uri: str, count: int) -> list[tuple[int, int, str]]:
        rows = self._conn.execute(DROP_OLDEST, {"uri": uri, "count": count}).all()
        return [(int(n), int(s), str(m)) for n, s, m in rows]

    def write_rows(self, rows: list[StoredRow]) -> None:
        # One driver executemany (measured no slower than a multi-row INSERT on SQLite).
        self._conn.exec_driver_sql(self._sql.insert_row, rows)

    def finish(self, updates: list[tuple[int, int, int, str]], uris: list[str]) -> None:
        self._conn.exec_driver_sql(
            self._sql.set_counter, updates[0] if len(updates) == 1 else updates
        )
        if self._node:
            # Other brokers' users hear of it at commit (mdeci/store/wake.py).
            self._conn.exec_driver_sql(NOTIFY_OTHERS, (uris, self._node))


@contextlib.contextmanager
def sql_publish_tx(engine: Engine, sql: QueueSql, node: str = "") -> Iterator[PublishTx]:
    """A :class:`SqlPublishTx` in one transaction, committed on exit (durable then):
    SQLite's, and PostgreSQL's where the driver's libpq has no pipeline mode (before 14).

    Raises:
        StoreError: the database failed; the transaction was rolled back.
    """
    with transaction(engine, "publish") as conn:
        yield SqlPublishTx(conn, sql, node)


class PgPublishTx:
    """:class:`PublishTx` on psycopg's connection in pipeline mode (PostgreSQL's): a
    statement is sent at once and its answer read only when needed."""

    def __init__(self, driver_conn: Any, sql: QueueSql, node: str) -> None:
        self._conn = driver_conn
        self._sql = sql
        self._node = node

    def _send(self, statement: str, params: Sequence[object]) -> Any:
        # A cursor per statement: a cursor executed again drops the answer it awaits.
        cursor = self._conn.cursor()
        cursor.execute(statement, params)
        return cursor

    def record_and_lock(
        self, requests: Sequence[PublishRequest], uris: list[str]
    ) -> tuple[set[tuple[str, str]], dict[str, CounterRow]]:
        # One array per column: four parameters whatever the batch (psycopg prepares
        # only statements of few parameters).
        columns = (
            [r.publisher_uri for r in requests],
            [r.msg_id for r in requests],
            [len(r.targets) for r in requests],
            [r.published_at for r in requests],
        )
        record = self._send(self._sql.record_unnest, columns)
        locks = [
            self._send(self._sql.lock.sql(len(part)), tuple(part))
            for part in _chunks(uris, LOCK_CHUNK)
        ]
        # The first fetch waits for every answer sent so far: one round trip.
        recorded = {(str(uri), str(msg_id)) for uri, msg_id in record.fetchall()}
        counters: dict[str, CounterRow] = {}
        for cursor in locks:
            _counters(cursor.fetchall(), counters)
        return recorded, counters

    def matched(self, publisher_uri: str, msg_id: str) -> int:
        (count,) = self._send(self._sql.matched, (publisher_uri, msg_id)).fetchone()
        return int(count)

    def drop_oldest(self, uri: str, count: int) -> list[tuple[int, int, str]]:
        rows = self._send(self._sql.drop_oldest, (uri, uri, count)).fetchall()
        return [(int(n), int(s), str(m)) for n, s, m in rows]

    def write_rows(self, rows: list[StoredRow]) -> None:
        # One statement whatever the batch: one array per column, the columns the
        # recipients of one publication share once per publication.
        self._send(self._sql.insert_unnest, by_column(rows))

    def finish(self, updates: list[tuple[int, int, int, str]], uris: list[str]) -> None:
        cursor = self._conn.cursor()
        cursor.executemany(self._sql.set_counter, updates)
        if self._node:
            # Other brokers' users hear of it at commit (mdeci/store/wake.py).
            self._send(NOTIFY_OTHERS, (uris, self._node))


def can_pipeline(engine: Engine) -> bool:
    """Whether ``engine``'s publishes can use :func:`pg_publish_tx`."""
    return engine.dialect.name == "postgresql" and Pipeline.is_supported()


@contextlib.contextmanager
def pg_publish_tx(engine: Engine, sql: QueueSql, node: str) -> Iterator[PublishTx]:
    """A :class:`PgPublishTx` in one transaction, committed on exit in the same round
    trip as the last statements; durable when the exit returns.

    ``BEGIN`` and ``COMMIT`` are statements of the pipeline like the others (the driver's
    own would wait for an answer each: two more round trips), so the connection is in
    autocommit mode meanwhile; it leaves idle and in its usual mode, or invalidated.

    Raises:
        StoreError: the database failed; the transaction was rolled back.
    """
    driver_error: type[Exception] = engine.dialect.loaded_dbapi.Error
    try:
        with engine.connect() as conn:
            driver_conn: Any = conn.connection.driver_connection
            try:
                driver_conn.autocommit = True
                with driver_conn.pipeline():
                    driver_conn.execute("BEGIN")
                    yield PgPublishTx(driver_conn, sql, node)
                    driver_conn.execute("COMMIT")
                # Leaving the pipeline sent a sync and read every answer, the COMMIT's last.
            except driver_error as exc:
                raise _failed(engine, conn, exc) from exc
            finally:
                _restore(conn, driver_conn, driver_error)
    except SQLAlchemyError as exc:
        raise store_error("publish", exc) from exc


def _restore(conn: Connection, driver_conn: Any, driver_error: type[Exception]) -> None:
    """``driver_conn`` idle and out of autocommit mode before it goes back to the pool
    (a transaction an exception left open is rolled back); invalidated if it cannot be."""
    if conn.invalidated:
        return
    try:
        if driver_conn.info.transaction_status != IDLE:
            driver_conn.rollback()
        driver_conn.autocommit = False
    except driver_error as exc:
        conn.invalidate(exc)


def _failed(engine: Engine, conn: Connection, exc: Exception) -> Exception:
    """The StoreError for a driver error, after what SQLAlchemy does for its own
    statements: a connection the error says is gone is invalidated, with the pool's
    others opened before it (a live one is rolled back by :func:`_restore`)."""
    dbapi_conn = conn.connection.dbapi_connection
    if engine.dialect.is_disconnect(cast(Any, exc), dbapi_conn, None):
        conn.invalidate(exc)
        engine.dispose()  # checked-out connections finish; idle ones close
    return store_error("publish", exc)
