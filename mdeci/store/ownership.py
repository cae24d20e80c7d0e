"""Which broker node holds each user, fenced by an epoch (several brokers, one database).

Theory of operation
-------------------
Each sessions row names its ``owner`` (a broker's ``node``) and the ``epoch`` it holds
the user at. The epoch only grows, and every change of holder raises it in one statement
under the row's lock (a compare-and-set against what the statement finds):

- a new session (:meth:`~mdeci.store.sessions.SqlSessionStore.upsert_session` with no
  epoch held) raises it: the newest INVITE wins, wherever it came in;
- :meth:`SqlOwnership.take_over` raises it only from the epoch the caller saw, so of two
  takeovers from the same epoch exactly one wins.

Every write a broker makes for a user it holds, and every read it delivers from, names
the epoch it holds (:meth:`ack`, :meth:`pending`, :meth:`remove`, :meth:`take_missed`,
and the session writes of :mod:`mdeci.store.sessions`). A write first locks the user's
sessions row if, and only if, its epoch is still the one named (the lock keeps a
takeover waiting until the write commits; a takeover that committed first makes the
write change nothing). A broker that lost the user gets :class:`Lost`, a value, not an
exception: it names who holds the user now, and nothing was written or read.

Lock order: the sessions row, then the user's queue counter row (publish locks only
counter rows, a takeover only the sessions row), so none of them can deadlock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import cast

from sqlalchemy import bindparam, delete, select, update
from sqlalchemy.engine import Connection, Engine

from mdeci.store._sql import reading, relaxed_transaction, transaction
from mdeci.store.errors import InvalidArgument
from mdeci.store.models import QueueCounterRow, QueuedRow, SessionRow
from mdeci.store.queue_rows import DeliveryRow
from mdeci.store.queue_sql import DELIVERY_COLUMNS, LOCK_ONE, REMOVE, SHRINK, queue_sql
from mdeci.store.queues import SqlQueueStore


@dataclass(frozen=True, slots=True)
class Held:
    """The caller holds the user at ``epoch``. ``prev_owner``: on a new session's claim,
    the node whose row it replaced (``""``: none, a new row or one without an owner);
    what was, not what is, so it takes no part in equality."""

    epoch: int
    prev_owner: str = field(default="", compare=False)


@dataclass(frozen=True, slots=True)
class Lost:
    """``uri`` is not held at the epoch the caller named: ``owner`` holds it at ``epoch``
    (``""`` and 0: nobody, no session row). Nothing was written or read."""

    uri: str
    owner: str
    epoch: int


# Locks the user's sessions row if its epoch is the one named (a write first: _sql.py).
_HOLD = (
    update(SessionRow)
    .where(SessionRow.uri == bindparam("h_uri"), SessionRow.epoch == bindparam("h_epoch"))
    .values(epoch=SessionRow.epoch)
)
_ACK = delete(QueuedRow).where(
    QueuedRow.uri == bindparam("uri"), QueuedRow.nseq <= bindparam("upto")
)
# A delivery's read, joined to the sessions row at the epoch named: a broker that lost
# the user reads nothing.
_PENDING = (
    select(*DELIVERY_COLUMNS)
    .join(SessionRow, SessionRow.uri == QueuedRow.uri)
    .where(
        QueuedRow.uri == bindparam("uri"),
        QueuedRow.nseq > bindparam("after"),
        SessionRow.epoch == bindparam("epoch"),
    )
    .order_by(QueuedRow.nseq)
    .limit(bindparam("limit"))
)


# (uri, epoch) pairs per SQLite statement: two variables each, under SQLite's 32,766.
_LITE_PAIRS = 4096
_HOLDERS = select(SessionRow.uri, SessionRow.owner, SessionRow.epoch).where(
    SessionRow.uri.in_(bindparam("uris", expanding=True))
)


def holder_of(conn: Connection, uri: str) -> Lost:
    """Who holds ``uri`` now, as the :class:`Lost` a fenced call returns."""
    row = conn.execute(
        select(SessionRow.owner, SessionRow.epoch).where(SessionRow.uri == uri)
    ).one_or_none()
    return Lost(uri, "", 0) if row is None else Lost(uri, str(row[0]), int(row[1]))


def hold(conn: Connection, uri: str, epoch: int) -> bool:
    """Lock ``uri``'s sessions row, in ``conn``'s transaction, if it is at ``epoch``."""
    return bool(conn.execute(_HOLD, {"h_uri": uri, "h_epoch": epoch}).rowcount)


class SqlOwnership:
    """The owner and epoch of each user, and the queue calls fenced by them, as broker
    ``node``; one transaction per method."""

    def __init__(self, engine: Engine, node: str) -> None:
        self._engine = engine
        self.node = node
        self._pg = engine.dialect.name == "postgresql"
        self._sql = queue_sql(engine.dialect)

    def holder(self, uri: str) -> tuple[str, int] | None:
        """(owner, epoch) of ``uri``'s session row, None without one.

        Raises:
            StoreError: the database failed.
        """
        with reading(self._engine, "holder") as conn:
            found = holder_of(conn, uri)
        return None if not found.epoch and not found.owner else (found.owner, found.epoch)

    def ack_many(
        self, queues: SqlQueueStore, acks: Sequence[tuple[str, int]], epochs: Mapping[str, int]
    ) -> tuple[list[int], list[Lost]]:
        """:meth:`~mdeci.store.queues.SqlQueueStore.ack_many` in one transaction, each
        user of ``epochs`` only while still held at its epoch there (the others of
        ``acks`` are not fenced). How many went for each (0 for a user lost), and a
        :class:`Lost` per user lost.

        Raises:
            StoreError: the database failed; nothing was deleted.
        """
        fenced = sorted({uri for uri, _ in acks if uri in epochs})
        lost: list[Lost] = []
        with relaxed_transaction(self._engine, "ack") as conn:
            if fenced:
                held = self._hold_many(conn, queues, fenced, epochs)
                lost = [holder_of(conn, uri) for uri in fenced if uri not in held]
            gone = {x.uri for x in lost}
            kept = [(uri, upto) for uri, upto in acks if uri not in gone]
            counts = iter(queues.ack_in(conn, kept) if kept else ())
        return [0 if uri in gone else next(counts) for uri, _ in acks], lost

    def _hold_many(
        self, conn: Connection, queues: SqlQueueStore, uris: list[str], epochs: Mapping[str, int]
    ) -> set[str]:
        """Lock the sessions rows of ``uris`` (in order) still at their epoch; those."""
        if self._pg:  # the driver's SQL: one array per column, no statement built per call
            args = (uris, [epochs[uri] for uri in uris])
            return {str(u) for (u,) in conn.exec_driver_sql(self._sql.hold_pg, args)}
        held: set[str] = set()
        # On the driver's cursor: a row per user held, no result object per row.
        with queues.driver_cursor(conn, "ack") as cursor:
            for i in range(0, len(uris), _LITE_PAIRS):
                part = uris[i : i + _LITE_PAIRS]
                flat = [x for uri in part for x in (uri, epochs[uri])]
                cursor.execute(self._sql.hold_lite.sql(len(part)), flat)
                held.update(u for (u,) in cursor.fetchall())
        return held

    def lost_of(self, epochs: Mapping[str, int]) -> list[Lost]:
        """Of the users of ``epochs``, those no longer held at their epoch there (one read).

        Raises:
            StoreError: the database failed.
        """
        with reading(self._engine, "held") as conn:
            rows = conn.execute(_HOLDERS, {"uris": sorted(epochs)}).all()
        now = {str(u): Lost(str(u), str(o), int(e)) for u, o, e in rows}
        found = [now.get(uri, Lost(uri, "", 0)) for uri in sorted(epochs)]
        return [x for x in found if x.epoch != epochs[x.uri]]

    def take_over(self, uri: str, seen: int) -> Held | Lost:
        """Hold ``uri`` from now on if its epoch is still ``seen``: the epoch becomes
        ``seen + 1`` and the owner this node. Of several takeovers from one epoch,
        exactly one wins; the others get :class:`Lost` naming the winner.

        Raises:
            StoreError: the database failed.
        """
        with transaction(self._engine, "take_over") as conn:
            won = conn.execute(
                update(SessionRow)
                .where(SessionRow.uri == uri, SessionRow.epoch == seen)
                .values(owner=self.node, epoch=seen + 1)
                .returning(SessionRow.epoch)
            ).scalar_one_or_none()
            if won is None:
                return holder_of(conn, uri)
        return Held(int(won))

    def ack(self, uri: str, upto: int, epoch: int) -> int | Lost:
        """Delete ``uri``'s queued notifications with ``nseq <= upto`` if this node still
        holds ``uri`` at ``epoch``; how many went. Not fsync'd, as
        :meth:`~mdeci.store.queues.SqlQueueStore.ack`.

        Raises:
            StoreError: the database failed; nothing was deleted.
        """
        with relaxed_transaction(self._engine, "ack") as conn:
            if not hold(conn, uri, epoch):
                return holder_of(conn, uri)
            conn.execute(LOCK_ONE, {"c_uri": uri})
            count = int(conn.execute(_ACK, {"uri": uri, "upto": upto}).rowcount)
            if count:
                conn.execute(SHRINK, {"c_uri": uri, "c_count": count})
        return count

    def remove(self, uri: str, nseq: int, epoch: int) -> bool | Lost:
        """Delete exactly ``uri``'s queued notification ``nseq`` (one a side channel
        delivered) if this node still holds ``uri`` at ``epoch``; whether it was there.
        Durable on return.

        Raises:
            StoreError: the database failed.
        """
        with transaction(self._engine, "remove") as conn:
            if not hold(conn, uri, epoch):
                return holder_of(conn, uri)
            conn.execute(LOCK_ONE, {"c_uri": uri})
            count = int(conn.execute(REMOVE, {"uri": uri, "nseq": nseq}).rowcount)
            if count:
                conn.execute(SHRINK, {"c_uri": uri, "c_count": count})
        return bool(count)

    def pending(self, uri: str, after: int, limit: int, epoch: int) -> list[DeliveryRow] | Lost:
        """Up to ``limit`` of ``uri``'s queued notifications after ``after``, in nseq
        order, to deliver while this node holds ``uri`` at ``epoch`` (the read of
        :meth:`~mdeci.store.queues.SqlQueueStore.pending_many`, fenced).

        Raises:
            InvalidArgument: ``limit`` < 1.
            StoreError: the database failed.
        """
        if limit < 1:
            raise InvalidArgument(f"limit must be at least 1, not {limit}")
        params = {"uri": uri, "after": after, "limit": limit, "epoch": epoch}
        with reading(self._engine, "pending") as conn:
            rows = conn.execute(_PENDING, params).all()
            if rows:
                return [cast(DeliveryRow, tuple(row)) for row in rows]
            # Nothing read: an empty queue, or a user held at another epoch.
            found = holder_of(conn, uri)
        return [] if found.epoch == epoch else found

    def take_missed(self, uri: str, epoch: int) -> int | Lost:
        """How many of ``uri``'s notifications overflow dropped since the last call,
        reset to 0, if this node still holds ``uri`` at ``epoch``.

        Raises:
            StoreError: the database failed.
        """
        c = QueueCounterRow
        with transaction(self._engine, "take_missed") as conn:
            if not hold(conn, uri, epoch):
                return holder_of(conn, uri)
            conn.execute(LOCK_ONE, {"c_uri": uri})
            seen = conn.execute(select(c.missed).where(c.uri == uri)).scalar_one_or_none()
            if seen:
                conn.execute(update(c).where(c.uri == uri).values(missed=c.missed - seen))
        return int(seen or 0)
