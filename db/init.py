"""Creates both schemas, waiting for the servers first: ``python -m db.init``.

MySQL through Alembic migrations, then the slot map (``CHAT_PARTITIONS``
partitions if MySQL has none yet; after that the map in MySQL rules) and the
tables of every partition; MongoDB through ``db.mongo.ensure_schema``, a
collection per partition. Safe to run again: it is what ``make run`` and the
test fixtures call.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from chat.logs import setup_logging
from chat.partitions import SlotMap
from chat.settings import Settings
from db import mongo
from db.partition_map import lay_out

log = logging.getLogger("chat.init")
ALEMBIC_INI = Path(__file__).with_name("alembic.ini")


def wait_for_mysql(url: str, deadline: float) -> None:
    # Connect without the database first: it may not exist yet.
    server = make_url(url).set(database="")
    while True:
        try:
            engine = create_engine(server)
            with engine.connect() as conn:
                db_name = make_url(url).database
                conn.execute(text(f"CREATE DATABASE IF NOT EXISTS `{db_name}` "
                                  "CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"))
            engine.dispose()
            return
        except Exception as exc:
            if time.monotonic() > deadline:
                raise RuntimeError(f"MySQL did not answer: {exc}") from exc
            time.sleep(0.5)


def migrate(url: str) -> None:
    cfg = Config(str(ALEMBIC_INI))
    cfg.attributes["url"] = url
    command.upgrade(cfg, "head")


def lay_out_partitions(url: str, partitions: int) -> SlotMap:
    engine = create_engine(url)
    try:
        return lay_out(engine, partitions)
    finally:
        engine.dispose()


async def init_mongo(settings: Settings, deadline: float, partitions: int = 1) -> dict:
    while True:
        client = mongo.make_client(settings.stores.mongo_url.get_secret_value(), 2.0)
        try:
            stores = settings.stores
            return await mongo.ensure_schema(client, stores.mongo_db, stores.retention_seconds,
                                             stores.oplog_max_docs, stores.oplog_size_bytes, partitions)
        except Exception as exc:
            if time.monotonic() > deadline:
                raise RuntimeError(f"MongoDB did not answer: {exc}") from exc
            await asyncio.sleep(0.5)
        finally:
            await client.close()


def init_all(settings: Settings, wait_seconds: float = 60) -> dict:
    deadline = time.monotonic() + wait_seconds
    url = settings.stores.mysql_url.get_secret_value()
    wait_for_mysql(url, deadline)
    migrate(url)
    slot_map = lay_out_partitions(url, settings.stores.partitions)
    found = asyncio.run(init_mongo(settings, deadline, slot_map.partitions))
    found["partitions"] = slot_map.partitions
    log.info("event=schema_ready mysql=migrated partitions=%d epoch=%d oplog=%s ttl_index=%s ferretdb=%s",
             slot_map.partitions, slot_map.epoch, found["oplog"], found["ttl_index"], found["ferretdb"])
    return found


if __name__ == "__main__":
    settings = Settings()
    setup_logging(settings.log_level)
    init_all(settings)
