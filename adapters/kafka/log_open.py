"""Opening a Kafka shard log: which store may follow the partition, and where the fold resumes.

Theory of operation (the decisions are in `specs/kafka.md`): the shard's LMDB store records
the offset of the last record it folded (`storage.schema.LogSource`, written with each fold),
so a restarted owner resumes right after it. `folded_offset_of` refuses a store that holds
an embedded log or follows another partition. `resume_offset` decides where reading starts,
given the partition's first offset and the shard's newest snapshot: a fresh store restores
the snapshot (or folds from offset 0 where there is none and nothing was deleted); a store
that folded up to a point the partition has since been trimmed past is replaced by the
snapshot, which must cover the gap; anything else is refused, naming the offsets.
`check_obligation_ages` refuses a shard whose oldest open obligation is older than the
commands topic keeps records. The consumer reads committed records only, by assignment,
never committing offsets to Kafka: positions live in LMDB.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer

from nereus.adapters.kafka.log_snapshots import LogSnapshots, oldest_open_obligation
from nereus.adapters.kafka.snapshots import SnapshotManifest, manifests_topic
from nereus.adapters.kafka.topics import configured_retention_ms, topic_config
from nereus.runtime.log import Logger
from nereus.storage.errors import StoreError
from nereus.storage.store import ShardStore


def folded_offset_of(store: ShardStore, config: Any) -> int:
    """The offset of the last record `store` folded from the configured partition (-1:
    none); a store that cannot follow it is refused. `config`: a `KafkaLogConfig`."""
    c = config
    source = store.source
    if source is None:
        if store.meta.position != 0:
            raise StoreError(store.path, "holds an embedded shard log; it cannot follow a topic")
        return -1
    if (source.topic, source.partition) != (c.topic, c.partition):
        raise StoreError(
            store.path,
            f"follows {source.topic}[{source.partition}], not {c.topic}[{c.partition}]",
        )
    return source.last_offset


def new_consumer(common: dict[str, Any], config: Any) -> Any:
    """The shard log's consumer: assigned, never subscribed nor committed with."""
    return Consumer(
        {
            **common,
            "client.id": f"nereus-shardlog-{config.partition}",
            # Assigned, never subscribed nor committed with: positions live in LMDB.
            "group.id": f"nereus-shardlog-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "auto.offset.reset": "error",
            "fetch.wait.max.ms": 100,
        }
    )


def resume_offset(
    store: ShardStore,
    config: Any,
    *,
    snapshots: LogSnapshots,
    folded_offset: int,
    manifest: SnapshotManifest | None,
    low: int,
    log: Logger,
) -> tuple[int, int]:
    """Where the fold resumes (the offset to read from, and the offset then counted as
    folded), given the offset folded so far, the shard's newest snapshot and the offset its
    partition now starts at (`low`). See the module docstring."""
    c = config
    start = folded_offset + 1
    if start == 0:
        if snapshots.restore(manifest, low):
            assert manifest is not None
            return manifest.covered_offset + 1, manifest.covered_offset
        if low > 0:
            raise StoreError(
                store.path,
                f"{c.topic}[{c.partition}] starts at offset {low}, not 0 (retention "
                "deleted records), and no snapshot in "
                f"{manifests_topic(c.topic)}[{c.partition}] covers offset {low - 1}: "
                "shard log positions cannot be counted from here",
            )
        # int(): mypyc type-checks this module in the build's own environment, where
        # confluent_kafka is not installed and its constants are Any.
        return int(OFFSET_BEGINNING), folded_offset
    if start >= low:
        return start, folded_offset
    if manifest is None or manifest.covered_offset < low - 1:
        newest = (
            "no snapshot"
            if manifest is None
            else f"the newest snapshot covers offsets up to {manifest.covered_offset}"
        )
        raise StoreError(
            store.path,
            f"this store folded {c.topic}[{c.partition}] up to offset {start - 1}, but the "
            f"partition now starts at offset {low}, and {newest}: the records between "
            "cannot be folded",
        )
    log.warning(
        "store_replaced_by_snapshot",
        partition=c.partition,
        folded_offset=start - 1,
        partition_start=low,
        snapshot_id=manifest.snapshot_id,
        covered_offset=manifest.covered_offset,
    )
    store.discard_state()
    snapshots.restore(manifest, low)  # low > 0: a failure raises
    return manifest.covered_offset + 1, manifest.covered_offset


def check_obligation_ages(store: ShardStore, config: Any, admin: Any) -> None:
    """Where the commands topic has a time retention of its own, refuse a shard whose
    oldest open obligation is older than it: that obligation's Admission, the evidence
    of an attempt that may be at the destination, is deleted or about to be."""
    c = config
    retention_ms = configured_retention_ms(topic_config(admin, c.topic, c.init_timeout_s))
    oldest = oldest_open_obligation(store) if retention_ms >= 0 else None
    if oldest is None:
        return
    age_ms = int(time.time() * 1000) - oldest.admitted_at_ms
    if age_ms >= retention_ms:
        raise StoreError(
            store.path,
            f"an open obligation was admitted {age_ms} ms ago, and {c.topic} keeps records "
            f"for retention.ms={retention_ms}: its Admission (the evidence of an attempt "
            "that may be at the destination) is no longer certain to be readable; raise "
            "the topic's retention.ms above that age (or -1) and settle the obligation",
        )
