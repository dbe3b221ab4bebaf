"""The sentence that opens each figure of docs/benchmarks.md: when, at which commit and on
what it was measured, and which processes of the system ran."""

from __future__ import annotations


def measured_on(m: dict, beside: str = "the load generators", servers_also: str = "") -> str:
    """When, at which commit, on what a figure was measured (``m``: a result's ``machine``);
    ``beside``: what shared the cores with the system; ``servers_also``: backing servers
    past MongoDB's stand-in and MariaDB."""
    return (f"Measured {m['date']} at commit {m['commit']}, on {m['cores']} cores that every process shares with"
            f" {beside}, {m['ram_gib']} GiB RAM; {m['mongo']}, MariaDB {m['mysql']}{servers_also}.")


def as_deployed(shape: dict, also: str = "") -> str:
    """The system's processes in a run deployed as `make run` deploys it (``shape``: a result's
    ``deployed``); ``also``: what ran beside the API processes and the daemons."""
    apis = f"{shape.get('apis', '?')} API processes writing through the writer process"
    daemons = f"{shape.get('daemons', '?')} daemons tailing the oplog through the relay process"
    processes = f"{apis}, {daemons}, and {also}" if also else f"{apis} and {daemons}"
    return f"As `make run` deploys it: {processes}."


def scenario_provenance(r: dict, beside: str = "the load generators", servers_also: str = "", also: str = "") -> str:
    """The italic line under a scenario's heading: measured on, and deployed as."""
    return f"_{measured_on(r['machine'], beside, servers_also)} {as_deployed(r.get('deployed', {}), also)}_"
