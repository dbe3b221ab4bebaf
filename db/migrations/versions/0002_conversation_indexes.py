"""indexes for the conversation list (GET /v1/conversations)

Revision ID: 0002
Revises: 0001
"""

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_messages_sender_recipient_id", "messages", ["sender", "recipient", "id"])
    op.create_index("ix_messages_recipient_sender_id", "messages", ["recipient", "sender", "id"])


def downgrade() -> None:
    op.drop_index("ix_messages_recipient_sender_id", "messages")
    op.drop_index("ix_messages_sender_recipient_id", "messages")
