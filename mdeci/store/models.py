"""SQLAlchemy 2.0 typed models of the broker's durable state (docs/protocol.md §6).

Migrations ``mdeci/store/migrations/versions/`` create exactly these tables;
``alembic check`` in ``tests/store/test_migrations.py`` fails if the two drift apart. Repositories
(``users.py``, ``bindings.py``, ``sessions.py``, ``subscriptions.py``, ``queues.py``) are
the only code that touches them; broker logic gets frozen dataclasses, never these rows.

Conventions: a user is identified by its AOR URI (never an address); times are epoch
seconds as double precision floats passed in by the caller; free text is ``Text`` so no
length limit differs between SQLite and PostgreSQL. See docs/storage.md.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Double,
    Integer,
    LargeBinary,
    Text,
    UniqueConstraint,
    false,
    text,
)
from sqlalchemy.orm import Mapped, mapped_column

from mdeci.store.base import Base

# BIGINT on PostgreSQL; plain INTEGER on SQLite, because only "INTEGER PRIMARY KEY" is the
# rowid alias that autoincrements there.
BigIntId = BigInteger().with_variant(Integer(), "sqlite")


class UserRow(Base):
    """A user and its digest credentials: HA1 = H(username:realm:password), RFC 3261/8760."""

    __tablename__ = "users"
    __table_args__ = (UniqueConstraint("username", "realm"),)

    uri: Mapped[str] = mapped_column(Text, primary_key=True)
    username: Mapped[str] = mapped_column(Text)
    realm: Mapped[str] = mapped_column(Text)
    ha1_md5: Mapped[str] = mapped_column(Text)
    ha1_sha256: Mapped[str] = mapped_column(Text)


class BindingRow(Base):
    """A registrar binding (RFC 3261 section 10): one contact of one AOR, until expires_at."""

    __tablename__ = "bindings"

    aor: Mapped[str] = mapped_column(Text, primary_key=True)
    contact: Mapped[str] = mapped_column(Text, primary_key=True)
    expires_at: Mapped[float] = mapped_column(Double, index=True)
    call_id: Mapped[str] = mapped_column(Text)
    cseq: Mapped[int] = mapped_column(BigInteger)
    q: Mapped[float] = mapped_column(Double)
    source: Mapped[str | None] = mapped_column(Text)


class SessionRow(Base):
    """The Session Manager's state of one user: its dialog, media address and status."""

    __tablename__ = "sessions"
    __table_args__ = (
        CheckConstraint("status IN ('CONNECTED', 'DISCONNECTED', 'ENDED')", name="status"),
    )

    uri: Mapped[str] = mapped_column(Text, primary_key=True)
    call_id: Mapped[str] = mapped_column(Text)
    local_tag: Mapped[str] = mapped_column(Text)
    remote_tag: Mapped[str] = mapped_column(Text)
    remote_target: Mapped[str] = mapped_column(Text)
    route_set: Mapped[str] = mapped_column(Text)
    remote_sdp: Mapped[str] = mapped_column(Text)
    media_addr: Mapped[str] = mapped_column(Text)
    session_key: Mapped[bytes] = mapped_column(LargeBinary)
    msisdn: Mapped[str | None] = mapped_column(Text)
    status: Mapped[str] = mapped_column(Text, index=True)
    local_cseq: Mapped[int] = mapped_column(BigInteger)
    remote_cseq: Mapped[int] = mapped_column(BigInteger)
    started_at: Mapped[float] = mapped_column(Double)
    updated_at: Mapped[float] = mapped_column(Double)
    # The broker node that holds the user ('' : none yet) and the fencing epoch it holds
    # the user at: raised by every new session and takeover; every write for the user
    # names the epoch it expects (mdeci/store/ownership.py).
    owner: Mapped[str] = mapped_column(Text, server_default=text("''"))
    epoch: Mapped[int] = mapped_column(BigInteger, server_default=text("0"))
    # The data channel the SDP answer accepted ("rudp" or "quic"): a restart restores
    # the session on it.
    transport: Mapped[str] = mapped_column(Text, server_default=text("'rudp'"))


class SubscriptionRow(Base):
    """A subscription of one user, alive while ``now < expires_at``."""

    __tablename__ = "subscriptions"
    # AUTOINCREMENT on SQLite: a deleted id is never handed out again (as on PostgreSQL).
    __table_args__ = {"sqlite_autoincrement": True}

    id: Mapped[int] = mapped_column(BigIntId, primary_key=True, autoincrement=True)
    uri: Mapped[str] = mapped_column(Text, index=True)
    subject: Mapped[str] = mapped_column(Text)
    filter: Mapped[str] = mapped_column(Text)
    created_at: Mapped[float] = mapped_column(Double)
    expires_at: Mapped[float] = mapped_column(Double, index=True)
    qclass: Mapped[str | None] = mapped_column(Text, nullable=True)  # the queue class asked for
    # Its notifications are delivered in nseq order (docs/channels.md "The order").
    in_order: Mapped[bool] = mapped_column(Boolean, server_default=false(), default=False)


class PublishedRow(Base):
    """A msg_id already published by a publisher, kept for idempotence until pruned."""

    __tablename__ = "published_messages"

    publisher_uri: Mapped[str] = mapped_column(Text, primary_key=True)
    msg_id: Mapped[str] = mapped_column(Text, primary_key=True)
    matched: Mapped[int] = mapped_column(Integer)
    published_at: Mapped[float] = mapped_column(Double, index=True)


class QueueCounterRow(Base):
    """Per-user queue counters: the last nseq handed out and the overflow drops not yet told.

    The row is never deleted, so an nseq is never reused even when the queue empties.
    """

    __tablename__ = "queue_counters"

    uri: Mapped[str] = mapped_column(Text, primary_key=True)
    last_nseq: Mapped[int] = mapped_column(BigInteger)
    missed: Mapped[int] = mapped_column(BigInteger)
    # How many rows of queued_notifications this user has: kept by every write to them
    # (SqlQueueStore), so the overflow check needs no COUNT(*) of a growing queue.
    depth: Mapped[int] = mapped_column(BigInteger, server_default=text("0"))


class QueuedRow(Base):
    """One notification waiting in a user's queue until the user acks its nseq."""

    __tablename__ = "queued_notifications"

    uri: Mapped[str] = mapped_column(Text, primary_key=True)
    nseq: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    sub_id: Mapped[int] = mapped_column(BigInteger)
    publisher_uri: Mapped[str] = mapped_column(Text)
    msg_id: Mapped[str] = mapped_column(Text)
    subject: Mapped[str] = mapped_column(Text)
    attrs_cbor: Mapped[bytes] = mapped_column(LargeBinary)
    payload: Mapped[bytes] = mapped_column(LargeBinary)
    urgent: Mapped[bool] = mapped_column(Boolean)
    published_at: Mapped[float] = mapped_column(Double)
    qclass: Mapped[str | None] = mapped_column(Text, nullable=True)  # the publish's


__all__ = [
    "BindingRow",
    "PublishedRow",
    "QueueCounterRow",
    "QueuedRow",
    "SessionRow",
    "SubscriptionRow",
    "UserRow",
]
