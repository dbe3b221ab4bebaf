"""events in the stream (kind, ref_id), a message's latest version (edited_at, deleted), read markers, device acks

Revision ID: 0005
Revises: 0004
"""

import re

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

BIN = "utf8mb4_bin"
# Tables of partitions k > 0 (db/partition_map.py) made before this revision get the same columns.
PARTITION_TABLE = re.compile(r"messages_p[0-9]+")


def _messages_tables() -> list[str]:
    names = sa.inspect(op.get_bind()).get_table_names()
    return ["messages", *sorted(n for n in names if PARTITION_TABLE.fullmatch(n))]


def upgrade() -> None:
    for table in _messages_tables():
        op.add_column(table, sa.Column("kind", sa.SmallInteger, nullable=False, server_default="0"))
        op.add_column(table, sa.Column("ref_id", sa.BigInteger, nullable=True))
        op.add_column(table, sa.Column("edited_at", mysql.DATETIME(fsp=3), nullable=True))
        op.add_column(table, sa.Column("deleted", sa.Boolean, nullable=False, server_default="0"))
    op.create_table(
        "read_markers",
        sa.Column("reader", sa.String(64, collation=BIN), primary_key=True),
        sa.Column("peer", sa.String(64, collation=BIN), primary_key=True),
        sa.Column("upto", sa.BigInteger, nullable=False),
        mysql_engine="InnoDB", mysql_charset="utf8mb4", mysql_collate=BIN,
    )
    op.create_table(
        "device_acks",
        sa.Column("user", sa.String(64, collation=BIN), primary_key=True),
        sa.Column("device", sa.String(64, collation=BIN), primary_key=True),
        sa.Column("upto", sa.BigInteger, nullable=False),
        sa.Column("acked_at", mysql.DATETIME(fsp=3), nullable=False),
        mysql_engine="InnoDB", mysql_charset="utf8mb4", mysql_collate=BIN,
    )


def downgrade() -> None:
    op.drop_table("device_acks")
    op.drop_table("read_markers")
    for table in _messages_tables():
        for column in ("deleted", "edited_at", "ref_id", "kind"):
            op.drop_column(table, column)
