"""Which partition a user is in, and which daemons serve which partitions.

``partition_of`` is the data path's own (``chat.partitions``) on the even
slot map that ``db.init`` lays out for ``CHAT_PARTITIONS``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from chat.partitions import SlotMap, lock_name


@functools.cache
def _even(partitions: int) -> SlotMap:
    return SlotMap.even(partitions)


def leader_of(partition: int, hosts: int) -> int:
    """The host (its index) whose API the edge sends partition ``partition``'s requests to first."""
    return partition % hosts


def leads_rule(host: int, hosts: int) -> str:
    """``CHAT_WRITER_LEADS`` of host ``host``: the partitions ``leader_of`` gives it, also those a grow adds."""
    return f"%{hosts}={host}"


def partition_of(user: str, partitions: int) -> int:
    return _even(partitions).partition_of(user)


@dataclass(frozen=True)
class ClusterDaemon:
    """Where one daemon of the cluster runs, and the partitions it serves."""

    host: str  # namespace
    address: str
    index: int  # on its host: listens on 8100 + index
    port: int
    partitions: tuple[int, ...]  # served; every partition when the data path is not partitioned
    rule: str = ""  # its CHAT_DAEMON_PARTITIONS (%N=R): the partitions a grow adds are served by the same rule

    @property
    def name(self) -> str:
        return f"{self.host}/daemon_{self.index}"

    def serves(self, partition: int) -> bool:
        """Whether it serves ``partition``, one of today's or one a grow adds (by its rule)."""
        if not self.rule:
            return partition in self.partitions
        modulus, remainder = (int(x) for x in self.rule[1:].split("="))
        return partition % modulus == remainder


def daemon_partitions(index: int, daemons_per_host: int, partitions: int) -> tuple[int, ...]:
    """Daemon ``index`` of every host serves the partitions k with k = index (mod min(P, daemons per host)),
    today's and those a grow adds (its rule, ``ClusterDaemon.rule``).

    Every host holds every partition (each on at least one of its daemons), so
    a host killed leaves each partition served by the others; each daemon
    decodes 1 / min(P, D) of the stream."""
    if partitions < 1 or daemons_per_host < 1:
        raise ValueError("partitions and daemons per host must be at least 1")
    if not 0 <= index < daemons_per_host:
        raise ValueError(f"daemon index {index} outside 0..{daemons_per_host - 1}")
    groups = min(partitions, daemons_per_host)
    return tuple(k for k in range(partitions) if k % groups == index % groups)


def assign(hosts: list[tuple[str, str]], daemons_per_host: int, partitions: int, port_base: int) -> list[ClusterDaemon]:
    """``hosts``: (namespace, address) each. Fails if a partition would be served on fewer than two hosts."""
    groups = min(partitions, daemons_per_host)
    daemons = [ClusterDaemon(ns, addr, d, port_base + d, daemon_partitions(d, daemons_per_host, partitions),
                      f"%{groups}={d % groups}")
               for ns, addr in hosts for d in range(daemons_per_host)]
    for k in range(partitions):
        serving_hosts = {d.host for d in daemons if k in d.partitions}
        if len(serving_hosts) < 2:
            raise ValueError(f"partition {k} is served on {len(serving_hosts)} host(s): at least 2 are needed")
    return daemons


def serving(daemons: list[ClusterDaemon], partition: int) -> list[ClusterDaemon]:
    return [d for d in daemons if partition in d.partitions]


def writer_lock_names(partition: int) -> tuple[str, str]:
    """The MySQL named locks of a partition's writer: (the lock, the queue to it).

    Partition 0 keeps the unpartitioned names (writer/mysql_steps.py), so a
    stall of partition 0 also stalls today's single writer."""
    return lock_name(partition), lock_name(partition) + ".next"
