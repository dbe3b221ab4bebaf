"""presence: each user's last seen and whether they hide their presence

Revision ID: 0007
Revises: 0006
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

BIN = "utf8mb4_bin"


def upgrade() -> None:
    # One row per user who has gone offline or hidden their presence: online
    # itself lives in Redis (docs/presence.md), never here.
    op.create_table(
        "presence",
        sa.Column("user", sa.String(64, collation=BIN), primary_key=True),
        sa.Column("last_seen", mysql.DATETIME(fsp=3), nullable=True),
        sa.Column("hidden", sa.Boolean, nullable=False, server_default=sa.false()),
        mysql_engine="InnoDB", mysql_charset="utf8mb4", mysql_collate=BIN,
    )


def downgrade() -> None:
    op.drop_table("presence")
