"""The oplog tail and what it hands its consumers, shared by the daemons
(daemon/stream.py) and the host's relay (relay/): it imports neither."""
