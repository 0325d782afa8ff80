"""The console's reads in Kafka mode: the shards this process owns, each read under its lock.

Theory of operation: `service.inspect_store.StoreInspection` reads shard stores; here each
owned shard's access takes the shard's lock (which its tick holds while it works, and a
rebalance while it closes the shard), so a console read never touches a closing store, and
waits at most one tick. A shard's snapshot age is its newest manifest's: the time since the
last snapshot this owner wrote or restored from.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from nereus.adapters.kafka.ownership import OwnedShard, ShardOwnership
from nereus.service.inspect_store import Access, Shard, StoreInspection


def kafka_inspection(ownership: ShardOwnership, process_id: str) -> StoreInspection:
    def shards() -> Mapping[int, Access]:
        return {p: _locked(shard) for p, shard in ownership.snapshot().items()}

    def snapshot_age_s(partition: int) -> float | None:
        shard = ownership.snapshot().get(partition)
        last = None if shard is None else shard.log.snapshots.last
        if last is None:
            return None
        return max(0.0, time.time() - last.written_at_ms / 1000)

    return StoreInspection(shards, owner=f"process {process_id}", snapshot_age_s=snapshot_age_s)


def _locked(shard: OwnedShard) -> Access:
    @contextmanager
    def access() -> Iterator[Shard | None]:
        with shard.lock:
            yield None if shard.closed else (shard.store, shard.runtime)

    return access
