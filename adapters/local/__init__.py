"""The embedded default's edges: the one-shard library (`embedded`) and the local destination,
topics kept in LMDB beside the shard (`destination`)."""
