"""broker schema (owned by mdeci.store.models)

Revision ID: 0003
Revises: "0002"
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Spelled out here rather than imported from the models: a migration is a frozen record.
_BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "users",
        sa.Column("uri", sa.Text(), nullable=False),
        sa.Column("username", sa.Text(), nullable=False),
        sa.Column("realm", sa.Text(), nullable=False),
        sa.Column("ha1_md5", sa.Text(), nullable=False),
        sa.Column("ha1_sha256", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("uri", name=op.f("pk_users")),
        sa.UniqueConstraint("username", "realm", name=op.f("uq_users_username")),
    )
    op.create_table(
        "bindings",
        sa.Column("aor", sa.Text(), nullable=False),
        sa.Column("contact", sa.Text(), nullable=False),
        sa.Column("expires_at", sa.Double(), nullable=False),
        sa.Column("call_id", sa.Text(), nullable=False),
        sa.Column("cseq", sa.BigInteger(), nullable=False),
        sa.Column("q", sa.Double(), nullable=False),
        sa.Column("source", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("aor", "contact", name=op.f("pk_bindings")),
    )
    op.create_index(op.f("ix_bindings_expires_at"), "bindings", ["expires_at"])
    op.create_table(
        "sessions",
        sa.Column("uri", sa.Text(), nullable=False),
        sa.Column("call_id", sa.Text(), nullable=False),
        sa.Column("local_tag", sa.Text(), nullable=False),
        sa.Column("remote_tag", sa.Text(), nullable=False),
        sa.Column("remote_target", sa.Text(), nullable=False),
        sa.Column("route_set", sa.Text(), nullable=False),
        sa.Column("remote_sdp", sa.Text(), nullable=False),
        sa.Column("media_addr", sa.Text(), nullable=False),
        sa.Column("session_key", sa.LargeBinary(), nullable=False),
        sa.Column("msisdn", sa.Text(), nullable=True),
        sa.Column("status", sa.Text(), nullable=False),
        sa.Column("local_cseq", sa.BigInteger(), nullable=False),
        sa.Column("remote_cseq", sa.BigInteger(), nullable=False),
        sa.Column("started_at", sa.Double(), nullable=False),
        sa.Column("updated_at", sa.Double(), nullable=False),
        sa.CheckConstraint(
            "status IN ('CONNECTED', 'DISCONNECTED', 'ENDED')",
            name=op.f("ck_sessions_status"),
        ),
        sa.PrimaryKeyConstraint("uri", name=op.f("pk_sessions")),
    )
    op.create_index(op.f("ix_sessions_status"), "sessions", ["status"])
    op.create_table(
        "subscriptions",
        sa.Column("id", _BIG_ID, autoincrement=True, nullable=False),
        sa.Column("uri", sa.Text(), nullable=False),
        sa.Column("subject", sa.Text(), nullable=False),
        sa.Column("filter", sa.Text(), nullable=False),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.Column("expires_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_subscriptions")),
        sqlite_autoincrement=True,
    )
    op.create_index(op.f("ix_subscriptions_uri"), "subscriptions", ["uri"])
    op.create_index(op.f("ix_subscriptions_expires_at"), "subscriptions", ["expires_at"])
    op.create_table(
        "published_messages",
        sa.Column("publisher_uri", sa.Text(), nullable=False),
        sa.Column("msg_id", sa.Text(), nullable=False),
        sa.Column("matched", sa.Integer(), nullable=False),
        sa.Column("published_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("publisher_uri", "msg_id", name=op.f("pk_published_messages")),
    )
    op.create_index(
        op.f("ix_published_messages_published_at"), "published_messages", ["published_at"]
    )
    op.create_table(
        "queue_counters",
        sa.Column("uri", sa.Text(), nullable=False),
        sa.Column("last_nseq", sa.BigInteger(), nullable=False),
        sa.Column("missed", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("uri", name=op.f("pk_queue_counters")),
    )
    op.create_table(
        "queued_notifications",
        sa.Column("uri", sa.Text(), nullable=False),
        sa.Column("nseq", sa.BigInteger(), nullable=False),
        sa.Column("sub_id", sa.BigInteger(), nullable=False),
        sa.Column("publisher_uri", sa.Text(), nullable=False),
        sa.Column("msg_id", sa.Text(), nullable=False),
        sa.Column("subject", sa.Text(), nullable=False),
        sa.Column("attrs_cbor", sa.LargeBinary(), nullable=False),
        sa.Column("payload", sa.LargeBinary(), nullable=False),
        sa.Column("urgent", sa.Boolean(), nullable=False),
        sa.Column("published_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("uri", "nseq", name=op.f("pk_queued_notifications")),
    )


def downgrade() -> None:
    op.drop_table("queued_notifications")
    op.drop_table("queue_counters")
    op.drop_index(op.f("ix_published_messages_published_at"), table_name="published_messages")
    op.drop_table("published_messages")
    op.drop_index(op.f("ix_subscriptions_expires_at"), table_name="subscriptions")
    op.drop_index(op.f("ix_subscriptions_uri"), table_name="subscriptions")
    op.drop_table("subscriptions")
    op.drop_index(op.f("ix_sessions_status"), table_name="sessions")
    op.drop_table("sessions")
    op.drop_index(op.f("ix_bindings_expires_at"), table_name="bindings")
    op.drop_table("bindings")
    op.drop_table("users")
