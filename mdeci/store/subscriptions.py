"""Subscriptions with a TTL (docs/protocol.md sections 5 and 6).

A subscription is alive while ``now < expires_at``; at ``now == expires_at`` it has
expired (so a TTL of 0 would never match, which is why ``ttl`` must be positive). Expired
ones are invisible to ``list_subscriptions`` and ``active_subscriptions`` at once, and
``sweep_expired`` deletes them. Notifications queued for a removed subscription stay
queued and are delivered: the queue does not refer to this table.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from typing import Any

from sqlalchemy import delete, insert, select, update
from sqlalchemy.engine import Connection, Engine

from mdeci.store._sql import reading, transaction
from mdeci.store.errors import InvalidArgument
from mdeci.store.models import SubscriptionRow
from mdeci.store.subscription_rows import Subscription as Subscription
from mdeci.store.wake import NOTIFY_SUBSCRIPTIONS

_COLUMNS = (
    SubscriptionRow.id,
    SubscriptionRow.uri,
    SubscriptionRow.subject,
    SubscriptionRow.filter,
    SubscriptionRow.created_at,
    SubscriptionRow.expires_at,
    SubscriptionRow.qclass,
    SubscriptionRow.in_order,
)


# Built once: every sub runs it.
_ADD = insert(SubscriptionRow).returning(*_COLUMNS)


def _record(row: Sequence[Any], texts: tuple[str, str] | None = None) -> Subscription:
    # The broker keeps every live subscription: its URI is the session's (interned where
    # the session starts) and its class one of a few; a copy of each per row is waste.
    # So are the row's copies of the subject and filter ``texts`` the caller keeps too
    # (its matcher holds them).
    sub_id, uri, subject, filter_text, created_at, expires_at, qclass, in_order = row
    if texts is not None and texts == (subject, filter_text):
        subject, filter_text = texts
    return Subscription(
        sub_id, sys.intern(uri), subject, filter_text, created_at, expires_at,
        None if qclass is None else sys.intern(qclass), in_order,
    )  # fmt: skip


class SqlSubscriptionStore:
    """Subscriptions in SQL; every method is one committed transaction."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        # The broker node writing through this store: on PostgreSQL each change tells
        # the other nodes, whose matchers read the subscriptions again (store/wake.py).
        self.node = ""

    def _tell_others(self, conn: Connection) -> None:
        if self.node and conn.dialect.name == "postgresql":
            conn.exec_driver_sql(NOTIFY_SUBSCRIPTIONS, (self.node,))

    def add_subscription(
        self,
        uri: str,
        subject: str,
        filter: str,
        ttl: float,
        now: float,
        qclass: str | None = None,
        *,
        in_order: bool = False,
    ) -> Subscription:
        """Store a subscription of ``uri`` alive until ``now + ttl``; it gets a fresh id.

        The subject and filter are stored as given: the broker parses them first.

        Raises:
            InvalidArgument: ``ttl`` is not a positive finite number.
            StoreError: the database failed.
        """
        if not (math.isfinite(ttl) and ttl > 0):
            raise InvalidArgument(f"subscription ttl must be a positive number, not {ttl!r}")
        values = {
            "uri": uri,
            "subject": subject,
            "filter": filter,
            "created_at": now,
            "expires_at": now + ttl,
            "qclass": qclass,
            "in_order": in_order,
        }
        with transaction(self._engine, "add_subscription") as conn:
            row = conn.execute(_ADD, values).one()
            self._tell_others(conn)
        return _record(row, (subject, filter))

    def remove_subscription(self, uri: str, sub_id: int) -> bool:
        """Delete subscription ``sub_id`` if it belongs to ``uri``; True if one was deleted.

        A user can only remove its own: another user's id gives False, as does an unknown
        or already expired-and-swept id.

        Raises:
            StoreError: the database failed.
        """
        with transaction(self._engine, "remove_subscription") as conn:
            result = conn.execute(
                delete(SubscriptionRow).where(
                    SubscriptionRow.id == sub_id, SubscriptionRow.uri == uri
                )
            )
            if result.rowcount:
                self._tell_others(conn)
        return bool(result.rowcount)

    def renew_subscription(
        self, uri: str, sub_id: int, ttl: float, now: float
    ) -> Subscription | None:
        """Move live subscription ``sub_id`` of ``uri`` to expire at ``now + ttl``; the
        renewed subscription, or None when ``uri`` has no live one of that id (an
        expired one is not brought back: it may have missed publishes meanwhile).

        Raises:
            InvalidArgument: ``ttl`` is not a positive finite number.
            StoreError: the database failed.
        """
        if not (math.isfinite(ttl) and ttl > 0):
            raise InvalidArgument(f"subscription ttl must be a positive number, not {ttl!r}")
        with transaction(self._engine, "renew_subscription") as conn:
            row = conn.execute(
                update(SubscriptionRow)
                .where(
                    SubscriptionRow.id == sub_id,
                    SubscriptionRow.uri == uri,
                    SubscriptionRow.expires_at > now,
                )
                .values(expires_at=now + ttl)
                .returning(*_COLUMNS)
            ).one_or_none()
            if row is not None:
                self._tell_others(conn)
        return None if row is None else _record(row)

    def get_subscription(self, sub_id: int, now: float) -> Subscription | None:
        """Subscription ``sub_id`` if it exists and is alive at ``now``, else None.

        Raises:
            StoreError: the database failed.
        """
        with reading(self._engine, "get_subscription") as conn:
            row = conn.execute(
                select(*_COLUMNS).where(
                    SubscriptionRow.id == sub_id, SubscriptionRow.expires_at > now
                )
            ).one_or_none()
        return None if row is None else _record(row)

    def list_subscriptions(self, uri: str, now: float) -> list[Subscription]:
        """The alive subscriptions of ``uri`` (``expires_at > now``), by id.

        Raises:
            StoreError: the database failed.
        """
        with reading(self._engine, "list_subscriptions") as conn:
            rows = conn.execute(
                select(*_COLUMNS)
                .where(SubscriptionRow.uri == uri, SubscriptionRow.expires_at > now)
                .order_by(SubscriptionRow.id)
            ).all()
        return [_record(row) for row in rows]

    def active_subscriptions(self, now: float) -> list[Subscription]:
        """Every alive subscription of every user, by id (to fill the matcher's cache).

        Raises:
            StoreError: the database failed.
        """
        with reading(self._engine, "active_subscriptions") as conn:
            rows = conn.execute(
                select(*_COLUMNS)
                .where(SubscriptionRow.expires_at > now)
                .order_by(SubscriptionRow.id)
            ).all()
        return [_record(row) for row in rows]

    def sweep_expired(self, now: float) -> list[Subscription]:
        """Delete the subscriptions with ``expires_at <= now`` and return them, by id.

        Raises:
            StoreError: the database failed.
        """
        with transaction(self._engine, "sweep_expired") as conn:
            rows = conn.execute(
                delete(SubscriptionRow)
                .where(SubscriptionRow.expires_at <= now)
                .returning(*_COLUMNS)
            ).all()
        return sorted((_record(row) for row in rows), key=lambda s: s.sub_id)
