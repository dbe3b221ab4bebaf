"""The system as a multi-host cluster in Linux network namespaces (docs/cluster.md)."""
