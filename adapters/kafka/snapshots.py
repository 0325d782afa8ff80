"""Shard snapshots through Kafka: a shard's state written as chunk records and a manifest,
and restored from them into an empty store (`specs/kafka.md`, "Snapshots through Kafka").

Theory of operation: partition p of `<commands>.snapshots` holds shard p's chunks (each
record one `storage.transfer` chunk, keyed `<snapshot id>:<chunk index>`), and partition p
of `<commands>.manifests` (compacted, keyed by nothing but the shard) its manifests. A
snapshot is written chunk by chunk in transactions of the shard's transactional producer, a
bounded number of bytes each, and its manifest in the transaction after the last chunk, so
a reader with `read_committed` sees a manifest only once all its chunks are committed, and
never anything of a fenced producer's transactions. The manifest names the commands offset
the state covers and where its chunks are, so a restore reads exactly those records: it
finds the newest manifest in the small manifests partition, reads the chunks from the
first offset to the last, checks each chunk's key, and imports them (`StateImport`, which
checks the whole against the digest the writer recorded).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from typing import Any, Final

import msgspec
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from nereus.adapters.kafka.wire import watermarks
from nereus.storage.errors import StoreError
from nereus.storage.store import ShardStore
from nereus.storage.transfer import (
    DEFAULT_CHUNK_BYTES,
    StateExport,
    StateImport,
    TransferManifest,
    export_state,
)

MANIFEST_KEY: Final = b"manifest"


def snapshots_topic(commands_topic: str) -> str:
    return f"{commands_topic}.snapshots"


def manifests_topic(commands_topic: str) -> str:
    return f"{commands_topic}.manifests"


class SnapshotManifest(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """`covered_offset`: the last commands offset folded into the state (-1: none); the
    chunks are the records of `snapshots_topic(topic)` partition `partition` from
    `first_chunk_offset` to `last_chunk_offset` whose keys name `snapshot_id`."""

    snapshot_id: str
    topic: str
    partition: int
    covered_offset: int
    first_chunk_offset: int
    last_chunk_offset: int
    written_at_ms: int
    transfer: TransferManifest


_manifest_decoder = msgspec.msgpack.Decoder(SnapshotManifest)


def chunk_key(snapshot_id: str, index: int) -> bytes:
    return f"{snapshot_id}:{index}".encode()


class SnapshotRun:
    """One snapshot being written: `take` hands out its chunk records in order, a bounded
    number of bytes at a time; after the last, `manifest` (given the offsets the chunks were
    committed at). `close` lets go of the store's read snapshot."""

    def __init__(self, store: ShardStore, topic: str, partition: int, chunk_bytes: int) -> None:
        self.snapshot_id = uuid.uuid4().hex
        self.topic = topic
        self.partition = partition
        self._stack = ExitStack()
        self._export: StateExport = self._stack.enter_context(export_state(store, chunk_bytes))
        source = self._export.source
        if source is not None and (source.topic, source.partition) != (topic, partition):
            self.close()
            raise ValueError(f"the store follows {source.topic}[{source.partition}]")
        self.covered_offset = -1 if source is None else source.last_offset
        self._chunks: Iterator[bytes] = self._export.chunks()
        self._index = 0
        self._next: bytes | None = next(self._chunks, None)

    def exhausted(self) -> bool:
        return self._next is None

    def take(self, max_bytes: int) -> list[tuple[bytes, bytes]]:
        """(key, value) of the next chunks: at least one, more while under `max_bytes`."""
        out: list[tuple[bytes, bytes]] = []
        size = 0
        while self._next is not None and (not out or size + len(self._next) <= max_bytes):
            out.append((chunk_key(self.snapshot_id, self._index), self._next))
            size += len(self._next)
            self._index += 1
            self._next = next(self._chunks, None)
        return out

    def manifest(self, first_offset: int, last_offset: int, now_ms: int) -> SnapshotManifest:
        return SnapshotManifest(
            snapshot_id=self.snapshot_id,
            topic=self.topic,
            partition=self.partition,
            covered_offset=self.covered_offset,
            first_chunk_offset=first_offset,
            last_chunk_offset=last_offset,
            written_at_ms=now_ms,
            transfer=self._export.manifest(),
        )

    def close(self) -> None:
        self._stack.close()


def publish_snapshot(
    store: ShardStore,
    producer: Any,
    topic: str,
    partition: int,
    *,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    bytes_per_transaction: int = 16 * 1024 * 1024,
    timeout_s: float = 30.0,
    clock_ms: Callable[[], int] = lambda: int(time.time() * 1000),
) -> SnapshotManifest:
    """Write the store's state as one snapshot through `producer` (transactional, its
    transactions initialised), one transaction per `bytes_per_transaction` of chunks, then
    the manifest. Blocks until done; a fenced producer raises `KafkaException`."""
    offsets: list[int] = []
    failures: list[str] = []

    def on_delivery(err: Any, msg: Any) -> None:
        if err is not None:
            failures.append(str(err))
        else:
            offsets.append(msg.offset())

    run = SnapshotRun(store, topic, partition, chunk_bytes)
    chunks_topic = snapshots_topic(topic)
    try:
        while not run.exhausted():
            producer.begin_transaction()
            for key, value in run.take(bytes_per_transaction):
                producer.produce(
                    chunks_topic, value=value, key=key, partition=partition, on_delivery=on_delivery
                )
            producer.commit_transaction(timeout_s)
        if failures or not offsets:
            raise RuntimeError(f"snapshot chunks were not all delivered: {failures[:3]}")
        manifest = run.manifest(min(offsets), max(offsets), clock_ms())
        producer.begin_transaction()
        producer.produce(
            manifests_topic(topic),
            value=msgspec.msgpack.encode(manifest),
            key=MANIFEST_KEY,
            partition=partition,
        )
        producer.commit_transaction(timeout_s)
        return manifest
    finally:
        run.close()


def reader(settings: dict[str, Any], name: str) -> Any:
    return Consumer(
        {
            **settings,
            "client.id": name,
            "group.id": f"{name}-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "auto.offset.reset": "error",
        }
    )


def read_until(
    consumer: Any, tp: TopicPartition, stop_offset: int, timeout_s: float
) -> Iterator[Any]:
    """The committed records of `tp` from its assigned offset through `stop_offset`."""
    consumer.assign([tp])
    deadline = time.monotonic() + timeout_s
    while True:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{tp.topic}[{tp.partition}] not read to {stop_offset} in time")
        m = consumer.poll(0.5)
        if m is None:
            continue
        err = m.error()
        if err is not None:
            if err.code() == KafkaError._PARTITION_EOF:
                return
            raise KafkaException(err)
        yield m
        if m.offset() >= stop_offset:
            return


def latest_manifest(
    settings: dict[str, Any], topic: str, partition: int, timeout_s: float = 30.0
) -> SnapshotManifest | None:
    """The newest committed manifest of the shard, or None."""
    consumer = reader(settings, f"nereus-manifests-{partition}")
    try:
        tp = TopicPartition(manifests_topic(topic), partition)
        if not _exists(consumer, tp.topic, timeout_s):
            return None  # a deployment whose topics predate snapshots: nothing to restore
        low, high = watermarks(consumer, tp, timeout_s)
        if high <= low:
            return None
        newest: SnapshotManifest | None = None
        for m in read_until(
            consumer, TopicPartition(tp.topic, partition, low), high - 1, timeout_s
        ):
            try:
                found = _manifest_decoder.decode(m.value() or b"")
            except msgspec.DecodeError:
                continue  # not a manifest: nothing any reader could restore from
            if newest is None or found.transfer.position >= newest.transfer.position:
                newest = found
        return newest
    finally:
        consumer.close()


def snapshot_topics_exist(consumer: Any, topic: str, timeout_s: float) -> bool:
    """Whether the commands topic `topic` has its snapshot chunks and manifests topics."""
    return all(
        _exists(consumer, name, timeout_s)
        for name in (snapshots_topic(topic), manifests_topic(topic))
    )


def _exists(consumer: Any, topic: str, timeout_s: float) -> bool:
    meta = consumer.list_topics(topic, timeout=timeout_s).topics.get(topic)
    if meta is None or meta.error is None:
        return meta is not None
    if meta.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
        return False
    raise KafkaException(meta.error)


def restore_snapshot(
    store: ShardStore,
    settings: dict[str, Any],
    manifest: SnapshotManifest,
    timeout_s: float = 120.0,
) -> None:
    """Import the snapshot `manifest` names into the empty `store`. Refuses (StoreError)
    when its chunks are no longer all in the topic or do not add up to its state."""
    data_file = store.env.data_file
    consumer = reader(settings, f"nereus-restore-{manifest.partition}")
    try:
        tp = TopicPartition(snapshots_topic(manifest.topic), manifest.partition)
        low, _high = watermarks(consumer, tp, timeout_s)
        if low > manifest.first_chunk_offset:
            raise StoreError(
                data_file,
                f"snapshot {manifest.snapshot_id} starts at {tp.topic}[{tp.partition}] offset "
                f"{manifest.first_chunk_offset}, but the partition now starts at {low}: its "
                "chunks were deleted",
            )
        into = StateImport(store)
        index = 0
        start = TopicPartition(tp.topic, tp.partition, manifest.first_chunk_offset)
        try:
            for m in read_until(consumer, start, manifest.last_chunk_offset, timeout_s):
                if m.key() != chunk_key(manifest.snapshot_id, index):
                    continue  # another snapshot's chunk, interleaved: never this one's
                into.add(m.value() or b"")
                index += 1
            into.finish(manifest.transfer)
        except BaseException:
            into.abandon()
            raise
    finally:
        consumer.close()
