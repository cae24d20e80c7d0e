"""Idempotent publish and per-URI durable notification queues (docs/protocol.md sections 5, 6).

Theory of operation
-------------------
``publish`` is one transaction that

1. records ``(publisher_uri, msg_id)`` in ``published_messages`` with the matched count;
   if that pair is there already the publish is a duplicate: it returns the original
   count and queues nothing (an agent re-sending after a handover publishes once);
2. creates or locks every recipient's row in ``queue_counters`` with one statement, in
   URI order (so concurrent publishes lock the users' counter rows in one order and
   cannot deadlock), reading ``last_nseq`` and ``depth`` (the queue's length, kept by
   every write to the queue, so no ``COUNT(*)``); a duplicate's recipients are locked
   too, as the statement goes before the answer of step 1 is read;
3. plans each target ``(uri, sub_id)`` in memory, in URI order: applies the overflow
   policy if the queue holds ``max_depth`` entries already, and gives the notification
   ``nseq = last_nseq + 1``;
4. writes the plan set-based: one ``DELETE`` per user that overflows ``drop-oldest``,
   one ``INSERT`` of the queued rows, one executemany ``UPDATE`` of the counters (a
   fan-out to 100 users is a handful of statements, not ~400). On PostgreSQL the
   statements are pipelined: two round trips, commit included
   (:mod:`mdeci.store.publish_tx`).

``ack`` and ``remove`` lock the counter row before deleting (the order ``publish`` takes
its locks in) and lower ``depth`` by what they deleted.

``nseq`` is per recipient URI, strictly increasing and never reused: the counter row is
never deleted, and it only grows. It is gapless except where an entry was dropped. The
counter row stays locked until commit, so nseqs of one user also commit in increasing
order: a reader never sees nseq n+1 before nseq n has committed (or been rolled back,
which rolls the counter back with it).

Overflow (per user, bounded by ``max_depth`` >= 1):

- ``drop-oldest``: delete the oldest queued entries (lowest nseq) until there is room,
  then queue the new one; each deleted entry is reported in ``PublishResult.dropped``
  with its nseq.
- ``refuse-newest``: do not queue the new one (no nseq is consumed); it is reported in
  ``dropped`` with ``nseq=None``.

Either way the user's ``missed`` counter grows by one per dropped entry, and
``take_missed`` reads and resets it so the agent can be told how many it missed.

Entries leave the queue only on ``ack`` (or as an overflow drop); they do not expire
with their subscription.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import Delete, delete, select, tuple_, update
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.orm import InstrumentedAttribute

from mdeci.config import OVERFLOW_POLICIES as OVERFLOW_POLICIES
from mdeci.store._sql import reading, relaxed_transaction, store_error, transaction
from mdeci.store.errors import InvalidArgument, StoreError
from mdeci.store.models import PublishedRow, QueueCounterRow
from mdeci.store.publish_tx import (
    LOCK_CHUNK,
    PublishTx,
    can_pipeline,
    pg_publish_tx,
    sql_publish_tx,
)
from mdeci.store.queue_rows import (
    DeliveryRow,
    Dropped,
    Enqueued,
    OverflowPolicy,
    PublishRequest,
    PublishResult,
    QueuedNotification,
    StoredRow,
    as_delivery,
    as_queued,
    queue_row,
)
from mdeci.store.queue_sql import (
    LOCK_ONE,
    PENDING,
    PENDING_URGENT,
    REMOVE,
    SHRINK,
    queue_sql,
)

_new_tuple = tuple.__new__

# Acks one SQLite DELETE applies (see SqlQueueStore._ack_set): 2 parameters each.
_ACK_CHUNK = 400


@dataclass(slots=True)
class _Counter:
    """One recipient's counter row while ``publish`` plans its targets."""

    last_nseq: int
    depth: int
    missed: int = 0
    drop_existing: int = 0  # how many of the entries queued before this publish go


class SqlQueueStore:
    """Publish idempotence and the per-user queues in SQL; one transaction per method.

    Its statements (:mod:`mdeci.store.queue_sql`) are built once and reused with bound
    parameters: building a SQLAlchemy statement per call costs more than running it.
    """

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        # The driver's own SQL of the hot paths (see queue_sql.py), compiled once per
        # dialect.
        self._sql = queue_sql(engine.dialect)
        self._pg = engine.dialect.name == "postgresql"
        self._pipelined = can_pipeline(engine)
        # What the driver raises (pending_many and ack_many run its cursor directly, below
        # SQLAlchemy, which translates only what passes through it).
        self._driver_error: type[Exception] = engine.dialect.loaded_dbapi.Error
        # The broker node publishing through this store: on PostgreSQL each publish wakes
        # the other nodes holding a recipient ("": one broker, nobody to wake).
        self.node = ""

    def publish(
        self,
        publisher_uri: str,
        msg_id: str,
        subject: str,
        attrs_cbor: bytes,
        payload: bytes,
        *,
        urgent: bool,
        published_at: float,
        targets: Sequence[tuple[str, int]],
        max_depth: int,
        policy: OverflowPolicy,
    ) -> PublishResult:
        """Record a publish and queue one notification per ``(uri, sub_id)`` target.

        All or nothing, in one transaction; see the module docstring for the rules.
        ``matched`` is ``len(targets)``; a target appearing twice is queued twice.

        Raises:
            InvalidArgument: ``max_depth`` < 1 or an unknown ``policy``.
            StoreError: the database failed; nothing was recorded or queued.
        """
        request = PublishRequest(
            publisher_uri, msg_id, subject, attrs_cbor, payload, urgent, published_at, targets
        )
        return self.publish_many([request], max_depth=max_depth, policy=policy)[0]

    def publish_many(
        self,
        requests: Sequence[PublishRequest],
        *,
        max_depth: int,
        policy: OverflowPolicy,
        written: list[StoredRow] | None = None,
    ) -> list[PublishResult]:
        """``publish`` each request, in order, all in one transaction (one commit, one
        fsync: a group commit); the results in the same order.

        Each request is handled exactly as ``publish`` would one after the other (a
        msg_id twice is a duplicate the second time). All or nothing: if the database
        fails, none of them is recorded or queued.

        ``written``, when given, gets every queue row the batch inserted, in the order
        inserted (``as_queued`` makes each what ``pending`` reads back), once the batch
        is committed (nothing if the call raises): the broker hands them to connected
        users without reading them again. A row an overflow of the same batch
        deleted again is among them; its user is in that publish's ``dropped``.

        Raises:
            InvalidArgument: ``max_depth`` < 1 or an unknown ``policy``.
            StoreError: the database failed; nothing was recorded or queued.
        """
        if max_depth < 1:
            raise InvalidArgument(f"max_depth must be at least 1, not {max_depth}")
        if policy not in OVERFLOW_POLICIES:
            raise InvalidArgument(f"overflow policy must be one of {OVERFLOW_POLICIES}")
        results: list[PublishResult | None] = []
        fresh: list[PublishRequest] = []
        if not requests:
            return []
        # The rows go to ``written`` only after the commit: a caller that kept them on a
        # StoreError would hand on rows the store may not have.
        inserted: list[StoredRow] | None = None if written is None else []
        # Every recipient of the batch, sorted (so concurrent transactions lock the
        # counter rows in one order and cannot deadlock); locked with the record, in
        # the same round trip on PostgreSQL, before knowing which pairs are new.
        every = sorted({uri for req in requests for uri, _ in req.targets})
        with self._publish_tx() as tx:
            recorded, locked = tx.record_and_lock(requests, every)
            # The first request of a new pair is the publish; any later one in the batch,
            # like every request of a pair recorded before, is a duplicate of it.
            counts: dict[tuple[str, str], int] = {}
            for req in requests:
                key = (req.publisher_uri, req.msg_id)
                if key in recorded and key not in counts:
                    counts[key] = len(req.targets)
                    results.append(None)
                    fresh.append(req)
                    continue
                if key not in counts:
                    counts[key] = tx.matched(*key)
                results.append(PublishResult(matched=counts[key], duplicate=True))
            uris = sorted({uri for req in fresh for uri, _ in req.targets})
            if not uris:
                return [r or PublishResult(matched=0, duplicate=False) for r in results]
            # In URI order, as the rows were locked (the counters are written in this order).
            counters = {uri: _Counter(*locked[uri]) for uri in uris}
            unwritten: list[StoredRow] = []
            done = iter(
                [
                    self._queue(
                        tx,
                        unwritten,
                        inserted,
                        counters,
                        sorted(req.targets, key=lambda t: t[0]),
                        max_depth,
                        policy,
                        req.urgent_subs,
                        req,
                    )
                    for req in fresh
                ]
            )
            if unwritten:
                self._write_rows(tx, unwritten, inserted)
            tx.finish([(c.last_nseq, c.depth, c.missed, uri) for uri, c in counters.items()], uris)
        if written is not None and inserted:
            written += inserted
        return [r if r is not None else next(done) for r in results]

    def _publish_tx(self) -> contextlib.AbstractContextManager[PublishTx]:
        """One publish transaction (mdeci/store/publish_tx.py): on PostgreSQL, its
        statements pipelined, two round trips in all."""
        if self._pipelined:
            return pg_publish_tx(self._engine, self._sql, self.node)
        return sql_publish_tx(self._engine, self._sql, self.node)

    @staticmethod
    def _write_rows(tx: PublishTx, rows: list[StoredRow], written: list[StoredRow] | None) -> None:
        """Insert queued rows (tuples in QUEUE_COLUMNS order); ``written`` (if any) gets
        them too."""
        tx.write_rows(rows)
        if written is not None:
            written += rows

    def _queue(
        self,
        tx: PublishTx,
        unwritten: list[StoredRow],
        written: list[StoredRow] | None,
        counters: dict[str, _Counter],
        ordered: list[tuple[str, int]],
        max_depth: int,
        policy: OverflowPolicy,
        urgent_subs: frozenset[int],
        message: PublishRequest,
    ) -> PublishResult:
        """Plan every target against the locked counters, then write the plan with one
        statement per kind (plus one DELETE per user that overflows ``drop-oldest``).

        The plan is the per-target rule of the module docstring run in memory: the
        counters' depth is exact while their rows are locked (acks lock them too).
        The rows to insert join ``unwritten``, the batch's rows written with one
        statement at its end, or before a DELETE of overflow (which must see them).
        """
        msg_id = message.msg_id
        m = message
        room = max_depth - len(ordered)
        if all(counters[uri].depth <= room for uri, _ in ordered):
            # No queue can overflow (each gets at most len(ordered) entries): the walk
            # below without its overflow bookkeeping (the usual case, once per publish
            # and per recipient). Same nseqs, depths, rows and order.
            # queue_row's rows, and Enqueued without its Python-level constructor, inline.
            queued_fast: list[Enqueued] = []
            publisher, subject, attrs, payload = m.publisher_uri, m.subject, m.attrs_cbor, m.payload
            urgent, published_at, qclass = m.urgent, m.published_at, m.qclass
            for uri, sub_id in ordered:
                counter = counters[uri]
                nseq = counter.last_nseq = counter.last_nseq + 1
                depth = counter.depth = counter.depth + 1
                queued_fast.append(_new_tuple(Enqueued, (uri, nseq, sub_id, depth)))
                unwritten.append(
                    (uri, nseq, sub_id, publisher, msg_id, subject, attrs, payload,
                     urgent or sub_id in urgent_subs, published_at, qclass)
                )  # fmt: skip
            return PublishResult(len(ordered), False, tuple(queued_fast))
        # Pass 1: how many of each user's older entries overflow drops, so that one
        # DELETE per user fetches their nseqs. A queue is the older entries (oldest
        # first) followed by this publish's new ones.
        for uri, group in itertools.groupby(ordered, key=lambda t: t[0]):
            counter = counters[uri]
            older, new = counter.depth, 0
            for _ in group:
                if older + new >= max_depth:
                    if policy == "refuse-newest":
                        continue
                    excess = older + new - (max_depth - 1)
                    gone = min(older, excess)
                    older -= gone
                    new -= excess - gone
                    counter.drop_existing += gone
                new += 1
        olders: dict[str, list[tuple[int, int, str]]] = {}
        for uri, counter in counters.items():
            if counter.drop_existing:
                if unwritten:
                    self._write_rows(tx, unwritten, written)
                    unwritten.clear()
                olders[uri] = sorted(tx.drop_oldest(uri, counter.drop_existing))
                counter.drop_existing = 0
        # Pass 2: the same walk, now with nseqs.
        queued: list[Enqueued] = []
        dropped: list[Dropped] = []
        rows_out: list[StoredRow] = []
        for uri, group in itertools.groupby(ordered, key=lambda t: t[0]):
            counter = counters[uri]
            doomed = collections.deque(olders.get(uri, ()))
            fresh: collections.deque[Enqueued] = collections.deque()
            depth = counter.depth
            for _, sub_id in group:
                if depth >= max_depth and policy == "refuse-newest":
                    dropped.append(Dropped(uri, None, sub_id, msg_id, policy))
                    counter.missed += 1
                    continue
                while depth >= max_depth:
                    if doomed:
                        nseq, old_sub, old_msg = doomed.popleft()
                        dropped.append(Dropped(uri, nseq, old_sub, old_msg, policy))
                    else:
                        # Dropped by a later target of this same publish: reported as
                        # queued then dropped, as if written and deleted, but never written.
                        first = fresh.popleft()
                        dropped.append(Dropped(uri, first.nseq, first.sub_id, msg_id, policy))
                    depth -= 1
                    counter.missed += 1
                counter.last_nseq += 1
                depth += 1
                item = Enqueued(uri, counter.last_nseq, sub_id, depth)
                fresh.append(item)
                queued.append(item)
            counter.depth = depth
            rows_out.extend(queue_row(m, item, urgent_subs) for item in fresh)
        # Written with the batch's, or before a later request's overflow DELETE (which may
        # drop them as older entries); the counters are written once, by publish_many.
        unwritten.extend(rows_out)
        return PublishResult(
            matched=len(ordered),
            duplicate=False,
            queued=tuple(queued),
            dropped=tuple(dropped),
        )

    def pending(
        self, uri: str, after_nseq: int = 0, limit: int = 100, *, urgent_only: bool = False
    ) -> list[QueuedNotification]:
        """Up to ``limit`` queued notifications of ``uri`` with ``nseq > after_nseq``, in
        nseq order; only urgent ones if ``urgent_only``. Reading removes nothing.

        Raises:
            InvalidArgument: ``limit`` < 1.
            StoreError: the database failed.
        """
        if limit < 1:
            raise InvalidArgument(f"limit must be at least 1, not {limit}")
        query = PENDING_URGENT if urgent_only else PENDING
        with reading(self._engine, "pending") as conn:
            rows = conn.execute(query, {"uri": uri, "after": after_nseq, "limit": limit}).all()
        return [QueuedNotification(*row) for row in rows]

    def pending_many(
        self, reads: Sequence[tuple[str, int, int]], epochs: Mapping[str, int] | None = None
    ) -> list[list[DeliveryRow]]:
        """For each ``(uri, after_nseq, limit)``, ``uri``'s queued notifications as
        ``pending(uri, after_nseq, limit)`` finds them, as :data:`DeliveryRow` tuples; on
        one connection (one checkout, not one per user), the lists in the same order. A
        user of ``epochs`` gets rows only while its session is at that epoch.

        The driver's own cursor runs the statement (SQLAlchemy's execution context costs
        ~10 µs per statement, one statement per user in a fan-out's round).

        Raises:
            InvalidArgument: a ``limit`` < 1.
            StoreError: the database failed.
        """
        for _, _, limit in reads:
            if limit < 1:
                raise InvalidArgument(f"limit must be at least 1, not {limit}")
        found: list[list[DeliveryRow]] = []
        with (
            reading(self._engine, "pending") as conn,
            self.driver_cursor(conn, "pending") as cursor,
        ):
            for read in reads:
                epoch = None if epochs is None else epochs.get(read[0])
                if epoch is None:
                    cursor.execute(self._sql.pending, read)
                else:  # nothing for a user held at another epoch (ownership.py)
                    cursor.execute(self._sql.pending_held, (read[0], read[1], epoch, read[2]))
                found.append(cast("list[DeliveryRow]", cursor.fetchall()))  # all at once
        return found

    @contextlib.contextmanager
    def driver_cursor(self, conn: Connection, what: str) -> Iterator[Any]:
        """The driver's own cursor on ``conn``; a driver error comes out as a StoreError
        (see _driver_failed). Closing the cursor of a connection that the error
        invalidated raises in sqlite3: that must not replace the StoreError, which is
        what the broker's callers catch."""
        cursor = None
        try:
            cursor = conn.connection.cursor()  # raises if the connection is closed
            yield cursor
        except self._driver_error as exc:
            raise self._driver_failed(conn, what, exc) from exc
        finally:
            if cursor is not None:
                with contextlib.suppress(self._driver_error):
                    cursor.close()

    def _driver_failed(self, conn: Connection, what: str, exc: Exception) -> StoreError:
        """The StoreError for a driver error on the raw cursor, after doing what
        SQLAlchemy does for its own statements when the error says the server is gone (a
        restart, a failover): this connection is invalidated and the pool's others,
        opened before, are not handed out again (each would cost one more failed call)."""
        dbapi_conn = conn.connection.dbapi_connection
        if self._engine.dialect.is_disconnect(cast(Any, exc), dbapi_conn, None):
            conn.invalidate(exc)
            self._engine.dispose()  # checked-out connections finish; idle ones close
        return store_error(what, exc)  # classified as _sql.transaction does

    def ack(self, uri: str, upto: int) -> int:
        """Delete ``uri``'s queued notifications with ``nseq <= upto``; how many went.

        Not fsync'd (one per notification would dominate delivery): an ack lost in a
        crash only makes the broker send those notifications again, and the agent drops
        them by nseq. The next durable commit makes it durable too.

        Raises:
            StoreError: the database failed.
        """
        return self.ack_many([(uri, upto)])[0]

    def ack_many(self, acks: Sequence[tuple[str, int]]) -> list[int]:
        """``ack`` each ``(uri, upto)`` in one transaction (not fsync'd, as ``ack``); how
        many went for each, in order. All or nothing.

        The users' counter rows are locked in URI order, as ``publish`` locks them, so
        the two cannot deadlock.

        Raises:
            StoreError: the database failed; nothing was deleted.
        """
        with relaxed_transaction(self._engine, "ack") as conn:
            return self.ack_in(conn, acks)

    def ack_in(self, conn: Connection, acks: Sequence[tuple[str, int]]) -> list[int]:
        """:meth:`ack_many` inside ``conn``'s transaction (whose first statement was a
        write, see _sql.py; mdeci/store/ownership.py checks the epochs first)."""
        if len(acks) > 1 and len({uri for uri, _ in acks}) == len(acks):
            gone = self._ack_set(conn, sorted(acks))
            return [gone.get(uri, 0) for uri, _ in acks]
        counts: dict[int, int] = {}
        sql = self._sql
        with self.driver_cursor(conn, "ack") as cursor:
            for i in sorted(range(len(acks)), key=lambda i: acks[i][0]):
                uri, upto = acks[i]
                # _delete's statements, on the driver's cursor (see pending_many).
                cursor.execute(sql.lock_one, (uri,))
                cursor.execute(sql.ack, (uri, upto))
                count = counts[i] = cursor.rowcount
                if count:
                    cursor.execute(sql.shrink, (count, uri))
        return [counts[i] for i in range(len(acks))]

    def _ack_set(self, conn: Connection, acks: list[tuple[str, int]]) -> dict[str, int]:
        """The acks of several users (``acks`` in URI order, one per user) with a few
        statements for all, not three per user (a fan-out's round of acks is one per
        recipient; on PostgreSQL each statement is a round trip). The counter
        rows are locked first, in URI order, as ``publish`` locks them; then one DELETE
        of every acked row, and one UPDATE of the depths. How many rows went, by user
        (users with none left out)."""
        uris = [uri for uri, _ in acks]
        gone: dict[str, int]
        sql = self._sql
        if self._pg:
            conn.exec_driver_sql(sql.ack_lock_pg, (uris,))
            gone = {
                str(uri): int(n)
                for uri, n in conn.exec_driver_sql(
                    sql.ack_delete_pg, (uris, [upto for _, upto in acks])
                )
            }
            return gone
        # SQLite: its write lock is the database's; the first statement is a write (see
        # _sql.py). The DELETE's terms each use the primary key. On the driver's cursor
        # (see pending_many): the DELETE returns a row per acked notification.
        counts: dict[str, int] = {}
        with self.driver_cursor(conn, "ack") as cursor:
            for start in range(0, len(acks), _ACK_CHUNK):
                chunk = acks[start : start + _ACK_CHUNK]
                n = len(chunk)
                cursor.execute(sql.ack_lock.sql(n), uris[start : start + n])
                params: list[object] = []
                for uri, upto in chunk:
                    params += (uri, upto)
                cursor.execute(sql.ack_delete.sql(n), params)
                for (uri,) in cursor.fetchall():
                    counts[uri] = counts.get(uri, 0) + 1
            if counts:
                cursor.executemany(sql.shrink, [(n, uri) for uri, n in counts.items()])
        return counts

    def remove(self, uri: str, nseq: int) -> bool:
        """Delete exactly ``uri``'s queued notification ``nseq`` (one a side channel such
        as SMS delivered out of order); whether it was there. Durable on return.

        Raises:
            StoreError: the database failed.
        """
        with transaction(self._engine, "remove") as conn:
            return bool(self._delete(conn, REMOVE, {"uri": uri, "nseq": nseq}))

    def _delete(self, conn: Connection, statement: Delete, params: dict[str, object]) -> int:
        """Run a DELETE of ``params["uri"]``'s queued rows and keep the depth counter
        right; how many went. The counter row is locked first, as ``publish`` does.
        """
        conn.execute(LOCK_ONE, {"c_uri": params["uri"]})
        count = int(conn.execute(statement, params).rowcount)
        if count:
            conn.execute(SHRINK, {"c_uri": params["uri"], "c_count": count})
        return count

    def depth(self, uri: str) -> int:
        """How many notifications wait in ``uri``'s queue (its maintained counter).

        Raises:
            StoreError: the database failed.
        """
        return self._read_counter(uri, QueueCounterRow.depth, "depth")

    def last_nseq(self, uri: str) -> int:
        """The highest nseq ever handed out for ``uri`` (0 if none), acked or not.

        Raises:
            StoreError: the database failed.
        """
        return self._read_counter(uri, QueueCounterRow.last_nseq, "last_nseq")

    def _read_counter(self, uri: str, column: InstrumentedAttribute[int], op: str) -> int:
        """One of ``uri``'s queue counters (0 for a queue that has none yet)."""
        with reading(self._engine, op) as conn:
            value = conn.execute(
                select(column).where(QueueCounterRow.uri == uri)
            ).scalar_one_or_none()
        return 0 if value is None else int(value)

    def missed_many(self, uris: Sequence[str]) -> dict[str, int]:
        """Those of ``uris`` with overflow drops not yet taken, and how many; reads only
        (``take_missed`` takes them). One statement per ``LOCK_CHUNK`` users: the
        broker asks once for every user it starts sending to (a ``take_missed`` per
        user, a connection checkout and a read each, costs 100 µs of CPU on SQLite and
        275 µs on PostgreSQL).

        Raises:
            StoreError: the database failed.
        """
        found: dict[str, int] = {}
        with reading(self._engine, "missed") as conn:
            for start in range(0, len(uris), LOCK_CHUNK):
                chunk = uris[start : start + LOCK_CHUNK]
                sql = self._sql.missed.sql(len(chunk))
                for uri, missed in conn.exec_driver_sql(sql, tuple(chunk)):
                    found[str(uri)] = int(missed)
        return found

    def take_missed(self, uri: str) -> int:
        """How many of ``uri``'s notifications overflow dropped since the last call; resets
        the count. Two concurrent callers never both report the same drops.

        Raises:
            StoreError: the database failed.
        """
        seen = self._read_counter(uri, QueueCounterRow.missed, "take_missed")
        if not seen:
            return 0
        # Subtract what was read rather than set 0: drops counted meanwhile are kept for
        # the next call, and the transaction starts with its write (see _sql.py).
        with transaction(self._engine, "take_missed") as conn:
            result = conn.execute(
                update(QueueCounterRow)
                .where(QueueCounterRow.uri == uri, QueueCounterRow.missed >= seen)
                .values(missed=QueueCounterRow.missed - seen)
            )
        return seen if result.rowcount else 0

    def prune_published(self, before: float, limit: int = 1000) -> int:
        """Forget at most ``limit`` published msg_ids with ``published_at < before``,
        the oldest first; how many went (fewer than ``limit``: none older are left).

        A re-sent publish older than the horizon is then taken as new, so keep the
        horizon well beyond an agent's longest outage. Bounded so that the first prune
        of a table that was never pruned is many short transactions, each under the
        statement timeout and none holding the writer for long, not one DELETE of all.
        Not fsync'd: a prune lost in a crash is done again.

        Raises:
            InvalidArgument: a ``limit`` < 1.
            StoreError: the database failed.
        """
        if limit < 1:
            raise InvalidArgument(f"limit must be at least 1, not {limit}")
        oldest = (
            select(PublishedRow.publisher_uri, PublishedRow.msg_id)
            .where(PublishedRow.published_at < before)
            .order_by(PublishedRow.published_at)
            .limit(limit)
        )
        key = tuple_(PublishedRow.publisher_uri, PublishedRow.msg_id)
        with relaxed_transaction(self._engine, "prune_published") as conn:
            result = conn.execute(delete(PublishedRow).where(key.in_(oldest)))
        return int(result.rowcount)


# The records are importable from here, where the store that makes them is.
__all__ = [
    "OVERFLOW_POLICIES",
    "DeliveryRow",
    "Dropped",
    "Enqueued",
    "OverflowPolicy",
    "PublishRequest",
    "PublishResult",
    "QueuedNotification",
    "SqlQueueStore",
    "StoredRow",
    "as_delivery",
    "as_queued",
]
