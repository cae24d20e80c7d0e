"""Channel usage counters (messages, bytes, money) for the selector's limits.

One row per (user, channel, queue class, UTC day), incremented with an upsert, so a
limit's window (a day, a week, a month: whole UTC days) is a sum over a few rows and the
table stays small. Money is stored as integer nano-units (1e-9 of the currency) so sums
are exact on SQLite and PostgreSQL alike. Migration: ``mdeci/store/migrations/versions/0002.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date

from sqlalchemy import BigInteger, Date, Index, String, func, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Mapped, Session, mapped_column

from mdeci.channels.limits import Usage, utc_day
from mdeci.store.base import Base
from mdeci.store.queues import SqlQueueStore

NANOS = 1_000_000_000


class ChannelUsage(Base):
    """What was sent to one user on one channel for one queue class on one UTC day."""

    __tablename__ = "channel_usage"
    __table_args__ = (Index("ix_channel_usage_user_day", "user_uri", "day"),)

    user_uri: Mapped[str] = mapped_column(String(255), primary_key=True)
    channel: Mapped[str] = mapped_column(String(64), primary_key=True)
    qclass: Mapped[str] = mapped_column(String(32), primary_key=True)
    day: Mapped[date] = mapped_column(Date, primary_key=True)
    messages: Mapped[int] = mapped_column(BigInteger, default=0)
    bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    money_nanos: Mapped[int] = mapped_column(BigInteger, default=0)


@dataclass(frozen=True, slots=True)
class UserSpend:
    """One line of the per-user spend report (``mdeci status``, admin commands)."""

    user: str
    channel: str
    messages: int
    bytes: int
    money: float


def to_nanos(money: float) -> int:
    return round(money * NANOS)


def add_usage(
    session: Session, *, user: str, channel: str, qclass: str, day: date, usage: Usage
) -> None:
    """Add ``usage`` to the counters of (user, channel, qclass, day); the caller commits."""
    values = {
        "user_uri": user,
        "channel": channel,
        "qclass": qclass,
        "day": day,
        "messages": usage.messages,
        "bytes": usage.bytes,
        "money_nanos": to_nanos(usage.money),
    }
    dialect = session.get_bind().dialect.name
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    stmt = insert(ChannelUsage).values(**values)
    stmt = stmt.on_conflict_do_update(
        index_elements=["user_uri", "channel", "qclass", "day"],
        set_={
            "messages": ChannelUsage.messages + stmt.excluded.messages,
            "bytes": ChannelUsage.bytes + stmt.excluded.bytes,
            "money_nanos": ChannelUsage.money_nanos + stmt.excluded.money_nanos,
        },
    )
    session.execute(stmt)


def usage_in_window(
    session: Session,
    *,
    user: str,
    first_day: date,
    end_day: date,
    channel: str | None = None,
    qclass: str | None = None,
) -> Usage:
    """Total sent to ``user`` on days ``first_day <= day < end_day`` (``None``: any)."""
    stmt = select(
        func.coalesce(func.sum(ChannelUsage.messages), 0),
        func.coalesce(func.sum(ChannelUsage.bytes), 0),
        func.coalesce(func.sum(ChannelUsage.money_nanos), 0),
    ).where(
        ChannelUsage.user_uri == user,
        ChannelUsage.day >= first_day,
        ChannelUsage.day < end_day,
    )
    if channel is not None:
        stmt = stmt.where(ChannelUsage.channel == channel)
    if qclass is not None:
        stmt = stmt.where(ChannelUsage.qclass == qclass)
    messages, nbytes, nanos = session.execute(stmt).one()
    return Usage(int(messages), int(nbytes), int(nanos) / NANOS)


def spend_by_user(
    session: Session, *, first_day: date, end_day: date, user: str | None = None
) -> list[UserSpend]:
    """Per-user, per-channel totals over ``first_day <= day < end_day``, sorted."""
    stmt = (
        select(
            ChannelUsage.user_uri,
            ChannelUsage.channel,
            func.sum(ChannelUsage.messages),
            func.sum(ChannelUsage.bytes),
            func.sum(ChannelUsage.money_nanos),
        )
        .where(ChannelUsage.day >= first_day, ChannelUsage.day < end_day)
        .group_by(ChannelUsage.user_uri, ChannelUsage.channel)
        .order_by(ChannelUsage.user_uri, ChannelUsage.channel)
    )
    if user is not None:
        stmt = stmt.where(ChannelUsage.user_uri == user)
    return [
        UserSpend(u, ch, int(m), int(b), int(n) / NANOS)
        for u, ch, m, b, n in session.execute(stmt).all()
    ]


class SqlUsage:
    """The durable :class:`mdeci.channels.UsageCounter`: one short transaction per call."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def add(self, user: str, channel: str, qclass: str, at: float, usage: Usage) -> None:
        with Session(self._engine) as session, session.begin():
            add_usage(
                session, user=user, channel=channel, qclass=qclass, day=utc_day(at), usage=usage
            )

    def usage(
        self,
        user: str,
        first_day: date,
        end_day: date,
        *,
        channel: str | None = None,
        qclass: str | None = None,
    ) -> Usage:
        with Session(self._engine) as session:
            return usage_in_window(
                session,
                user=user,
                first_day=first_day,
                end_day=end_day,
                channel=channel,
                qclass=qclass,
            )

    def spend(self, first_day: date, end_day: date, *, user: str | None = None) -> list[UserSpend]:
        with Session(self._engine) as session:
            return spend_by_user(session, first_day=first_day, end_day=end_day, user=user)


def remove_delivered(engine: Engine, uri: str, nseq: int) -> bool:
    """Delete one queued notification of ``uri`` that a side channel (SMS) delivered.

    ``SqlQueueStore.ack`` is cumulative (``nseq <= upto``), which is right for the
    in-order IP stream but would drop older notifications still waiting for IP when an
    urgent one is acknowledged by SMS; this removes exactly one. Whether it existed.

    Raises:
        StoreError: the database failed.
    """
    # Through the queue store, which keeps queue_counters.depth in step.
    return SqlQueueStore(engine).remove(uri, nseq)


def spend_report(
    url: str, first_day: date, end_day: date, *, user: str | None = None
) -> list[UserSpend]:
    """Per-user spend from the database at ``url`` (for the ``mdeci sms spend`` command).

    Raises:
        StoreError: the database cannot be opened or has no usage table (not migrated).
    """
    from sqlalchemy.exc import SQLAlchemyError

    from mdeci.errors import StoreError
    from mdeci.store.base import make_engine

    try:
        engine = make_engine(url)
    except (SQLAlchemyError, ValueError) as exc:
        raise StoreError(f"not a usable database URL: {str(exc).splitlines()[0]}") from None
    try:
        return SqlUsage(engine).spend(first_day, end_day, user=user)
    except SQLAlchemyError as exc:
        cause = getattr(exc, "orig", None) or exc  # the DBAPI error reads better
        first = str(cause).splitlines()[0]
        raise StoreError(f"cannot read channel usage ({first}); run `mdeci db upgrade`") from None
    finally:
        engine.dispose()
