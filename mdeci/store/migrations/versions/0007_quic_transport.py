"""sessions.transport: the data channel the session's SDP answer accepted

Revision ID: 0007q
Revises: 0006
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007q"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Every session stored before the column existed was on RUDP, the only channel then.
    op.add_column(
        "sessions",
        sa.Column("transport", sa.Text(), server_default=sa.text("'rudp'"), nullable=False),
    )


def downgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        batch.drop_column("transport")
