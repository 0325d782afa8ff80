"""The console's reads in Kafka mode: the shards this process owns, each read under its lock.

Theory of operation: `service.inspect_store.StoreInspection` reads shard stores; here each
owned shard's access takes the shard's lock (which its tick holds while it works, and a
rebalance while it closes the shard), so a console read never touches a closing store, and
waits at most one tick. A shard's snapshot age is its newest manifest's: the time since the
last snapshot this owner wrote or restored from.

Under `nereus serve --processes N` the shards are spread over the processes behind one port,
and a console page must answer for all of them, as `/metrics` does: `MergedInspection` asks
every sibling the same read over its private port (`Siblings.inspect`, answered by
`answer_sibling`) and merges the answers. An audit runs beside the process that holds the
shard's store, as a child of it (`adapters.http.console.audit`); `MachineAudits` lets any
process start one of any shard and show every process's audits, asking the siblings over
the same port (`audit_start`, `audit_jobs`, answered by each one's own audits).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Final

from nereus.adapters.kafka.ownership import OwnedShard, ShardOwnership
from nereus.adapters.kafka.sibling_audits import AUDIT_CALLS
from nereus.adapters.kafka.siblings import Siblings
from nereus.service.audit_view import AuditPort
from nereus.service.inspect import (
    DeadLetter,
    Delivery,
    Inspection,
    ObligationRow,
    QueueRow,
    ShardHealth,
    Story,
)
from nereus.service.inspect_store import Access, Shard, StoreInspection, merge_rows
from nereus.storage.store import ShardStore


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


# The reads a sibling answers for the console (`Siblings.inspect`), with their answers' types.
CALLS: Final[dict[str, Any]] = {
    "shards": list[ShardHealth],
    "queues": tuple[list[QueueRow], bool],
    "recent_deliveries": list[Delivery],
    "dead_letters": list[DeadLetter],
    "story": Story | None,
    "message_of_attempt": str | None,
    "message_of_txn": str | None,
    "obligations": tuple[list[ObligationRow], bool],
}


def answer_sibling(
    inspection: Inspection, call: str, args: list[Any], audits: AuditPort | None = None
) -> Any:
    """One console read (or audit call) asked by a sibling, answered from the shards owned
    here (and this process's audits)."""
    if call in AUDIT_CALLS and audits is not None:
        return audits.jobs() if call == "audit_jobs" else audits.start(*args)
    if call not in CALLS:
        raise ValueError(f"unknown inspection call {call!r}")
    return getattr(inspection, call)(*args)


class MergedInspection:
    """The console's reads for the whole machine under `--processes`: this process's shards
    and every sibling's, merged as one process holding them all would answer."""

    def __init__(self, local: StoreInspection, siblings: Siblings) -> None:
        self.local = local
        self.siblings = siblings

    def _others(self, call: str, *args: Any) -> list[Any]:
        return self.siblings.inspect(call, list(args), CALLS[call])

    def shard_stores(self) -> Mapping[int, ShardStore]:
        return self.local.shard_stores()  # an audit runs beside the process holding the store

    def shards(self) -> list[ShardHealth]:
        rows = self.local.shards() + [r for part in self._others("shards") for r in part]
        return sorted(rows, key=lambda r: r.shard)

    def queues(self, tenant: str, limit: int) -> tuple[list[QueueRow], bool]:
        parts = [self.local.queues(tenant, limit), *self._others("queues", tenant, limit)]
        merged: dict[str, QueueRow] = {}
        for rows, _ in parts:
            for row in rows:
                merged[row.queue] = merge_rows(merged.get(row.queue), row)
        names = sorted(merged, key=lambda q: q.encode())
        more = any(m for _, m in parts) or len(names) > limit
        return [merged[q] for q in names[:limit]], more

    def recent_deliveries(self, tenant: str, queue: str | None, limit: int) -> list[Delivery]:
        rows = self.local.recent_deliveries(tenant, queue, limit)
        for part in self._others("recent_deliveries", tenant, queue, limit):
            rows.extend(part)
        rows.sort(key=lambda d: d.persisted_at_ms, reverse=True)
        return rows[:limit]

    def dead_letters(self, tenant: str, queue: str | None, limit: int) -> list[DeadLetter]:
        rows = self.local.dead_letters(tenant, queue, limit)
        for part in self._others("dead_letters", tenant, queue, limit):
            rows.extend(part)
        # Owed copies first (no position), then the written ones, newest first.
        rows.sort(key=lambda d: (d.position is not None, -(d.persisted_at_ms or 0)))
        return rows[:limit]

    def story(self, tenant: str, message_id: str) -> Story | None:
        found = self.local.story(tenant, message_id)
        if found is not None:
            return found
        return next((s for s in self._others("story", tenant, message_id) if s), None)

    def message_of_attempt(self, tenant: str, attempt_id: str) -> str | None:
        found = self.local.message_of_attempt(tenant, attempt_id)
        if found is not None:
            return found
        return next((m for m in self._others("message_of_attempt", tenant, attempt_id) if m), None)

    def message_of_txn(self, tenant: str, txn: str) -> str | None:
        found = self.local.message_of_txn(tenant, txn)
        if found is not None:
            return found
        return next((m for m in self._others("message_of_txn", tenant, txn) if m), None)

    def obligations(self, tenant: str | None, limit: int) -> tuple[list[ObligationRow], bool]:
        rows, more = self.local.obligations(tenant, limit)
        for part, part_more in self._others("obligations", tenant, limit):
            rows.extend(part)
            more = more or part_more
        rows.sort(key=lambda r: r.admitted_at_ms)
        return rows[:limit], more or len(rows) > limit
