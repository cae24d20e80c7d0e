"""queue_counters.depth: each user's queue length, kept by the queue store

Revision ID: 0004
Revises: "0003"
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "queue_counters",
        sa.Column("depth", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
    )
    # Queues already there start at their real length.
    op.execute(
        "UPDATE queue_counters SET depth = (SELECT COUNT(*) FROM queued_notifications q"
        " WHERE q.uri = queue_counters.uri)"
    )


def downgrade() -> None:
    with op.batch_alter_table("queue_counters") as batch:
        batch.drop_column("depth")
