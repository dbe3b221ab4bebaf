"""Alembic environment: the URL comes from the settings object (CHAT_MYSQL_URL)."""

from alembic import context
from sqlalchemy import create_engine

from chat.settings import Settings
from db.sql import metadata

url = context.config.attributes.get("url") or Settings().stores.mysql_url.get_secret_value()
engine = create_engine(url)
with engine.connect() as connection:
    context.configure(connection=connection, target_metadata=metadata)
    with context.begin_transaction():
        context.run_migrations()
engine.dispose()
