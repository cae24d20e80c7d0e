"""The queue store's driver statements, written with SQLAlchemy Core and compiled once.

:class:`~mdeci.store.queues.SqlQueueStore` runs its hot statements on the driver
(``exec_driver_sql``, or the driver's own cursor): SQLAlchemy's per-call parameter
processing and result rows cost more than the statements themselves. Each statement is
written here in Core against the models, so that it follows the schema, and compiled
once, when the store is built, to the driver's positional paramstyle (``?`` for
sqlite3, ``%s`` for psycopg). :func:`_compile` checks the order of the parameters
against the order the store binds them in.

A statement over a batch (many rows in one ``VALUES``, an ``IN`` list, ``OR`` terms) is
compiled for one item; :class:`Repeated` makes the ``n``-item text from it (compiling
``n`` items with Core would take 60 ms for 200 rows), cached per ``n``, and checks at
build time that it equals Core's own text for two items.

PostgreSQL's array statements (one array per column through ``unnest``, ``WITH
ORDINALITY``, a ``DELETE ... USING`` inside a CTE feeding an ``UPDATE ... FROM``) stay
SQL text: tests/store/test_queue_sql.py runs every statement of this module on SQLite
and on PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import (
    Text,
    and_,
    any_,
    bindparam,
    cast,
    delete,
    literal_column,
    or_,
    select,
    update,
)
from sqlalchemy import insert as core_insert
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.engine import Dialect
from sqlalchemy.engine.interfaces import BindTyping
from sqlalchemy.sql import ClauseElement
from sqlalchemy.sql.elements import ColumnClause

from mdeci.store.errors import StoreError
from mdeci.store.models import PublishedRow, QueueCounterRow, QueuedRow, SessionRow

#: The queue table's columns in the order a stored row holds them.
QUEUE_COLUMNS = (
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
    QueuedRow.qclass,
)
#: The columns a ``notify`` carries, in the order a delivery reads them.
DELIVERY_COLUMNS = (
    QueuedRow.nseq,
    QueuedRow.sub_id,
    QueuedRow.publisher_uri,
    QueuedRow.msg_id,
    QueuedRow.subject,
    QueuedRow.attrs_cbor,
    QueuedRow.payload,
    QueuedRow.published_at,
)
_ZERO: ColumnClause[Any] = literal_column("0")


# Statements that go through SQLAlchemy (``conn.execute``, which caches each one's
# compiled form): the paths run once per call, not once per notification.
MATCHED = select(PublishedRow.matched).where(
    PublishedRow.publisher_uri == bindparam("publisher_uri"),
    PublishedRow.msg_id == bindparam("msg_id"),
)
# Keep the newest depth - count: the oldest ``count`` go.
_oldest = (
    select(QueuedRow.nseq)
    .where(QueuedRow.uri == bindparam("uri"))
    .order_by(QueuedRow.nseq)
    .limit(bindparam("count"))
    .scalar_subquery()
)
DROP_OLDEST = (
    delete(QueuedRow)
    .where(QueuedRow.uri == bindparam("uri"), QueuedRow.nseq.in_(_oldest))
    .returning(QueuedRow.nseq, QueuedRow.sub_id, QueuedRow.msg_id)
)
# A write first (see _sql.py), and the counter row before any queued row: the
# order publish takes its locks in, so an ack and a publish cannot deadlock.
LOCK_ONE = (
    update(QueueCounterRow)
    .where(QueueCounterRow.uri == bindparam("c_uri"))
    .values(depth=QueueCounterRow.depth)
)
REMOVE = delete(QueuedRow).where(
    QueuedRow.uri == bindparam("uri"), QueuedRow.nseq == bindparam("nseq")
)
SHRINK = (
    update(QueueCounterRow)
    .where(QueueCounterRow.uri == bindparam("c_uri"))
    .values(depth=QueueCounterRow.depth - bindparam("c_count"))
)
PENDING = (
    select(*QUEUE_COLUMNS)
    .where(QueuedRow.uri == bindparam("uri"), QueuedRow.nseq > bindparam("after"))
    .order_by(QueuedRow.nseq)
    .limit(bindparam("limit"))
)
PENDING_URGENT = (
    select(*QUEUE_COLUMNS)
    .where(
        QueuedRow.uri == bindparam("uri"),
        QueuedRow.nseq > bindparam("after"),
        QueuedRow.urgent.is_(True),
    )
    .order_by(QueuedRow.nseq)
    .limit(bindparam("limit"))
)


def driver_dialect(dialect: Dialect) -> Dialect:
    """A dialect like ``dialect`` that compiles to its driver's positional paramstyle,
    without the casts psycopg's renders on each parameter (the driver's SQL binds plain
    Python values, as it always did)."""
    if dialect.name == "sqlite":
        return sqlite.dialect(paramstyle="qmark")
    if dialect.name == "postgresql":
        compiled: Dialect = type(dialect)(paramstyle="format")  # type: ignore[call-arg]
        compiled.bind_typing = BindTyping.NONE
        return compiled
    raise StoreError(f"unsupported database dialect {dialect.name!r} (SQLite or PostgreSQL only)")


def _compile(statement: ClauseElement, dialect: Dialect, names: tuple[str, ...]) -> str:
    """``statement`` as ``dialect``'s SQL text; its positional parameters must be
    ``names``, in that order (the order the store binds its values in)."""
    compiled = statement.compile(dialect=dialect)
    got = tuple(getattr(compiled, "positiontup", None) or ())
    if got != names:
        raise StoreError(f"statement parameters {got} are not {names}: {compiled}")
    return str(compiled)


def _insert(dialect: Dialect) -> Callable[..., object]:
    return postgresql.insert if dialect.name == "postgresql" else sqlite.insert


class Repeated:
    """A statement over ``n`` items, from the text of one: ``head``, then ``item``
    ``n`` times joined by ``sep``, then ``tail``; built once per ``n``."""

    def __init__(self, head: str, item: str, sep: str, tail: str) -> None:
        self.head, self.item, self.sep, self.tail = head, item, sep, tail
        self._texts: dict[int, str] = {}

    def sql(self, n: int) -> str:
        text = self._texts.get(n)
        if text is None:
            text = self._texts[n] = f"{self.head}{self.sep.join([self.item] * n)}{self.tail}"
        return text

    @classmethod
    def split(
        cls,
        build: Callable[[int], ClauseElement],
        dialect: Dialect,
        names: Callable[[int], tuple[str, ...]],
        *,
        start: str,
        end: str,
        sep: str = ", ",
        keep_end: bool = False,
    ) -> Repeated:
        """The item of ``build(1)``'s text is what lies between ``start`` and the first
        ``end`` after it (``keep_end``: ``end`` included); ``build(2)`` must give the
        two-item text."""
        one = _compile(build(1), dialect, names(1))
        i = one.index(start) + len(start)
        j = one.index(end, i) + (len(end) if keep_end else 0)
        item = one[i:j]
        repeated = cls(one[:i], item, sep, one[j:])
        two = _compile(build(2), dialect, names(2))
        if repeated.sql(2) != two:
            raise StoreError(f"cannot repeat {item!r}: {repeated.sql(2)!r} is not {two!r}")
        return repeated


def _numbered(*names: str) -> Callable[[int], tuple[str, ...]]:
    return lambda n: tuple(f"{name}{i}" for i in range(n) for name in names)


class QueueSql:
    """The driver SQL of :class:`~mdeci.store.queues.SqlQueueStore` for one dialect."""

    def __init__(self, engine_dialect: Dialect) -> None:
        d = driver_dialect(engine_dialect)
        self.dialect_name = engine_dialect.name
        q, c, p = QueuedRow, QueueCounterRow, PublishedRow
        keys = tuple(col.key for col in QUEUE_COLUMNS)
        insert = _insert(d)

        # A queued row (the parameters: a stored row).
        self.insert_row = _compile(
            core_insert(q).values({key: bindparam(key) for key in keys}), d, keys
        )
        # A delivery's read: (uri, after, limit).
        self.pending = _compile(
            select(*DELIVERY_COLUMNS)
            .where(q.uri == bindparam("uri"), q.nseq > bindparam("after"))
            .order_by(q.nseq)
            .limit(bindparam("limit"))
            .offset(_ZERO),
            d,
            ("uri", "after", "limit"),
        )
        # The same read for the broker that holds the user at an epoch: nothing if the
        # user's sessions row is at another (mdeci/store/ownership.py): (uri, after,
        # epoch, limit).
        self.pending_held = _compile(
            select(*DELIVERY_COLUMNS)
            .join(SessionRow, SessionRow.uri == q.uri)
            .where(
                q.uri == bindparam("uri"),
                q.nseq > bindparam("after"),
                SessionRow.epoch == bindparam("epoch"),
            )
            .order_by(q.nseq)
            .limit(bindparam("limit"))
            .offset(_ZERO),
            d,
            ("uri", "after", "epoch", "limit"),
        )
        # An ack's three statements: lock the counter row (a write first, see _sql.py),
        # delete up to the nseq, lower the depth: (uri,), (uri, upto), (count, uri).
        self.lock_one = _compile(
            update(c).where(c.uri == bindparam("uri")).values(depth=c.depth), d, ("uri",)
        )
        self.ack = _compile(
            delete(q).where(q.uri == bindparam("uri"), q.nseq <= bindparam("upto")),
            d,
            ("uri", "upto"),
        )
        self.shrink = _compile(
            update(c).where(c.uri == bindparam("uri")).values(depth=c.depth - bindparam("count")),
            d,
            ("count", "uri"),
        )
        # A publish's counters written back: (last_nseq, depth, missed added, uri).
        self.set_counter = _compile(
            update(c)
            .where(c.uri == bindparam("uri"))
            .ordered_values(
                (c.last_nseq, bindparam("last_nseq")),
                (c.depth, bindparam("depth")),
                (c.missed, c.missed + bindparam("missed")),
            ),
            d,
            ("last_nseq", "depth", "missed", "uri"),
        )

        def record(n: int) -> ClauseElement:
            rows: list[dict[str, Any]] = [
                {
                    "publisher_uri": bindparam(f"p{i}"),
                    "msg_id": bindparam(f"m{i}"),
                    "matched": bindparam(f"n{i}"),
                    "published_at": bindparam(f"t{i}"),
                }
                for i in range(n)
            ]
            stmt = insert(p).values(rows)  # type: ignore[attr-defined]
            return stmt.on_conflict_do_nothing(  # type: ignore[no-any-return]
                index_elements=[p.publisher_uri, p.msg_id]
            ).returning(p.publisher_uri, p.msg_id)

        # A batch's (publisher, msg_id) pairs, 4 parameters per publish; the pairs it
        # hands back are the new ones.
        self.record = Repeated.split(
            record, d, _numbered("p", "m", "n", "t"), start=" VALUES ", end=")", keep_end=True
        )

        def lock(n: int) -> ClauseElement:
            rows: list[dict[str, Any]] = [
                {"uri": bindparam(f"u{i}"), "last_nseq": _ZERO, "missed": _ZERO, "depth": _ZERO}
                for i in range(n)
            ]
            stmt = insert(c).values(rows)  # type: ignore[attr-defined]
            return stmt.on_conflict_do_update(  # type: ignore[no-any-return]
                index_elements=[c.uri], set_={"last_nseq": c.last_nseq}
            ).returning(c.uri, c.last_nseq, c.depth)

        # Create or lock the counter rows of the users given, in that order; each row's
        # counter as it stands.
        self.lock = Repeated.split(
            lock, d, _numbered("u"), start=" VALUES ", end=")", keep_end=True
        )
        # Of the users given, those with overflow drops not yet taken.
        self.missed = Repeated.split(
            lambda n: select(c.uri, c.missed).where(
                c.missed > _ZERO, c.uri.in_([bindparam(f"u{i}") for i in range(n)])
            ),
            d,
            _numbered("u"),
            start=" IN (",
            end=")",
        )
        if self.dialect_name == "sqlite":
            self._sqlite_acks(d)
        else:
            self._postgresql_arrays(d)

    def _sqlite_acks(self, d: Dialect) -> None:
        q, c = QueuedRow, QueueCounterRow
        # Lock the sessions rows of the (uri, epoch) pairs at that epoch, the pairs as a
        # VALUES list; the uris locked. (SQLAlchemy's expanding IN of tuples compiles
        # anew on every call: ~3 µs per user of a fan-out's ack batch.)
        self.hold_lite = Repeated(
            f"UPDATE {SessionRow.__tablename__} SET epoch = epoch WHERE (uri, epoch) IN (VALUES ",
            "(?, ?)",
            ", ",
            ") RETURNING uri",
        )
        # A round of acks of several users: their counter rows locked, then one DELETE
        # whose terms each use the primary key.
        self.ack_lock = Repeated.split(
            lambda n: (
                update(c)
                .where(c.uri.in_([bindparam(f"u{i}") for i in range(n)]))
                .values(depth=c.depth)
            ),
            d,
            _numbered("u"),
            start=" IN (",
            end=")",
        )
        self.ack_delete = Repeated.split(
            lambda n: (
                delete(q)
                .where(
                    or_(
                        *[
                            and_(q.uri == bindparam(f"u{i}"), q.nseq <= bindparam(f"n{i}"))
                            for i in range(n)
                        ]
                    )
                )
                .returning(q.uri)
            ),
            d,
            _numbered("u", "n"),
            start=" WHERE ",
            end=" RETURNING ",
            sep=" OR ",
        )

    def _postgresql_arrays(self, d: Dialect) -> None:
        c = QueueCounterRow
        # A publish's rare statements, for the driver's pipeline (mdeci/store/publish_tx.py):
        # a duplicate's count, (publisher_uri, msg_id); an overflow's drop, (uri, uri, count).
        self.matched = _compile(MATCHED, d, ("publisher_uri", "msg_id"))
        self.drop_oldest = _compile(DROP_OLDEST, d, ("uri", "uri", "count"))
        queued, counter = QueuedRow.__tablename__, c.__tablename__
        names = ", ".join(col.key for col in QUEUE_COLUMNS)
        # A round of acks locks its users' counter rows in the order of Python's
        # sorted(), as publish_many locks (COLLATE "C": code points, whatever the
        # database's collation).
        self.ack_lock_pg = _compile(
            select(c.uri)
            .where(c.uri == any_(cast(bindparam("uris"), ARRAY(Text))))
            .order_by(c.uri.collate("C"))
            .with_for_update(),
            d,
            ("uris",),
        )
        # One array per column: four (or two, or twelve) parameters whatever the batch
        # (psycopg parses a statement of more than 50 parameters again at every call,
        # and prepares only short ones). The publish's arrays go in binary (%b): psycopg
        # builds a text array in Python, quoting each element with a regular expression,
        # at twice the CPU.
        self.record_unnest = (
            f"INSERT INTO {PublishedRow.__tablename__} "
            "(publisher_uri, msg_id, matched, published_at) SELECT * FROM "
            "unnest(%b::text[], %b::text[], %b::int[], %b::float8[]) "
            "ON CONFLICT (publisher_uri, msg_id) DO NOTHING RETURNING publisher_uri, msg_id"
        )
        # What the recipients of one publication share (publisher to qclass) comes once
        # per publication, joined on its index.
        self.insert_unnest = (
            f"INSERT INTO {queued} ({names}) "
            "SELECT r.uri, r.nseq, r.sub_id, p.publisher_uri, p.msg_id, p.subject, "
            "p.attrs_cbor, p.payload, r.urgent, p.published_at, p.qclass "
            "FROM unnest(%b::text[], %b::bigint[], %b::bigint[], %b::boolean[], "
            "%b::int[]) AS r(uri, nseq, sub_id, urgent, k) "
            "JOIN unnest(%b::text[], %b::text[], %b::text[], %b::bytea[], %b::bytea[], "
            "%b::float8[], %b::text[]) WITH ORDINALITY "
            "AS p(publisher_uri, msg_id, subject, attrs_cbor, payload, published_at, "
            "qclass, k) USING (k)"
        )
        # Lock the sessions rows of the (uri, epoch) pairs at that epoch; the uris locked.
        self.hold_pg = (
            f"UPDATE {SessionRow.__tablename__} s SET epoch = s.epoch "
            "FROM unnest(%s::text[], %s::bigint[]) AS h(uri, epoch) "
            "WHERE s.uri = h.uri AND s.epoch = h.epoch RETURNING s.uri"
        )
        self.ack_delete_pg = (
            "WITH a AS (SELECT * FROM unnest(%s::text[], %s::bigint[]) AS a(uri, upto)), "
            f"d AS (DELETE FROM {queued} q USING a WHERE q.uri = a.uri AND q.nseq <= a.upto "
            "RETURNING q.uri), n AS (SELECT uri, count(*) AS n FROM d GROUP BY uri) "
            f"UPDATE {counter} c SET depth = c.depth - n.n FROM n WHERE c.uri = n.uri "
            "RETURNING c.uri, n.n"
        )


_BUILT: dict[type[Dialect], QueueSql] = {}


def queue_sql(dialect: Dialect) -> QueueSql:
    """The statements for ``dialect``'s kind, compiled on first use (tens of ms) and
    shared by every store on it."""
    built = _BUILT.get(type(dialect))
    if built is None:
        built = _BUILT[type(dialect)] = QueueSql(dialect)
    return built
