"""The Kafka-partitioned shard log: one partition of the commands topic is one shard's log.

Theory of operation (the decisions are in `specs/kafka.md`):

* **Records.** Each Kafka record's value is an `Envelope` (`adapters.kafka.wire`): a request
  id, the process to reply to (or None), the kernel `Record`, and for a schedule its payload
  bytes. Client commands go to partition `shard_for(identity)`; an owner's system mutations
  go to its own partition.
* **Positions.** Offsets are not dense (transaction markers take offsets), so the kernel's
  position is the count of committed data records in the partition (read_committed), and
  `persisted_at_ms` is the record's broker timestamp (`LogAppendTime`, checked per record).
  `KafkaLog` folds what it reads into the shard's LMDB store with `ShardStore.apply`, which
  writes the Kafka offset of the last folded record (`storage.schema.LogSource`), the payload
  bytes and the runtime's claim rows in the same transaction. A restarted owner resumes at
  that offset + 1. A record that is not an envelope gets no position (every owner skips it
  the same way).
* **Writes, fencing and the send lease** (`adapters.kafka.log_writer`). System mutations
  (and the replies to the commands just folded, to the replies topic) are produced in one
  Kafka transaction per tick, committed before the fold's LMDB transaction (see `commit`),
  by a producer whose `transactional.id` is tied to the shard, so a new owner fences the old
  one. A fenced or otherwise fatal producer raises `ShardLost`. A send may start only within
  `send_lease_ms` of the start of the last transaction this owner committed.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import msgspec
from confluent_kafka import (
    OFFSET_BEGINNING,
    TIMESTAMP_LOG_APPEND_TIME,
    Consumer,
    KafkaError,
    KafkaException,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient

from nereus.adapters.kafka.log_writer import LogWriter
from nereus.adapters.kafka.snapshots import (
    MANIFEST_KEY,
    SnapshotManifest,
    SnapshotRun,
    latest_manifest,
    manifests_topic,
    restore_snapshot,
    snapshot_topics_exist,
    snapshots_topic,
)
from nereus.adapters.kafka.topics import configured_retention_ms, topic_config
from nereus.adapters.kafka.wire import (
    Envelope,
    Reply,
    checked_payloads,
    decode_envelope,
    watermarks,
)
from nereus.kernel.effects import EntryOutcome, outcomes_of
from nereus.kernel.model import Obligation, Table
from nereus.kernel.records import Appendable, LogEntry, Payload
from nereus.runtime.log import Logger, NullLogger
from nereus.runtime.metrics import Metrics
from nereus.runtime.shardlog import COMMIT_BUCKETS_S, COMMIT_SECONDS, ShardLost
from nereus.storage.errors import StoreError
from nereus.storage.schema import LogSource
from nereus.storage.store import Applied, ShardStore
from nereus.storage.transfer import DEFAULT_CHUNK_BYTES

# Records this owner wrote and folded without decoding them (`LogWriter.written`).
FROM_MEMORY = "nereus_shard_log_folded_from_memory_total"
SNAPSHOT_WRITTEN_AT = "nereus_snapshot_last_completed_seconds"
SNAPSHOT_BYTES = "nereus_snapshot_bytes"
SNAPSHOT_ROWS = "nereus_snapshot_rows"
RESTORE_SECONDS = "nereus_snapshot_restore_seconds"
RESTORE_BYTES = "nereus_snapshot_restore_bytes"
TRIMMED_OFFSET = "nereus_commands_trimmed_below_offset"
LAG_OFFSETS = "nereus_shard_log_lag_offsets"


class KafkaLogConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    bootstrap: str
    topic: str
    partition: int
    replies_topic: str
    # This process's id: replies addressed to it complete locally, without the topic.
    process_id: str
    transactional_id_prefix: str = "nereus-shard"
    # Replies are produced only for commands persisted this recently: an owner catching up
    # on old history does not answer clients that stopped waiting long ago.
    reply_window_ms: int = 60_000
    send_lease_ms: int = 2_000
    proof_interval_ms: int = 1_000
    max_batch_records: int = 1_000
    transaction_timeout_ms: int = 30_000
    init_timeout_s: float = 30.0
    commit_timeout_s: float = 10.0
    retry_backoff_ms: int = 100
    # A snapshot of the shard's state to `<topic>.snapshots` this often once caught up (0:
    # never), its chunks this many bytes a tick (`adapters.kafka.snapshots`). Only where the
    # snapshot topics exist (the service creates them).
    snapshot_interval_ms: int = 600_000
    snapshot_bytes_per_tick: int = 1024 * 1024
    snapshot_chunk_bytes: int = DEFAULT_CHUNK_BYTES
    # After each snapshot, delete what no restore can need: the chunks of snapshots older
    # than the newest two, and the commands before the older of those two (never an open
    # obligation's Admission). False: the topics keep everything.
    trim_after_snapshots: bool = True
    client_config: dict[str, str | int | float | bool] = msgspec.field(default_factory=dict)

    @property
    def transactional_id(self) -> str:
        return f"{self.transactional_id_prefix}.{self.topic}.{self.partition}"


class KafkaLog:
    """A `runtime.shardlog.ShardLog` over one partition of the commands topic."""

    accepts_commands = False

    def __init__(
        self,
        store: ShardStore,
        config: KafkaLogConfig,
        *,
        group_metadata: Callable[[], Any] | None = None,
        on_reply: Callable[[str, Sequence[EntryOutcome]], None] | None = None,
        logger: Logger | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self.store = store
        self.config = config
        self.log = logger or NullLogger()
        self.metrics = metrics or Metrics()
        self._on_reply = on_reply
        # Names this ownership tenure's own records (request ids "<tenure>:<seq>").
        self.tenure = uuid.uuid4().hex[:10]
        self._writer = LogWriter(
            config, self.tenure, group_metadata=group_metadata, metrics=self.metrics, log=self.log
        )
        self._consumer: Any = None
        self._opened = False
        self._buffer: list[Any] = []
        self._folded_offset = -1
        self._catchup_target: int | None = None
        self._caught_up = False
        self._folded_own_seq = 0
        self._local_replies: list[tuple[str, tuple[EntryOutcome, ...]]] = []
        self._undecodable = 0
        self._snapshots_on = False  # the snapshot topics exist
        self._common_settings: dict[str, Any] = {}
        self._snapshot: SnapshotRun | None = None
        self._snapshot_offsets: list[int] = []
        self._snapshot_manifest: SnapshotManifest | None = None  # written, not yet committed
        self._snapshot_started = 0.0
        self._snapshot_done_at = time.monotonic()  # the first one waits a whole interval
        self.last_snapshot: SnapshotManifest | None = None
        self._admin: Any = None
        self.metrics.describe(
            SNAPSHOT_WRITTEN_AT, "gauge", "When the shard's last snapshot was completed (Unix s)."
        )
        self.metrics.describe(SNAPSHOT_BYTES, "gauge", "Bytes of the shard's last snapshot.")
        self.metrics.describe(SNAPSHOT_ROWS, "gauge", "Rows of the shard's last snapshot.")
        self.metrics.describe(
            RESTORE_SECONDS, "gauge", "How long the restore of the shard from a snapshot took."
        )
        self.metrics.describe(RESTORE_BYTES, "gauge", "Bytes of the snapshot the shard restored.")
        self.metrics.describe(
            LAG_OFFSETS,
            "gauge",
            "Offsets of the shard's partition not yet folded (high watermark of the last fetch "
            "minus the next offset to fold; transaction markers count).",
        )
        self.metrics.describe(
            TRIMMED_OFFSET,
            "gauge",
            "The offset below which this owner last deleted records of the shard's partition.",
        )
        self.metrics.describe(
            COMMIT_SECONDS,
            "histogram",
            "Commits of the Kafka shard log: the fold of what was read (LMDB, synced) and the "
            "tick's Kafka transaction.",
        )
        self.metrics.describe(
            FROM_MEMORY,
            "counter",
            "Records this owner wrote, folded from memory when the read reached their offsets.",
        )

    # Opening ------------------------------------------------------------------------------

    def open(self) -> None:
        if self._opened:
            return
        c = self.config
        source = self.store.source
        if source is None:
            if self.store.meta.position != 0:
                raise StoreError(
                    self.store.path, "holds an embedded shard log; it cannot follow a topic"
                )
        elif (source.topic, source.partition) != (c.topic, c.partition):
            raise StoreError(
                self.store.path,
                f"follows {source.topic}[{source.partition}], not {c.topic}[{c.partition}]",
            )
        self._folded_offset = source.last_offset if source is not None else -1
        common: dict[str, Any] = {"bootstrap.servers": c.bootstrap}
        common.update(c.client_config)
        self._common_settings = common
        self._writer.open(common)
        consumer = Consumer(
            {
                **common,
                "client.id": f"nereus-shardlog-{c.partition}",
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
        try:
            low, _high = watermarks(
                consumer, TopicPartition(c.topic, c.partition), c.init_timeout_s
            )
            manifest = latest_manifest(common, c.topic, c.partition, c.init_timeout_s)
            start = self._resume_offset(manifest, low)
            self._admin = AdminClient(dict(common))
            self._check_obligation_ages()
        except BaseException:
            consumer.close()
            raise
        consumer.assign([TopicPartition(c.topic, c.partition, start)])
        self._consumer = consumer
        self._snapshots_on = c.snapshot_interval_ms > 0 and snapshot_topics_exist(
            consumer, c.topic, c.init_timeout_s
        )
        if self.last_snapshot is None:
            # The newest complete snapshot already there is the older of the two the next
            # snapshot keeps.
            self.last_snapshot = manifest
        self._opened = True
        self.log.info(
            "shard_log_opened",
            topic=c.topic,
            partition=c.partition,
            transactional_id=c.transactional_id,
            resume_offset=self._folded_offset + 1,
            applied_position=self.store.meta.position,
            tenure=self.tenure,
        )

    def _resume_offset(self, manifest: SnapshotManifest | None, low: int) -> int:
        """Where the fold resumes, given the shard's newest snapshot and the offset its
        partition now starts at. A fresh store restores the snapshot (or folds from offset
        0 where there is none and nothing was deleted). A store that folded up to a point
        the partition has since been trimmed past (the records it had not folded were
        deleted behind a snapshot) is replaced by the snapshot, which must cover the gap;
        else the shard is refused, naming the offsets."""
        c = self.config
        start = self._folded_offset + 1
        if start == 0:
            if self._restore_snapshot(manifest, low):
                return self._folded_offset + 1
            if low > 0:
                raise StoreError(
                    self.store.path,
                    f"{c.topic}[{c.partition}] starts at offset {low}, not 0 (retention "
                    "deleted records), and no snapshot in "
                    f"{manifests_topic(c.topic)}[{c.partition}] covers offset {low - 1}: "
                    "shard log positions cannot be counted from here",
                )
            # int(): mypyc type-checks this module in the build's own environment, where
            # confluent_kafka is not installed and its constants are Any.
            return int(OFFSET_BEGINNING)
        if start >= low:
            return start
        if manifest is None or manifest.covered_offset < low - 1:
            newest = (
                "no snapshot"
                if manifest is None
                else f"the newest snapshot covers offsets up to {manifest.covered_offset}"
            )
            raise StoreError(
                self.store.path,
                f"this store folded {c.topic}[{c.partition}] up to offset {start - 1}, but the "
                f"partition now starts at offset {low}, and {newest}: the records between "
                "cannot be folded",
            )
        self.log.warning(
            "store_replaced_by_snapshot",
            partition=c.partition,
            folded_offset=start - 1,
            partition_start=low,
            snapshot_id=manifest.snapshot_id,
            covered_offset=manifest.covered_offset,
        )
        self.store.discard_state()
        self._restore_snapshot(manifest, low)  # low > 0: a failure raises
        return self._folded_offset + 1

    def _check_obligation_ages(self) -> None:
        """Where the commands topic has a time retention of its own, refuse a shard whose
        oldest open obligation is older than it: that obligation's Admission, the evidence
        of an attempt that may be at the destination, is deleted or about to be."""
        c = self.config
        retention_ms = configured_retention_ms(topic_config(self._admin, c.topic, c.init_timeout_s))
        oldest = self._oldest_open_obligation() if retention_ms >= 0 else None
        if oldest is None:
            return
        age_ms = int(time.time() * 1000) - oldest.admitted_at_ms
        if age_ms >= retention_ms:
            raise StoreError(
                self.store.path,
                f"an open obligation was admitted {age_ms} ms ago, and {c.topic} keeps records "
                f"for retention.ms={retention_ms}: its Admission (the evidence of an attempt "
                "that may be at the destination) is no longer certain to be readable; raise "
                "the topic's retention.ms above that age (or -1) and settle the obligation",
            )

    def _restore_snapshot(self, manifest: SnapshotManifest | None, low: int) -> bool:
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
            restore_snapshot(self.store, self._common_settings, manifest)
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
        self._folded_offset = manifest.covered_offset
        self.last_snapshot = manifest
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

    # State --------------------------------------------------------------------------------

    def caught_up(self) -> bool:
        if not self._caught_up and self._catchup_target is not None:
            self._caught_up = self._folded_offset >= self._catchup_target
            if self._caught_up:
                self.log.info(
                    "shard_log_caught_up",
                    partition=self.config.partition,
                    applied_position=self.store.meta.position,
                    offset=self._folded_offset,
                )
        return self._caught_up

    def settled(self) -> bool:
        return (
            self.caught_up()
            and not self._writer.unwritten
            and self._folded_own_seq >= self._writer.committed_seq
        )

    def send_allowed(self) -> bool:
        return self._writer.send_allowed()

    def pending(self) -> bool:
        if not self._buffer:
            self._fill(0)
        if self._buffer or self._snapshot is not None or self._snapshot_due():
            return True
        return self._writer.pending(self._caught_up)

    # Reading ------------------------------------------------------------------------------

    def _fill(self, timeout_s: float) -> bool:
        """Move what the consumer has into the buffer, waiting up to `timeout_s` for the
        first record. True if anything (a record or the end of the partition) arrived."""
        first = self._consumer.poll(timeout_s)
        if first is None:
            return False
        room = max(self.config.max_batch_records - len(self._buffer), 1)
        for m in [first, *self._consumer.consume(room, 0)]:
            err = m.error()
            if err is None:
                self._buffer.append(m)
            elif err.code() == KafkaError._PARTITION_EOF:
                if self._catchup_target is None:
                    self._catchup_target = (
                        self._buffer[-1].offset() if self._buffer else self._folded_offset
                    )
            elif err.fatal() or err.code() == KafkaError._AUTO_OFFSET_RESET:
                raise RuntimeError(f"cannot read {self.config.topic}: {err}")
            else:
                self.log.warning("shard_log_read_error", error=str(err))
        return True

    def wait(self, timeout_s: float, wake: threading.Event) -> None:
        deadline = time.monotonic() + timeout_s
        while not wake.is_set():
            left = deadline - time.monotonic()
            if left <= 0 or self._fill(min(left, 0.05)):
                return

    # Folding ------------------------------------------------------------------------------

    def _fold(
        self,
        now_ms: int,
        also: Callable[[Any], None],
        before_commit: Callable[[list[Applied]], None],
    ) -> list[Applied]:
        c = self.config
        batch = self._buffer[: c.max_batch_records]
        del self._buffer[: len(batch)]
        entries: list[LogEntry] = []
        payloads: dict[int, Payload] = {}
        origin: dict[int, Envelope] = {}
        position = self.store.meta.position
        for m in batch:
            ts_type, ts = m.timestamp()
            if ts_type != TIMESTAMP_LOG_APPEND_TIME:
                raise RuntimeError(
                    f"{c.topic}[{c.partition}] offset {m.offset()} has no LogAppendTime "
                    "timestamp: the broker's persistence time is the only time the shard "
                    "log may carry (message.timestamp.type=LogAppendTime)"
                )
            # A record this owner wrote is folded from memory; any other is decoded.
            envelope = self._writer.take_written(m.offset())
            if envelope is not None:
                self.metrics.inc(FROM_MEMORY)
            try:
                if envelope is None:
                    envelope = decode_envelope(m.value() or b"")
            except msgspec.DecodeError as exc:
                self._undecodable += 1
                self.metrics.inc("nereus_shard_log_undecodable_total")
                self.log.warning(
                    "shard_log_record_skipped", offset=m.offset(), error=str(exc)[:200]
                )
                continue
            position += 1
            entries.append(LogEntry(position, ts, envelope.record))
            origin[position] = envelope
            if envelope.payload is not None:
                checked, dropped = checked_payloads(envelope.record, envelope.payload)
                if checked is not None:
                    payloads[position] = checked
                if dropped:
                    self.log.warning("payload_mismatch", position=position, offset=m.offset())

        def replies_then_write(results: list[Applied]) -> None:
            for entry, effects in results:
                envelope = origin[entry.position]
                self._own_folded(envelope.request_id)
                reply_to = envelope.reply_to
                if reply_to is None or entry.persisted_at_ms < now_ms - c.reply_window_ms:
                    continue
                answers = outcomes_of(entry.record, effects)
                if reply_to == c.process_id and self._on_reply is not None:
                    self._local_replies.append((envelope.request_id, answers))
                else:
                    batch = answers if len(answers) > 1 else ()
                    reply = Reply(envelope.request_id, answers[0], batch)
                    self._writer.replies.append((reply_to, reply))
            before_commit(results)

        last_offset = batch[-1].offset()
        source = LogSource("kafka", c.topic, c.partition, last_offset)
        results = self.store.apply(
            entries,
            also=also,
            source=source,
            payloads=payloads,
            before_commit=replies_then_write,
            payloads_checked=True,  # checked_payloads kept only bytes that match
        )
        self._folded_offset = last_offset
        self._writer.forget_written(last_offset)
        self._measure_lag()
        return results

    def _measure_lag(self) -> None:
        """Offsets of the partition not yet folded, from the high watermark the consumer's
        last fetch brought (no round trip)."""
        c = self.config
        try:
            _low, high = self._consumer.get_watermark_offsets(
                TopicPartition(c.topic, c.partition), cached=True
            )
        except KafkaException:
            return
        if high >= 0:
            self.metrics.set(LAG_OFFSETS, max(high - self._folded_offset - 1, 0))

    def _own_folded(self, request_id: str) -> None:
        tenure, _, seq = request_id.partition(":")
        if tenure == self.tenure and seq.isdigit():
            self._folded_own_seq = max(self._folded_own_seq, int(seq))

    # Writing ------------------------------------------------------------------------------

    def commit(
        self,
        items: Sequence[Appendable],
        now_ms: int,
        also: Callable[[Any], None],
    ) -> tuple[list[LogEntry], list[Applied]]:
        """Fold what was read and write the tick's records with the replies to the folded
        commands, in one Kafka transaction committed BEFORE the fold's store transaction:
        a reply is a pure function of the committed log, so it may go out before this
        owner's copy of the fold is durable, and a crash in between only repeats it (a
        restarted owner folds the same entries again and answers again; a reply nobody
        waits for is ignored). The other order could lose replies."""
        started = time.perf_counter()
        if not self._buffer:
            self._fill(0)
        self._writer.unwritten.extend(items)
        sent = self._snapshot_step(now_ms)
        lost: list[ShardLost] = []

        def write(_results: list[Applied]) -> None:
            if self._writer.write_due(self._caught_up):
                failure = self._writer.transact(self._folded_offset)
                if failure is not None:
                    lost.append(failure)  # raised after the fold commits: it is still true

        if self._buffer:
            # Claim rows reach the store with the fold (they only tell a restarted process
            # which claims died with its predecessor).
            results = self._fold(now_ms, also, write)
        else:
            results = []
            write(results)
        local, self._local_replies = self._local_replies, []
        if self._on_reply is not None:
            for request_id, answers in local:
                self._on_reply(request_id, answers)
        if sent:
            if self._writer.extra:
                self._snapshot_abandoned()
            else:
                self._snapshot_committed()
        if lost:
            raise lost[0]
        seconds = time.perf_counter() - started
        self.metrics.observe(COMMIT_SECONDS, seconds, None, COMMIT_BUCKETS_S)
        return [], results

    # Snapshots ----------------------------------------------------------------------------

    def _snapshot_due(self) -> bool:
        c = self.config
        return (
            self._snapshots_on
            and self._snapshot is None
            and self._caught_up
            and time.monotonic() - self._snapshot_done_at >= c.snapshot_interval_ms / 1000
        )

    def _snapshot_step(self, now_ms: int) -> bool:
        """Put the running snapshot's next records into this tick's transaction (starting
        one when due): its chunks, a bounded number of bytes a tick, then, once they are all
        committed, its manifest. True if any were put."""
        c = self.config
        if self._snapshot is None:
            if not self._snapshot_due():
                return False
            self._snapshot = SnapshotRun(self.store, c.topic, c.partition, c.snapshot_chunk_bytes)
            self._snapshot_offsets = []
            self._snapshot_started = time.monotonic()
        run = self._snapshot
        if not run.exhausted():
            chunks = snapshots_topic(c.topic)
            for key, value in run.take(c.snapshot_bytes_per_tick):
                self._writer.extra.append((chunks, c.partition, key, value))
            return True
        offsets = self._snapshot_offsets
        manifest = run.manifest(min(offsets), max(offsets), now_ms)
        self._snapshot_manifest = manifest
        value = msgspec.msgpack.encode(manifest)
        self._writer.extra.append((manifests_topic(c.topic), c.partition, MANIFEST_KEY, value))
        return True

    def _snapshot_committed(self) -> None:
        """The transaction holding this tick's snapshot records committed."""
        manifest, self._snapshot_manifest = self._snapshot_manifest, None
        if manifest is None:
            self._snapshot_offsets.extend(self._writer.extra_offsets)
            return
        self._snapshot_done()
        previous, self.last_snapshot = self.last_snapshot, manifest
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
            seconds=round(time.monotonic() - self._snapshot_started, 3),
        )
        if previous is not None and self.config.trim_after_snapshots:
            self._trim(previous)

    def _trim(self, previous: SnapshotManifest) -> None:
        """Delete the records no restore can need once a newer snapshot than `previous` is
        complete: the chunks before `previous`'s, and the commands up to the offset it
        covers, unless an open obligation was admitted at or before its position (the
        Recovery Floor: the Admission is the evidence of an attempt that may be at the
        destination). Asynchronous: the outcome is logged."""
        c = self.config
        cuts = [TopicPartition(snapshots_topic(c.topic), c.partition, previous.first_chunk_offset)]
        oldest = self._oldest_open_obligation()
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
        for tp, future in self._admin.delete_records(cuts).items():
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

    def _oldest_open_obligation(self) -> Obligation | None:
        """The open obligation admitted first (at the lowest position, so also the
        earliest broker time), or None."""
        with self.store.read() as view:
            open_ = [o for _, o in view.items(Table.OBLIGATIONS) if isinstance(o, Obligation)]
        return min(open_, key=_admitted_position, default=None)

    def _snapshot_abandoned(self) -> None:
        """A transaction holding snapshot records did not commit. The snapshot is dropped,
        not retried: whatever refused it (a record over the topic's limit, say) must never
        hold back the shard's own records, which are written again without it. The next
        one is tried an interval later."""
        self._writer.extra = []
        self.log.warning("snapshot_abandoned", partition=self.config.partition)
        self.metrics.inc("nereus_snapshots_abandoned_total")
        self._snapshot_done()

    def _snapshot_done(self) -> None:
        if self._snapshot is not None:
            self._snapshot.close()
            self._snapshot = None
        self._snapshot_manifest = None
        self._snapshot_done_at = time.monotonic()

    # Lifecycle ----------------------------------------------------------------------------

    def close(self) -> None:
        """Let go of the partition. Transactions never stay open between ticks, so there is
        nothing to abort; records not yet written are dropped (the next owner's recovery
        resolves the attempts they would have reported)."""
        if self._consumer is not None:
            try:
                self._consumer.close()
            except (KafkaException, RuntimeError) as exc:
                self.log.warning("shard_log_close_failed", error=str(exc))
            self._consumer = None
        self._snapshot_done()
        self._writer.close()
        self._opened = False
        self._buffer = []
        self._local_replies = []


def _admitted_position(obligation: Obligation) -> int:
    return obligation.admitted_position
