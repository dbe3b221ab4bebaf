"""The benchmarks. One module or folder per measured question, beside the
tools they share:

- ``bench``: `make bench` / `make bench-full`, every scenario and one report;
  ``wsload``, ``replay``, ``hotpath``, ``hole_fill``, ``startup``,
  ``restart_reconnect``, ``capacity``: one question each.
- ``million/``, ``peers/``, ``cluster/``: the scenarios of several modules
  (a million connections; beside Centrifugo; the cluster under faults).
- ``clients/``: the load clients and the WebSocket bytes they share.
- ``common/``: measuring tools (ab, machine, scrape, probe, log scan), the
  A/B of revisions (compare, compare_tiers) and where results go.
- ``report/``: report.md, the plots and docs/benchmarks.md's tables.
- ``results/``: the published figures, indexed in its README.md.
"""
