"""Idempotent publish and per-URI durable notification queues (PROTOCOL.md sections 5, 6).

Theory of operation
-------------------
``publish`` is one transaction that

1. records ``(publisher_uri, msg_id)`` in ``published_messages`` with the matched count;
   if that pair is there already the publish is a duplicate: it returns the original
   count and queues nothing (an agent re-sending after a handover publishes once);
2. for each target ``(uri, sub_id)``, in URI order (so concurrent publishes lock the
   users' counter rows in one order and cannot deadlock), locks the user's row in
   ``queue_counters`` (creating it at ``last_nseq = 0``), applies the overflow policy if
   the queue holds ``max_depth`` entries already, and queues the notification with
   ``nseq = last_nseq + 1``.

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

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, get_args

from sqlalchemy import delete, func, insert, select, update
from sqlalchemy.engine import Connection, Engine

from mdeci.store._sql import insert_on_conflict, reading, relaxed_transaction, transaction
from mdeci.store.errors import InvalidArgument
from mdeci.store.models import PublishedRow, QueueCounterRow, QueuedRow

OverflowPolicy = Literal["drop-oldest", "refuse-newest"]
OVERFLOW_POLICIES: tuple[OverflowPolicy, ...] = get_args(OverflowPolicy)


@dataclass(frozen=True, slots=True)
class Enqueued:
    """A notification ``publish`` queued: for ``uri``, as ``nseq``, leaving ``depth``."""

    uri: str
    nseq: int
    sub_id: int
    depth: int


@dataclass(frozen=True, slots=True)
class Dropped:
    """A notification lost to overflow; ``nseq`` is None when it was never queued."""

    uri: str
    nseq: int | None
    sub_id: int
    msg_id: str
    reason: OverflowPolicy


@dataclass(frozen=True, slots=True)
class PublishResult:
    """What ``publish`` did; on a duplicate, ``matched`` is the first publish's count."""

    matched: int
    duplicate: bool
    queued: tuple[Enqueued, ...] = ()
    dropped: tuple[Dropped, ...] = ()


@dataclass(frozen=True, slots=True)
class QueuedNotification:
    """A notification waiting in ``uri``'s queue: what a ``notify`` frame carries."""

    uri: str
    nseq: int
    sub_id: int
    publisher_uri: str
    msg_id: str
    subject: str
    attrs_cbor: bytes
    payload: bytes
    urgent: bool
    published_at: float


_COLUMNS = (
    QueuedRow.uri,
    QueuedRow.nseq,
    QueuedRow.sub_id,
    QueuedRow.publisher_uri,
    QueuedRow.msg_id,
    QueuedRow.subject,
    QueuedRow.attrs_cbor,
    QueuedRow.payload,
    QueuedRow.urgent,
    QueuedRow.published_at,
)


def _depth(conn: Connection, uri: str) -> int:
    count = conn.execute(select(func.count()).where(QueuedRow.uri == uri)).scalar_one()
    return int(count)


class SqlQueueStore:
    """Publish idempotence and the per-user queues in SQL; one transaction per method."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

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
        if max_depth < 1:
            raise InvalidArgument(f"max_depth must be at least 1, not {max_depth}")
        if policy not in OVERFLOW_POLICIES:
            raise InvalidArgument(f"overflow policy must be one of {OVERFLOW_POLICIES}")
        queued: list[Enqueued] = []
        dropped: list[Dropped] = []
        with transaction(self._engine, "publish") as conn:
            first = conn.execute(
                insert_on_conflict(conn, PublishedRow)
                .values(
                    publisher_uri=publisher_uri,
                    msg_id=msg_id,
                    matched=len(targets),
                    published_at=published_at,
                )
                .on_conflict_do_nothing(
                    index_elements=[PublishedRow.publisher_uri, PublishedRow.msg_id]
                )
                .returning(PublishedRow.matched)
            ).first()
            if first is None:
                matched = conn.execute(
                    select(PublishedRow.matched).where(
                        PublishedRow.publisher_uri == publisher_uri,
                        PublishedRow.msg_id == msg_id,
                    )
                ).scalar_one()
                return PublishResult(matched=matched, duplicate=True)
            for uri, sub_id in sorted(targets, key=lambda t: t[0]):
                last_nseq = self._lock_counter(conn, uri)
                depth = _depth(conn, uri)
                missed = 0
                if depth >= max_depth and policy == "refuse-newest":
                    dropped.append(Dropped(uri, None, sub_id, msg_id, policy))
                    missed = 1
                elif depth >= max_depth:
                    # Keep the newest max_depth - 1, decided in the DELETE's own snapshot,
                    # so an ack committed meanwhile never costs an extra drop.
                    keep = (
                        select(QueuedRow.nseq)
                        .where(QueuedRow.uri == uri)
                        .order_by(QueuedRow.nseq.desc())
                        .limit(max_depth - 1)
                    )
                    rows = conn.execute(
                        delete(QueuedRow)
                        .where(QueuedRow.uri == uri, QueuedRow.nseq.not_in(keep))
                        .returning(QueuedRow.nseq, QueuedRow.sub_id, QueuedRow.msg_id)
                    ).all()
                    for nseq, old_sub, old_msg in sorted(rows):
                        dropped.append(Dropped(uri, nseq, old_sub, old_msg, policy))
                    missed = len(rows)
                    depth = _depth(conn, uri)
                if missed == 0 or policy == "drop-oldest":
                    nseq = last_nseq + 1
                    conn.execute(
                        insert(QueuedRow).values(
                            uri=uri,
                            nseq=nseq,
                            sub_id=sub_id,
                            publisher_uri=publisher_uri,
                            msg_id=msg_id,
                            subject=subject,
                            attrs_cbor=attrs_cbor,
                            payload=payload,
                            urgent=urgent,
                            published_at=published_at,
                        )
                    )
                    queued.append(Enqueued(uri, nseq, sub_id, depth + 1))
                    last_nseq = nseq
                conn.execute(
                    update(QueueCounterRow)
                    .where(QueueCounterRow.uri == uri)
                    .values(
                        last_nseq=last_nseq,
                        missed=QueueCounterRow.missed + missed,
                    )
                )
        return PublishResult(
            matched=len(targets), duplicate=False, queued=tuple(queued), dropped=tuple(dropped)
        )

    @staticmethod
    def _lock_counter(conn: Connection, uri: str) -> int:
        """Create or lock ``uri``'s counter row; the last nseq handed out (0 if none).

        ``ON CONFLICT DO UPDATE`` locks the row on PostgreSQL until commit; on SQLite the
        transaction holds the database's write lock already.
        """
        last = conn.execute(
            insert_on_conflict(conn, QueueCounterRow)
            .values(uri=uri, last_nseq=0, missed=0)
            .on_conflict_do_update(
                index_elements=[QueueCounterRow.uri],
                set_={"last_nseq": QueueCounterRow.last_nseq},
            )
            .returning(QueueCounterRow.last_nseq)
        ).scalar_one()
        return int(last)

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
        query = select(*_COLUMNS).where(QueuedRow.uri == uri, QueuedRow.nseq > after_nseq)
        if urgent_only:
            query = query.where(QueuedRow.urgent.is_(True))
        with reading(self._engine, "pending") as conn:
            rows = conn.execute(query.order_by(QueuedRow.nseq).limit(limit)).all()
        return [QueuedNotification(**row._asdict()) for row in rows]

    def ack(self, uri: str, upto: int) -> int:
        """Delete ``uri``'s queued notifications with ``nseq <= upto``; how many went.

        Not fsync'd (one per notification would dominate delivery): an ack lost in a
        crash only makes the broker send those notifications again, and the agent drops
        them by nseq. The next durable commit makes it durable too.

        Raises:
            StoreError: the database failed.
        """
        with relaxed_transaction(self._engine, "ack") as conn:
            result = conn.execute(
                delete(QueuedRow).where(QueuedRow.uri == uri, QueuedRow.nseq <= upto)
            )
        return int(result.rowcount)

    def depth(self, uri: str) -> int:
        """How many notifications wait in ``uri``'s queue.

        Raises:
            StoreError: the database failed.
        """
        with reading(self._engine, "depth") as conn:
            return _depth(conn, uri)

    def last_nseq(self, uri: str) -> int:
        """The highest nseq ever handed out for ``uri`` (0 if none), acked or not.

        Raises:
            StoreError: the database failed.
        """
        with reading(self._engine, "last_nseq") as conn:
            last = conn.execute(
                select(QueueCounterRow.last_nseq).where(QueueCounterRow.uri == uri)
            ).scalar_one_or_none()
        return 0 if last is None else int(last)

    def take_missed(self, uri: str) -> int:
        """How many of ``uri``'s notifications overflow dropped since the last call; resets
        the count. Two concurrent callers never both report the same drops.

        Raises:
            StoreError: the database failed.
        """
        with reading(self._engine, "take_missed") as conn:
            seen = conn.execute(
                select(QueueCounterRow.missed).where(QueueCounterRow.uri == uri)
            ).scalar_one_or_none()
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
        return int(seen) if result.rowcount else 0

    def prune_published(self, before: float) -> int:
        """Forget published msg_ids with ``published_at < before``; how many went.

        A re-sent publish older than the horizon is then taken as new, so keep the
        horizon well beyond an agent's longest retry time.

        Raises:
            StoreError: the database failed.
        """
        with transaction(self._engine, "prune_published") as conn:
            result = conn.execute(delete(PublishedRow).where(PublishedRow.published_at < before))
        return int(result.rowcount)
