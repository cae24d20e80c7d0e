"""Views for operators: the metrics overview, ``mdeci admin sessions`` (one short read
each) and the readiness probe, which also writes: a store that answers reads but cannot
commit (a full disk, a read-only file or server) is not ready.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from sqlalchemy import func, select, text
from sqlalchemy.engine import Engine

from mdeci.store._sql import insert_on_conflict, reading, store_error, transaction
from mdeci.store.errors import StorageFull
from mdeci.store.identity import StoreMetaRow
from mdeci.store.models import QueueCounterRow, SessionRow, SubscriptionRow, UserRow


@dataclass(frozen=True, slots=True)
class Overview:
    """Counts for the metrics endpoint, read in one connection."""

    sessions: dict[str, int]  # status -> count
    queue_total: int  # notifications queued, all users
    queue_max: int  # the deepest user queue
    subscriptions: int  # live (not expired) subscriptions
    users: int


@dataclass(frozen=True, slots=True)
class SessionView:
    """One row of ``mdeci admin sessions``."""

    uri: str
    status: str
    media_addr: str
    last_seen: float  # epoch seconds of the last status change
    queue_depth: int
    subscriptions: int
    owner: str  # the broker node that holds the user ('': none has yet)
    epoch: int  # the fencing epoch it holds the user at


def overview(engine: Engine, now: float) -> Overview:
    """Raises :class:`~mdeci.store.errors.StoreError`."""
    with reading(engine, "overview") as conn:
        sessions = {
            str(status): int(count)
            for status, count in conn.execute(
                select(SessionRow.status, func.count()).group_by(SessionRow.status)
            )
        }
        total, deepest = conn.execute(
            select(
                func.coalesce(func.sum(QueueCounterRow.depth), 0),
                func.coalesce(func.max(QueueCounterRow.depth), 0),
            )
        ).one()
        subs = conn.execute(
            select(func.count()).where(SubscriptionRow.expires_at > now)
        ).scalar_one()
        users = conn.execute(select(func.count()).select_from(UserRow)).scalar_one()
    return Overview(sessions, int(total), int(deepest), int(subs), int(users))


def sessions(engine: Engine, now: float) -> list[SessionView]:
    """Every stored session with its queue depth and live subscriptions, by URI.

    Raises :class:`~mdeci.store.errors.StoreError`.
    """
    subs = (
        select(SubscriptionRow.uri, func.count().label("n"))
        .where(SubscriptionRow.expires_at > now)
        .group_by(SubscriptionRow.uri)
        .subquery()
    )
    query = (
        select(
            SessionRow.uri,
            SessionRow.status,
            SessionRow.media_addr,
            SessionRow.updated_at,
            func.coalesce(QueueCounterRow.depth, 0),
            func.coalesce(subs.c.n, 0),
            SessionRow.owner,
            SessionRow.epoch,
        )
        .outerjoin(QueueCounterRow, QueueCounterRow.uri == SessionRow.uri)
        .outerjoin(subs, subs.c.uri == SessionRow.uri)
        .order_by(SessionRow.uri)
    )
    with reading(engine, "list sessions") as conn:
        return [
            SessionView(str(u), str(s), str(a), float(t), int(d), int(n), str(o), int(e))
            for u, s, a, t, d, n, o, e in conn.execute(query)
        ]


# The row of ``store_meta`` the readiness probe writes: the time of the last probe.
READY_KEY = "ready_probe"


def ping(engine: Engine, wall: float, min_free: int = 0) -> float:
    """Seconds one trivial query on the schema and one durable write took (the readiness
    probe). The write is one row of ``store_meta``, committed as a publish is, so that a
    store that reads but cannot write is not ready. A small write may still fit where a
    large publish does not, so SQLite's filesystem must also have ``min_free`` bytes free.

    Raises :class:`~mdeci.store.errors.StoreError` when the database cannot answer or
    cannot commit; :class:`~mdeci.store.errors.StorageFull` when space is short.
    """
    start = time.perf_counter()
    if engine.dialect.name == "sqlite" and engine.url.database not in (None, "", ":memory:"):
        folder = os.path.dirname(os.path.abspath(engine.url.database))
        try:
            stat = os.statvfs(folder)
        except OSError as exc:
            raise store_error("readiness: free space", exc) from exc
        free = stat.f_bavail * stat.f_frsize
        if free < min_free:
            raise StorageFull(
                f"readiness: {free} bytes free for {folder}, below store.min_free_bytes "
                f"({min_free}): database or disk is full"
            )
    with reading(engine, "ping") as conn:
        conn.execute(text("SELECT 1")).scalar_one()
        conn.execute(select(func.count()).select_from(UserRow)).scalar_one()
    with transaction(engine, "readiness write") as conn:
        stmt = insert_on_conflict(conn, StoreMetaRow).values(key=READY_KEY, value=repr(wall))
        conn.execute(stmt.on_conflict_do_update(index_elements=["key"], set_={"value": repr(wall)}))
    return time.perf_counter() - start
