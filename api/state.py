"""What the write API's requests share, made by the lifespan (``api.app``)
and read by the routes and by ``api.post_message``."""

from __future__ import annotations

from dataclasses import dataclass

from pymongo import AsyncMongoClient
from sqlalchemy.engine import Engine

from api.ratelimit import RateLimiter
from chat.partitions import SlotMap
from chat.settings import Settings
from db.threads import Threads
from writer.client import RemoteWriter
from writer.partitioned import PartitionedWriter


@dataclass
class State:
    settings: Settings
    engine: Engine
    mongo_client: AsyncMongoClient
    writer: PartitionedWriter | RemoteWriter
    limiter: RateLimiter
    reads: Threads  # the blocking MySQL reads; never asyncio's default executor (db.threads)
    slot_map: SlotMap  # read at start: which partition's table holds a user's history
