"""device_calendars (each device's weekly channel calendar); the queue class of a
subscription and of a queued notification

Revision ID: 0005c
Revises: "0004"
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005c"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "device_calendars",
        sa.Column("user_uri", sa.String(length=255), nullable=False),
        sa.Column("rules_cbor", sa.LargeBinary(), nullable=False),
        sa.Column("utc_offset_minutes", sa.Integer(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("user_uri", name=op.f("pk_device_calendars")),
    )
    op.add_column("subscriptions", sa.Column("qclass", sa.Text(), nullable=True))
    op.add_column("queued_notifications", sa.Column("qclass", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("queued_notifications") as batch:
        batch.drop_column("qclass")
    with op.batch_alter_table("subscriptions") as batch:
        batch.drop_column("qclass")
    op.drop_table("device_calendars")
