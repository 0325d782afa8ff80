"""The Kafka shard log's snapshots: restoring one at open, writing one now and then, trimming.

Theory of operation (the decisions are in `specs/kafka.md`): a shard owner that is caught up
writes a snapshot of its shard's state every `snapshot_interval_ms`, where the snapshot
topics exist. A snapshot is written a bounded number of bytes a tick: each tick's chunks go
into that tick's Kafka transaction (`LogWriter.extra`), and once every chunk is committed the
manifest follows, naming the chunks' offsets and the command offset the state covers. A
transaction holding snapshot records that does not commit abandons the snapshot (never
retried: whatever refused it must not hold back the shard's own records). Once a newer
snapshot is complete, what no restore can need is deleted: the chunks of older snapshots and
the commands the older of the two newest covers, never an open obligation's Admission (the
Recovery Floor). A fresh store restores the newest snapshot at open instead of folding the
partition from offset 0.

`LogSnapshots` owns every piece of that state; `adapters.kafka.log.KafkaLog` asks it at open
(`restore`, `opened`), per tick (`running`, `due`, `step`, `finish`) and at close.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import msgspec
from confluent_kafka import TopicPartition

from nereus.adapters.kafka.log_writer import LogWriter
from nereus.adapters.kafka.snapshots import (
    MANIFEST_KEY,
    SnapshotManifest,
    SnapshotRun,
    manifests_topic,
    restore_snapshot,
    snapshots_topic,
)
from nereus.kernel.model import Obligation, Table
from nereus.runtime.log import Logger
from nereus.runtime.metrics import Metrics
from nereus.storage.errors import StoreError
from nereus.storage.store import ShardStore

SNAPSHOT_WRITTEN_AT = "nereus_snapshot_last_completed_seconds"
SNAPSHOT_BYTES = "nereus_snapshot_bytes"
SNAPSHOT_ROWS = "nereus_snapshot_rows"
RESTORE_SECONDS = "nereus_snapshot_restore_seconds"
RESTORE_BYTES = "nereus_snapshot_restore_bytes"
TRIMMED_OFFSET = "nereus_commands_trimmed_below_offset"


class LogSnapshots:
    """The snapshots of one shard log (see the module docstring)."""

    def __init__(
        self,
        store: ShardStore,
        config: Any,  # adapters.kafka.log.KafkaLogConfig (which imports this module)
        writer: LogWriter,
        *,
        metrics: Metrics,
        log: Logger,
    ) -> None:
        self.store = store
        self.config = config
        self._writer = writer
        self.metrics = metrics
        self.log = log
        self.on = False  # the snapshot topics exist
        self.admin: Any = None
        self.common_settings: dict[str, Any] = {}
        self._run: SnapshotRun | None = None
        self._offsets: list[int] = []
        self._manifest: SnapshotManifest | None = None  # written, not yet committed
        self._started = 0.0
        self._done_at = time.monotonic()  # the first one waits a whole interval
        self.last: SnapshotManifest | None = None

    def opened(self, admin: Any, on: bool, newest: SnapshotManifest | None) -> None:
        """The log opened: its admin client, whether the snapshot topics exist, and the
        newest complete snapshot there (the older of the two the next snapshot keeps, unless
        one was restored)."""
        self.admin = admin
        self.on = on
        if self.last is None:
            self.last = newest

    # Restoring ----------------------------------------------------------------------------

    def restore(self, manifest: SnapshotManifest | None, low: int) -> bool:
        """Restore the fresh store from `manifest`, the shard's newest snapshot, if there is
        one; the fold then resumes after the offset it covers. A snapshot that cannot be
        restored is refused where the log cannot replace it (its start was deleted), and
        passed over (False: fold from offset 0) where it can."""
        c = self.config
        if manifest is None:
            return False
        if manifest.covered_offset < low - 1:
            raise StoreError(
                self.store.path,
                f"{c.topic}[{c.partition}] starts at offset {low}, but its newest snapshot "
                f"({manifest.snapshot_id}) covers offsets up to {manifest.covered_offset} "
                "only: the records between were deleted",
            )
        started = time.monotonic()
        try:
            restore_snapshot(self.store, self.common_settings, manifest)
        except StoreError as exc:
            if low > 0:
                raise
            self.log.warning(
                "snapshot_restore_failed",
                partition=c.partition,
                snapshot_id=manifest.snapshot_id,
                error=str(exc),
            )
            return False
        self.last = manifest
        seconds = round(time.monotonic() - started, 3)
        self.metrics.set(RESTORE_SECONDS, seconds)
        self.metrics.set(RESTORE_BYTES, manifest.transfer.bytes)
        self.log.info(
            "snapshot_restored",
            partition=c.partition,
            snapshot_id=manifest.snapshot_id,
            covered_offset=manifest.covered_offset,
            position=manifest.transfer.position,
            rows=manifest.transfer.rows,
            bytes=manifest.transfer.bytes,
            seconds=seconds,
        )
        return True

    # Writing ------------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._run is not None

    def due(self, caught_up: bool) -> bool:
        return (
            self.on
            and self._run is None
            and caught_up
            and time.monotonic() - self._done_at >= self.config.snapshot_interval_ms / 1000
        )

    def step(self, now_ms: int, caught_up: bool) -> bool:
        """Put the running snapshot's next records into this tick's transaction (starting
        one when due): its chunks, a bounded number of bytes a tick, then, once they are all
        committed, its manifest. True if any were put."""
        c = self.config
        if self._run is None:
            if not self.due(caught_up):
                return False
            self._run = SnapshotRun(self.store, c.topic, c.partition, c.snapshot_chunk_bytes)
            self._offsets = []
            self._started = time.monotonic()
        run = self._run
        if not run.exhausted():
            chunks = snapshots_topic(c.topic)
            for key, value in run.take(c.snapshot_bytes_per_tick):
                self._writer.extra.append((chunks, c.partition, key, value))
            return True
        manifest = run.manifest(min(self._offsets), max(self._offsets), now_ms)
        self._manifest = manifest
        value = msgspec.msgpack.encode(manifest)
        self._writer.extra.append((manifests_topic(c.topic), c.partition, MANIFEST_KEY, value))
        return True

    def finish(self, sent: bool) -> None:
        """After the tick's transaction: the snapshot records `step` put (if `sent`) were
        committed, unless the writer still holds them."""
        if not sent:
            return
        if self._writer.extra:
            self._abandoned()
        else:
            self._committed()

    def _committed(self) -> None:
        """The transaction holding this tick's snapshot records committed."""
        manifest, self._manifest = self._manifest, None
        if manifest is None:
            self._offsets.extend(self._writer.extra_offsets)
            return
        self._done()
        previous, self.last = self.last, manifest
        self.metrics.set(SNAPSHOT_WRITTEN_AT, manifest.written_at_ms / 1000)
        self.metrics.set(SNAPSHOT_BYTES, manifest.transfer.bytes)
        self.metrics.set(SNAPSHOT_ROWS, manifest.transfer.rows)
        self.log.info(
            "snapshot_written",
            partition=self.config.partition,
            snapshot_id=manifest.snapshot_id,
            covered_offset=manifest.covered_offset,
            position=manifest.transfer.position,
            chunks=manifest.transfer.chunks,
            bytes=manifest.transfer.bytes,
            seconds=round(time.monotonic() - self._started, 3),
        )
        if previous is not None and self.config.trim_after_snapshots:
            self.trim(previous)

    def _abandoned(self) -> None:
        """A transaction holding snapshot records did not commit. The snapshot is dropped,
        not retried: whatever refused it (a record over the topic's limit, say) must never
        hold back the shard's own records, which are written again without it. The next
        one is tried an interval later."""
        self._writer.extra = []
        self.log.warning("snapshot_abandoned", partition=self.config.partition)
        self.metrics.inc("nereus_snapshots_abandoned_total")
        self._done()

    def _done(self) -> None:
        if self._run is not None:
            self._run.close()
            self._run = None
        self._manifest = None
        self._done_at = time.monotonic()

    def close(self) -> None:
        self._done()

    # Trimming -----------------------------------------------------------------------------

    def trim(self, previous: SnapshotManifest) -> None:
        """Delete the records no restore can need once a newer snapshot than `previous` is
        complete: the chunks before `previous`'s, and the commands up to the offset it
        covers, unless an open obligation was admitted at or before its position (the
        Recovery Floor: the Admission is the evidence of an attempt that may be at the
        destination). Asynchronous: the outcome is logged."""
        c = self.config
        cuts = [TopicPartition(snapshots_topic(c.topic), c.partition, previous.first_chunk_offset)]
        oldest = oldest_open_obligation(self.store)
        floor = None if oldest is None else oldest.admitted_position
        if floor is None or floor > previous.transfer.position:
            cuts.append(TopicPartition(c.topic, c.partition, previous.covered_offset + 1))
        else:
            self.log.info(
                "commands_trim_held",
                partition=c.partition,
                admission_position=floor,
                snapshot_position=previous.transfer.position,
            )
        for tp, future in self.admin.delete_records(cuts).items():
            future.add_done_callback(self._trimmed_callback(tp))

    def _trimmed_callback(self, tp: TopicPartition) -> Callable[[Any], None]:
        def done(future: Any) -> None:
            error = future.exception()
            if error is not None:
                self.log.warning(
                    "records_trim_failed", topic=tp.topic, partition=tp.partition, error=str(error)
                )
                return
            self.log.info(
                "records_trimmed", topic=tp.topic, partition=tp.partition, below=tp.offset
            )
            if tp.topic == self.config.topic:
                self.metrics.set(TRIMMED_OFFSET, tp.offset)

        return done


def oldest_open_obligation(store: ShardStore) -> Obligation | None:
    """The open obligation admitted first (at the lowest position, so also the earliest
    broker time), or None."""
    with store.read() as view:
        open_ = [o for _, o in view.items(Table.OBLIGATIONS) if isinstance(o, Obligation)]
    return min(open_, key=_admitted_position, default=None)


def _admitted_position(obligation: Obligation) -> int:
    return obligation.admitted_position
