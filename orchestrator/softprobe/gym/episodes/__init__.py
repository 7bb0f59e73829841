"""The local host, split by concern: configuration, episode registry and lifecycle, admission
and the warm pool, checkpoints, forking, and the records on disk."""
