"""Starts the real servers and processes: a private MariaDB and FerretDB, the
writer, relay, API and daemons on free ports. Shared by the tests, the
benchmarks (loadtest/) and the cluster (cluster/); it imports none of them."""
