"""the slot map of the partitions (chat.partitions)

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "partition_map",
        sa.Column("id", sa.SmallInteger, primary_key=True, autoincrement=False),
        sa.Column("slot_map", sa.Text, nullable=False),
        mysql_engine="InnoDB",
    )


def downgrade() -> None:
    op.drop_table("partition_map")
