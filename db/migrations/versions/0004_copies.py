"""copies of messages in the recipient's partition: origin columns, and the echoes they are owed by

Revision ID: 0004
Revises: 0003
"""

import re

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

# Tables of partitions k > 0 (db/partition_map.py) made before this revision get the same columns.
PARTITION_TABLE = re.compile(r"messages_p[0-9]+")


def _messages_tables() -> list[str]:
    names = sa.inspect(op.get_bind()).get_table_names()
    return ["messages", *sorted(n for n in names if PARTITION_TABLE.fullmatch(n))]


def upgrade() -> None:
    for table in _messages_tables():
        op.add_column(table, sa.Column("origin_part", sa.SmallInteger, nullable=True))
        op.add_column(table, sa.Column("origin_id", sa.BigInteger, nullable=True))
        op.create_unique_constraint("uq_messages_origin", table, ["origin_part", "origin_id"])
    op.create_table(
        "echoes",
        sa.Column("to_part", sa.SmallInteger, primary_key=True, autoincrement=False),
        sa.Column("from_part", sa.SmallInteger, primary_key=True, autoincrement=False),
        sa.Column("from_id", sa.BigInteger, primary_key=True, autoincrement=False),
        mysql_engine="InnoDB",
    )


def downgrade() -> None:
    op.drop_table("echoes")
    for table in _messages_tables():
        op.drop_constraint("uq_messages_origin", table, type_="unique")
        op.drop_column(table, "origin_id")
        op.drop_column(table, "origin_part")
