"""messages and stream_state

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

BIN = "utf8mb4_bin"


def upgrade() -> None:
    op.create_table(
        "messages",
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("sender", sa.String(64, collation=BIN), nullable=False),
        sa.Column("recipient", sa.String(64, collation=BIN), nullable=False),
        sa.Column("conversation", sa.String(129, collation=BIN), nullable=False),
        sa.Column("body", sa.Text(collation=BIN), nullable=False),
        sa.Column("client_msg_id", sa.String(64, collation=BIN), nullable=True),
        sa.Column("created_at", mysql.DATETIME(fsp=3), nullable=False),
        sa.UniqueConstraint("sender", "client_msg_id", name="uq_messages_sender_client_msg_id"),
        mysql_engine="InnoDB",
        mysql_charset="utf8mb4",
        mysql_collate=BIN,
    )
    op.create_index("ix_messages_conversation_id", "messages", ["conversation", "id"])
    op.create_table(
        "stream_state",
        sa.Column("id", sa.SmallInteger, primary_key=True, autoincrement=False),
        sa.Column("last_id", sa.BigInteger, nullable=False),
        sa.Column("mirrored_upto", sa.BigInteger, nullable=False),
        mysql_engine="InnoDB",
    )
    op.execute("INSERT INTO stream_state (id, last_id, mirrored_upto) VALUES (1, 0, 0)")


def downgrade() -> None:
    op.drop_table("stream_state")
    op.drop_table("messages")
