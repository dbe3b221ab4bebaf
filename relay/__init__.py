"""The host's oplog relay: one tail of the oplog, shared by the host's daemons."""
