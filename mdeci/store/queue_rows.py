"""The records of the queue store: what a publish asks and gets, the rows it writes, the
rows a delivery reads.

Several are built per publish and one per notification delivered, so they are named
tuples or plain tuples, not frozen dataclasses: a frozen dataclass's ``__init__`` (an
``object.__setattr__`` per field) costs more than the publish's own bookkeeping, and the
driver binds a plain tuple's items faster than a tuple subclass's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from mdeci.config import OverflowPolicyName

# The store's name for the policy (one definition, in mdeci.config).
OverflowPolicy = OverflowPolicyName


class Enqueued(NamedTuple):
    """A notification ``publish`` queued: for ``uri``, as ``nseq``, leaving ``depth``."""

    uri: str
    nseq: int
    sub_id: int
    depth: int


class Dropped(NamedTuple):
    """A notification lost to overflow; ``nseq`` is None when it was never queued."""

    uri: str
    nseq: int | None
    sub_id: int
    msg_id: str
    reason: OverflowPolicy


class QueuedNotification(NamedTuple):
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
    qclass: str | None = None  # the publish's queue class, if it named one


StoredRow = tuple[str, int, int, str, str, str, bytes, bytes, bool, float, str | None]
"""A queue row as ``publish`` writes it: :class:`QueuedNotification`'s fields, in order
(``queue_sql.QUEUE_COLUMNS``). A plain tuple: the driver binds a tuple subclass's items more slowly
(sqlite3: ~0.9 µs more per row of a fan-out, measured)."""


class PublishResult(NamedTuple):
    """What ``publish`` did; on a duplicate, ``matched`` is the first publish's count."""

    matched: int
    duplicate: bool
    queued: tuple[Enqueued, ...] = ()
    dropped: tuple[Dropped, ...] = ()


class PublishRequest(NamedTuple):
    """One publish of a ``publish_many`` batch: the arguments of ``publish``."""

    publisher_uri: str
    msg_id: str
    subject: str
    attrs_cbor: bytes
    payload: bytes
    urgent: bool
    published_at: float
    targets: Sequence[tuple[str, int]]
    qclass: str | None = None  # the publish's queue class, if it named one
    # Subscriptions whose class may use SMS: their rows are stored urgent.
    urgent_subs: frozenset[int] = frozenset()


#: A queued notification as a delivery reads it (:meth:`SqlQueueStore.pending_many`):
#: ``(nseq, sub_id, publisher_uri, msg_id, subject, attrs_cbor, payload, published_at)``,
#: the driver's row as it comes (a plain tuple: a named tuple built per delivered row
#: costs a third of encoding its frame; the columns a notify does not carry are not
#: read).
DeliveryRow = tuple[int, int, str, str, str, bytes, bytes, float]


def as_queued(row: StoredRow) -> QueuedNotification:
    """``row`` as what ``pending`` would read back."""
    # Not _make, which checks the length in Python: a StoredRow has the fields' count.
    return _new_tuple(QueuedNotification, row)


_new_tuple = tuple.__new__


def as_delivery(row: StoredRow) -> DeliveryRow:
    """``row`` as what ``pending_many`` would read back (the notify's columns)."""
    return (row[1], row[2], row[3], row[4], row[5], row[6], row[7], row[9])


def queue_row(m: PublishRequest, item: Enqueued, urgent_subs: frozenset[int]) -> StoredRow:
    """The queue table's row for ``item`` (the insert's parameters, in column order)."""
    return (
        item.uri,
        item.nseq,
        item.sub_id,
        m.publisher_uri,
        m.msg_id,
        m.subject,
        m.attrs_cbor,
        m.payload,
        m.urgent or item.sub_id in urgent_subs,
        m.published_at,
        m.qclass,
    )


def by_column(rows: list[StoredRow]) -> tuple[list[object], ...]:
    """The parameters of ``QueueSql.insert_unnest`` for ``rows``: the per-row columns, each
    row's publication (1-based, as ``WITH ORDINALITY`` counts), then the shared columns
    once per publication. A publish's rows are consecutive and share their values; in
    one batch a (publisher, msg_id) pair is one publish (a second one is a duplicate)."""
    uris: list[object] = []
    nseqs: list[object] = []
    sub_ids: list[object] = []
    urgents: list[object] = []
    ks: list[object] = []
    shared: list[StoredRow] = []
    last: StoredRow | None = None
    for row in rows:
        if last is None or row[4] != last[4] or row[3] != last[3]:  # (publisher, msg_id)
            shared.append(row)
            last = row
        uris.append(row[0])
        nseqs.append(row[1])
        sub_ids.append(row[2])
        urgents.append(row[8])
        ks.append(len(shared))
    return (
        uris,
        nseqs,
        sub_ids,
        urgents,
        ks,
        [r[3] for r in shared],
        [r[4] for r in shared],
        [r[5] for r in shared],
        [r[6] for r in shared],
        [r[7] for r in shared],
        [r[9] for r in shared],
        [r[10] for r in shared],
    )


class RowClass(NamedTuple):
    """A queued notification's class inputs."""

    nseq: int
    qclass: str | None  # the publish's class, None: it named none
    urgent: bool
    sub_id: int
