"""push devices, the pusher's progress per partition, and its outbox

Revision ID: 0006
Revises: 0005
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

BIN = "utf8mb4_bin"


def upgrade() -> None:
    op.create_table(
        "devices",
        sa.Column("user", sa.String(64, collation=BIN), primary_key=True),
        sa.Column("device", sa.String(64, collation=BIN), primary_key=True),
        sa.Column("platform", sa.String(16, collation=BIN), nullable=False),
        sa.Column("app_id", sa.String(128, collation=BIN), nullable=False),
        sa.Column("pushkey", sa.String(512, collation=BIN), nullable=False),
        sa.Column("data", sa.Text(collation=BIN), nullable=False),
        sa.Column("created_at", mysql.DATETIME(fsp=3), nullable=False),
        mysql_engine="InnoDB", mysql_charset="utf8mb4", mysql_collate=BIN,
    )
    op.create_table(
        "push_state",
        sa.Column("id", sa.SmallInteger, primary_key=True, autoincrement=False),
        sa.Column("upto", sa.BigInteger, nullable=False),
        mysql_engine="InnoDB",
    )
    op.create_table(
        "push_outbox",
        sa.Column("key", sa.String(160, collation=BIN), primary_key=True),
        sa.Column("partition", sa.SmallInteger, nullable=False),
        sa.Column("user", sa.String(64, collation=BIN), nullable=False),
        sa.Column("device", sa.String(64, collation=BIN), nullable=False),
        sa.Column("notification", sa.Text(collation=BIN), nullable=False),
        sa.Column("created_at", mysql.DATETIME(fsp=3), nullable=False),
        sa.Column("attempts", sa.SmallInteger, nullable=False, server_default="0"),
        sa.Column("next_at", mysql.DATETIME(fsp=3), nullable=False),
        mysql_engine="InnoDB", mysql_charset="utf8mb4", mysql_collate=BIN,
    )
    op.create_index("ix_push_outbox_partition_next_at", "push_outbox", ["partition", "next_at"])


def downgrade() -> None:
    op.drop_table("push_outbox")
    op.drop_table("push_state")
    op.drop_table("devices")
