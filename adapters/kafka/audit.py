"""An auditor's rebuild of one shard from Kafka alone: its newest snapshot, then the commands
after it, folded into a scratch store (`nereus replay --kafka`).

Theory of operation: nothing here writes to Kafka or joins the shards' group, so an audit
never fences or disturbs the owner. The snapshot is restored as a new owner would restore it
(its digest checked); without one, the partition must still start at offset 0. The commands
are read with `read_committed` up to the high watermark found at the start, and given
positions by the owners' rule (`specs/kafka.md`): each committed record that is an envelope
takes the next position, one that is not takes none. The fold is `ShardStore.apply` on the
scratch store, as `replay.disk` does, so memory stays bounded whatever the shard's size.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import msgspec
from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME, TopicPartition

from nereus.adapters.kafka.snapshots import (
    SnapshotManifest,
    latest_manifest,
    read_until,
    reader,
    restore_snapshot,
)
from nereus.adapters.kafka.wire import decode_envelope, watermarks
from nereus.kernel.config import KernelConfig
from nereus.kernel.effects import EntryOutcome
from nereus.kernel.records import LogEntry
from nereus.replay.disk import SCRATCH
from nereus.replay.fold import ReplayResult, result_of
from nereus.storage.errors import StoreError
from nereus.storage.request import STATE_ONLY
from nereus.storage.store import ShardStore

BATCH_ENTRIES = 2_000


class KafkaAudit(msgspec.Struct, frozen=True):
    """What the rebuild started from and read: the snapshot (None: offset 0), the offsets
    folded after it, and the records that got no position."""

    snapshot: SnapshotManifest | None
    first_offset: int
    last_offset: int
    skipped: int


def rebuild(
    settings: dict[str, Any],
    topic: str,
    partition: int,
    scratch: str,
    *,
    config: KernelConfig | None = None,
    on_entry: Callable[[int], None] | None = None,
    timeout_s: float = 120.0,
) -> tuple[ShardStore, ReplayResult, KafkaAudit]:
    """Shard `partition` of the commands topic `topic`, rebuilt into a new store at
    `scratch`. The caller reads the state, then closes the store and removes the directory."""
    manifest = latest_manifest(settings, topic, partition, timeout_s)
    if manifest is not None:
        config = manifest.transfer.config
    store = ShardStore.open(
        scratch,
        shard_id=f"kafka:{topic}:{partition}",
        config=config or KernelConfig(),
        options=SCRATCH,
    )
    try:
        consumer = reader(settings, f"nereus-audit-{partition}")
        try:
            tp = TopicPartition(topic, partition)
            low, high = watermarks(consumer, tp, timeout_s)
            start = 0
            if manifest is not None:
                if manifest.covered_offset < low - 1:
                    raise StoreError(
                        f"{topic}[{partition}]",
                        f"the partition starts at offset {low}, but its newest snapshot covers "
                        f"offsets up to {manifest.covered_offset} only",
                    )
                restore_snapshot(store, settings, manifest, timeout_s)
                start = manifest.covered_offset + 1
            elif low > 0:
                raise StoreError(
                    f"{topic}[{partition}]",
                    f"the partition starts at offset {low} and no snapshot covers the "
                    "records before it: positions cannot be counted",
                )
            counts: Counter[str] = Counter()
            folded = skipped = 0
            first = TopicPartition(topic, partition, start)
            entries = _entries(consumer, first, high - 1, store.meta.position, timeout_s)
            batch: list[LogEntry] = []
            for entry in entries:
                if entry is None:
                    skipped += 1
                    continue
                batch.append(entry)
                if len(batch) >= BATCH_ENTRIES:
                    folded += _apply(store, batch, counts, on_entry)
                    batch = []
            folded += _apply(store, batch, counts, on_entry)
        finally:
            consumer.close()
        with store.state_view() as state:
            result = result_of(state, folded, counts)
    except BaseException:
        store.close()
        raise
    return store, result, KafkaAudit(manifest, start, high - 1, skipped)


def _entries(
    consumer: Any, start: TopicPartition, last: int, position: int, timeout_s: float
) -> Iterator[LogEntry | None]:
    """The log entries from `start` (a partition and offset) to offset `last`, positions
    counted on from `position` (None for a record that is not an envelope: it takes no
    position)."""
    if last < start.offset:
        return
    tp = start
    for m in read_until(consumer, start, last, timeout_s):
        ts_type, ts = m.timestamp()
        if ts_type != TIMESTAMP_LOG_APPEND_TIME:
            raise StoreError(
                f"{tp.topic}[{tp.partition}]",
                f"offset {m.offset()} has no LogAppendTime timestamp",
            )
        try:
            envelope = decode_envelope(m.value() or b"")
        except msgspec.DecodeError:
            yield None
            continue
        position += 1
        yield LogEntry(position, ts, envelope.record)


def _apply(
    store: ShardStore,
    batch: list[LogEntry],
    counts: Counter[str],
    on_entry: Callable[[int], None] | None,
) -> int:
    if not batch:
        return 0
    for entry, effects in store.apply(batch, STATE_ONLY):
        for effect in effects:
            if isinstance(effect, EntryOutcome):
                counts[str(effect.code)] += 1
        if on_entry is not None:
            on_entry(entry.position)
    return len(batch)
