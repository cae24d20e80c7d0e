"""channel usage counters (owned by mdeci.store.usage)

Revision ID: 0002
Revises: "0001"
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "channel_usage",
        sa.Column("user_uri", sa.String(length=255), nullable=False),
        sa.Column("channel", sa.String(length=64), nullable=False),
        sa.Column("qclass", sa.String(length=32), nullable=False),
        sa.Column("day", sa.Date(), nullable=False),
        sa.Column("messages", sa.BigInteger(), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("money_nanos", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint(
            "user_uri", "channel", "qclass", "day", name=op.f("pk_channel_usage")
        ),
    )
    op.create_index("ix_channel_usage_user_day", "channel_usage", ["user_uri", "day"])


def downgrade() -> None:
    op.drop_index("ix_channel_usage_user_day", table_name="channel_usage")
    op.drop_table("channel_usage")
