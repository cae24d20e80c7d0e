"""What waits in one user's queue, for ``mdeci admin queue``: a read-only view.

Sizes come from the database; payload bytes are read only when the operator asks, so
listing a deep queue of large payloads stays a small read.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import func, select
from sqlalchemy.engine import Engine

from mdeci.store._sql import reading
from mdeci.store.models import QueueCounterRow, QueuedRow


@dataclass(frozen=True, slots=True)
class Waiting:
    """One queued notification; ``payload`` is None unless it was asked for."""

    nseq: int
    msg_id: str
    subject: str
    publisher_uri: str
    published_at: float
    urgent: bool
    qclass: str | None
    size: int  # payload bytes
    attrs_cbor: bytes
    payload: bytes | None


@dataclass(frozen=True, slots=True)
class QueueView:
    """A user's queue: ``depth`` rows wait (``items`` holds the oldest ``limit``), the last
    nseq handed out and the overflow drops the user has not been told of yet."""

    uri: str
    depth: int
    last_nseq: int
    missed: int
    items: list[Waiting]


def queue_view(engine: Engine, uri: str, *, limit: int, payloads: bool = False) -> QueueView:
    """The oldest ``limit`` notifications waiting for ``uri``, in nseq order.

    Raises :class:`~mdeci.store.errors.StoreError`.
    """
    payload = QueuedRow.payload if payloads else None
    columns = [
        QueuedRow.nseq,
        QueuedRow.msg_id,
        QueuedRow.subject,
        QueuedRow.publisher_uri,
        QueuedRow.published_at,
        QueuedRow.urgent,
        QueuedRow.qclass,
        func.length(QueuedRow.payload),
        QueuedRow.attrs_cbor,
    ]
    if payload is not None:
        columns.append(payload)
    rows_query = select(*columns).where(QueuedRow.uri == uri).order_by(QueuedRow.nseq).limit(limit)
    counters = select(
        QueueCounterRow.depth, QueueCounterRow.last_nseq, QueueCounterRow.missed
    ).where(QueueCounterRow.uri == uri)
    with reading(engine, "queue view") as conn:
        counter = conn.execute(counters).first()
        rows = conn.execute(rows_query).all()
    items = [
        Waiting(
            nseq=int(r[0]),
            msg_id=str(r[1]),
            subject=str(r[2]),
            publisher_uri=str(r[3]),
            published_at=float(r[4]),
            urgent=bool(r[5]),
            qclass=None if r[6] is None else str(r[6]),
            size=int(r[7] or 0),
            attrs_cbor=bytes(r[8]),
            payload=bytes(r[9]) if payloads else None,
        )
        for r in rows
    ]
    depth, last, missed = (int(x) for x in counter) if counter is not None else (0, 0, 0)
    return QueueView(uri, depth, last, missed, items)
