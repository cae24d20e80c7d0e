"""Read-only views for operators: the metrics overview, ``mdeci admin sessions`` and the
readiness probe. Every query is one short read; nothing here writes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from sqlalchemy import func, select, text
from sqlalchemy.engine import Engine

from mdeci.store._sql import reading
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
        )
        .outerjoin(QueueCounterRow, QueueCounterRow.uri == SessionRow.uri)
        .outerjoin(subs, subs.c.uri == SessionRow.uri)
        .order_by(SessionRow.uri)
    )
    with reading(engine, "list sessions") as conn:
        return [
            SessionView(str(u), str(s), str(a), float(t), int(d), int(n))
            for u, s, a, t, d, n in conn.execute(query)
        ]


def ping(engine: Engine) -> float:
    """Seconds one trivial query on the schema took (the readiness probe).

    Raises :class:`~mdeci.store.errors.StoreError` when the database cannot answer.
    """
    start = time.perf_counter()
    with reading(engine, "ping") as conn:
        conn.execute(text("SELECT 1")).scalar_one()
        conn.execute(select(func.count()).select_from(UserRow)).scalar_one()
    return time.perf_counter() - start
