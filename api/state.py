"""What the write API's requests share, made by the lifespan (``api.app``)
and read by the routes and by ``api.post_message``."""

from __future__ import annotations

from dataclasses import dataclass

from pymongo import AsyncMongoClient
from sqlalchemy.engine import Engine

from api.ratelimit import RateLimiter
from chat.settings import Settings
from db.threads import Threads
from writer.client import RemoteWriter
from writer.message_writer import MessageWriter


@dataclass
class State:
    settings: Settings
    engine: Engine
    mongo_client: AsyncMongoClient
    writer: MessageWriter | RemoteWriter
    limiter: RateLimiter
    reads: Threads  # the blocking MySQL reads; never asyncio's default executor (db.threads)
