"""The queue class inputs of queued notifications: what the network decision of the IP
path needs of a row that its delivery read does not carry (the publish's class, its
``urgent`` flag, its subscription)."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import bindparam, select
from sqlalchemy.engine import Engine

from mdeci.store._sql import reading
from mdeci.store.models import QueuedRow
from mdeci.store.queue_rows import RowClass

_CLASSES = (
    select(QueuedRow.nseq, QueuedRow.qclass, QueuedRow.urgent, QueuedRow.sub_id)
    .where(
        QueuedRow.uri == bindparam("uri"), QueuedRow.nseq.in_(bindparam("nseqs", expanding=True))
    )
    .order_by(QueuedRow.nseq)
)


def row_classes(engine: Engine, uri: str, nseqs: Sequence[int]) -> list[RowClass]:
    """The class inputs of ``uri``'s queued notifications ``nseqs`` (those still queued).

    Raises:
        StoreError: the database failed.
    """
    if not nseqs:
        return []
    with reading(engine, "row classes") as conn:
        rows = conn.execute(_CLASSES, {"uri": uri, "nseqs": list(nseqs)}).all()
    return [RowClass(int(r[0]), r[1], bool(r[2]), int(r[3])) for r in rows]
