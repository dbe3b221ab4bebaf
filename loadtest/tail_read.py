"""What the oplog tail's projection saves its reader (the relay, or a daemon tailing alone),
per entry: the tail asks the server for the fields a consumer reads only
(``oplog.tail.ENTRY_PROJECTION``), against the whole entries it asked for before.

The writer's documents are inserted as it inserts them (``insert_many`` of 100), then the
oplog is read the tail's way (a ``find`` on ``local.oplog.rs`` by ``ts`` and ``ns``, then
``getMore`` batches of 1,000), with the projection and without, rounds alternated. Per
entry: the reading process's CPU (the driver decodes every reply into dicts, as the tail
takes them), the server's CPU, and the reply's bytes. FerretDB's figures, not MongoDB's:
FerretDB's entries carry an ObjectId ``_id``, ``wall``, ``t`` and ``v`` besides; MongoDB's
carry ``ui``, ``wall``, ``t``, ``v`` and, for a retryable write, ``lsid``, ``txnNumber``,
``stmtId`` and ``prevOpTime``.

    .venv/bin/python -m loadtest.tail_read --entries 20000 --rounds 3

Writes loadtest/results/tail-read.json.
"""

from __future__ import annotations

import json
import statistics
import tempfile
from pathlib import Path

import psutil
import typer
from bson import Timestamp
from bson.codec_options import CodecOptions
from bson.raw_bson import RawBSONDocument
from pymongo import MongoClient

from chat.messages import Message, now_ms
from harness.system import databases
from loadtest.common import machine
from loadtest.common.results import RESULTS
from oplog.tail import ENTRY_PROJECTION

app = typer.Typer(add_completion=False)
NAMESPACES = ["chat.messages", "admin.$cmd"]
RAW = CodecOptions(document_class=RawBSONDocument)
DICTS: CodecOptions = CodecOptions()  # as the tail's client decodes


def read_oplog(client: MongoClient, projection: dict | None, codec: CodecOptions = DICTS) -> list:
    """Every entry of the namespaces, as the tail reads them (its find and getMores)."""
    local = client["local"]
    find: dict = {"find": "oplog.rs", "filter": {"ts": {"$gte": Timestamp(0, 0)}, "ns": {"$in": NAMESPACES}},
                  "batchSize": 1000}
    if projection is not None:
        find["projection"] = projection
    cursor = local.command(find, codec_options=codec)["cursor"]
    entries = list(cursor["firstBatch"])
    while cursor["id"]:
        cursor = local.command({"getMore": cursor["id"], "collection": "oplog.rs", "batchSize": 1000},
                               codec_options=codec)["cursor"]
        entries.extend(cursor["nextBatch"])
    return entries


def measure(client: MongoClient, server: psutil.Process, projection: dict | None) -> dict:
    own, theirs = machine.own_cpu_seconds(), machine.cpu_seconds([server])
    entries = read_oplog(client, projection)
    own, theirs = machine.own_cpu_seconds() - own, machine.cpu_seconds([server]) - theirs
    raw = read_oplog(client, projection, RAW)
    return {"entries": len(entries), "reader_cpu_us": own / len(entries) * 1e6,
            "server_cpu_us": theirs / len(entries) * 1e6,
            "bytes": sum(len(doc.raw) for doc in raw) / len(raw), "fields": sorted(entries[-1])}


@app.command()
def main(entries: int = typer.Option(20_000, min=100), rounds: int = typer.Option(3, min=1),
         out: Path = typer.Option(RESULTS / "tail-read.json")) -> None:
    runs: dict[str, list[dict]] = {"whole": [], "projected": []}
    with databases(Path(tempfile.mkdtemp(prefix="tail-read-")), oplog_max_docs=entries + 1000) as dbs:
        client: MongoClient = MongoClient(dbs.ferretdb.url)
        messages = client["chat"]["messages"]
        created = now_ms()
        for first in range(1, entries + 1, 100):
            messages.insert_many([Message(i, f"user{i % 97}", f"user{i % 89}", f"message {i} " * 4, created,
                                          f"c-{i}").to_doc() for i in range(first, min(first + 100, entries + 1))])
        server = psutil.Process(machine.pid_of(dbs.ferretdb.proc))
        for r in range(rounds):
            for name in ("whole", "projected") if r % 2 == 0 else ("projected", "whole"):
                run = measure(client, server, None if name == "whole" else ENTRY_PROJECTION)
                runs[name].append(run)
                print(f"round {r + 1}, {name}: {run['entries']} entries, reader {run['reader_cpu_us']:.1f} us, "
                      f"FerretDB {run['server_cpu_us']:.1f} us, {run['bytes']:.0f} bytes per entry", flush=True)
        client.close()
    median = {name: {key: round(statistics.median(run[key] for run in rs), 1)
                     for key in ("reader_cpu_us", "server_cpu_us", "bytes")} | {"fields": rs[-1]["fields"]}
              for name, rs in runs.items()}
    result = {**machine.describe(), "entries": entries, "rounds": rounds,
              "where": "one process reading FerretDB 1.24's oplog over loopback the tail's way (find, then getMore "
                       "batches of 1,000), every entry a writer-shaped message insert; per entry: the reader's CPU "
                       "(its user + system time, the driver decoding each reply into dicts), FerretDB's CPU and "
                       "the reply's bytes; medians of the rounds, alternated",
              "per_entry": median,
              "reader_cpu_ratio": round(median["projected"]["reader_cpu_us"] / median["whole"]["reader_cpu_us"], 2),
              "server_cpu_ratio": round(median["projected"]["server_cpu_us"] / median["whole"]["server_cpu_us"], 2),
              "bytes_ratio": round(median["projected"]["bytes"] / median["whole"]["bytes"], 2),
              "rounds_raw": {name: [{k: round(v, 1) for k, v in run.items() if k != "fields"} for run in rs]
                             for name, rs in runs.items()}}
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"projected / whole: reader CPU {result['reader_cpu_ratio']}x, FerretDB CPU {result['server_cpu_ratio']}x, "
          f"bytes {result['bytes_ratio']}x; wrote {out}")


if __name__ == "__main__":
    app()
