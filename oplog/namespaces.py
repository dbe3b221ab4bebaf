"""Which namespaces an oplog entry belongs to: each partition's collection is
a namespace of its own (``chat.messages``, ``chat.messages_p1``, ...), and a
tail shared by several partitions' streams, the relay's or a daemon's, splits
what it reads by them. Pure: tested with plain dicts.
"""

from __future__ import annotations

from collections.abc import Container

from chat.partitions import collection_name


def partition_namespaces(db_name: str, partitions: list[int]) -> list[str]:
    """The namespaces of ``partitions``' collections (``chat.partitions.collection_name``)."""
    return [f"{db_name}.{collection_name(k)}" for k in partitions]


def split_by_namespace(entries: list[dict], wanted: Container[str]) -> dict[str, list[dict]]:
    """The entries of each wanted namespace, in the order the oplog holds them.

    One lookup per entry. A MongoDB transaction's ``applyOps`` entry (on
    ``admin.$cmd``) goes to every wanted namespace among its inner entries;
    anything else is left out."""
    groups: dict[str, list[dict]] = {}
    for entry in entries:
        ns = entry.get("ns")
        if ns in wanted:
            groups.setdefault(ns, []).append(entry)  # type: ignore[arg-type]
        elif entry.get("op") == "c":
            for inner_ns in _inner_namespaces(entry):
                if inner_ns in wanted:
                    groups.setdefault(inner_ns, []).append(entry)
    return groups


def _inner_namespaces(entry: dict) -> list[str]:
    inner = entry.get("o", {}).get("applyOps") if isinstance(entry.get("o"), dict) else None
    if not isinstance(inner, list):
        return []
    found: list[str] = []
    for op in inner:
        if isinstance(op, dict):
            for ns in [op.get("ns"), *_inner_namespaces(op)]:
                if isinstance(ns, str) and ns not in found:
                    found.append(ns)
    return found
