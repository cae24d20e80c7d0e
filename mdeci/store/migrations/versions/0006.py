"""sessions.owner and sessions.epoch: which broker node holds each user, fenced

Revision ID: 0006
Revises: 0005a
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005a"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "sessions", sa.Column("owner", sa.Text(), server_default=sa.text("''"), nullable=False)
    )
    op.add_column(
        "sessions", sa.Column("epoch", sa.BigInteger(), server_default=sa.text("0"), nullable=False)
    )


def downgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        batch.drop_column("epoch")
        batch.drop_column("owner")
