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
* **Parts.** Where the fold resumes at open is `adapters.kafka.log_open`'s; turning records
  into entries, `adapters.kafka.log_read`'s; snapshots (restore, write, trim),
  `adapters.kafka.log_snapshots`'s. What a fold writes beside the state travels as one
  `storage.request.FoldRequest`.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import msgspec
from confluent_kafka import (
    KafkaError,
    KafkaException,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient

from nereus.adapters.kafka.log_open import (
    check_obligation_ages,
    folded_offset_of,
    new_consumer,
    resume_offset,
)
from nereus.adapters.kafka.log_read import FROM_MEMORY, decode_records
from nereus.adapters.kafka.log_snapshots import (
    RESTORE_BYTES,
    RESTORE_SECONDS,
    SNAPSHOT_BYTES,
    SNAPSHOT_ROWS,
    SNAPSHOT_WRITTEN_AT,
    TRIMMED_OFFSET,
    LogSnapshots,
)
from nereus.adapters.kafka.log_writer import LogWriter
from nereus.adapters.kafka.snapshots import (
    latest_manifest,
    snapshot_topics_exist,
)
from nereus.adapters.kafka.wire import (
    Envelope,
    Reply,
    watermarks,
)
from nereus.kernel.effects import EntryOutcome, outcomes_of
from nereus.kernel.records import Appendable, LogEntry
from nereus.runtime.log import Logger, NullLogger
from nereus.runtime.metrics import Metrics
from nereus.runtime.shardlog import COMMIT_BUCKETS_S, COMMIT_SECONDS, ShardLost
from nereus.storage.claims import ClaimWriter
from nereus.storage.request import FoldRequest
from nereus.storage.schema import LogSource
from nereus.storage.store import Applied, ShardStore
from nereus.storage.transfer import DEFAULT_CHUNK_BYTES

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
        self.snapshots = LogSnapshots(
            store, config, self._writer, metrics=self.metrics, log=self.log
        )
        _describe(self.metrics)

    # Opening ------------------------------------------------------------------------------

    def open(self) -> None:
        if self._opened:
            return
        c = self.config
        self._folded_offset = folded_offset_of(self.store, c)
        common: dict[str, Any] = {"bootstrap.servers": c.bootstrap}
        common.update(c.client_config)
        self._writer.open(common)
        consumer = new_consumer(common, c)
        try:
            low, _high = watermarks(
                consumer, TopicPartition(c.topic, c.partition), c.init_timeout_s
            )
            manifest = latest_manifest(common, c.topic, c.partition, c.init_timeout_s)
            self.snapshots.common_settings = common  # a restore reads with them
            start, self._folded_offset = resume_offset(
                self.store,
                c,
                snapshots=self.snapshots,
                folded_offset=self._folded_offset,
                manifest=manifest,
                low=low,
                log=self.log,
            )
            admin = AdminClient(dict(common))
            check_obligation_ages(self.store, c, admin)
        except BaseException:
            consumer.close()
            raise
        consumer.assign([TopicPartition(c.topic, c.partition, start)])
        self._consumer = consumer
        on = c.snapshot_interval_ms > 0 and snapshot_topics_exist(
            consumer, c.topic, c.init_timeout_s
        )
        self.snapshots.opened(admin, on, manifest)
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
        if self._buffer or self.snapshots.running or self.snapshots.due(self._caught_up):
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
        claims: ClaimWriter,
        before_commit: Callable[[list[Applied]], None],
    ) -> list[Applied]:
        c = self.config
        batch = self._buffer[: c.max_batch_records]
        del self._buffer[: len(batch)]
        entries, payloads, origin = decode_records(
            batch,
            self.store.meta.position,
            config=c,
            writer=self._writer,
            metrics=self.metrics,
            log=self.log,
        )

        def replies_then_write(results: list[Applied]) -> None:
            self._reply(results, origin, now_ms)
            before_commit(results)

        last_offset = batch[-1].offset()
        request = FoldRequest(
            source=LogSource("kafka", c.topic, c.partition, last_offset),
            payloads=payloads,
            payloads_checked=True,  # checked_payloads kept only bytes that match
            claims=claims,
            before_commit=replies_then_write,
        )
        results = self.store.apply(entries, request)
        self._folded_offset = last_offset
        self._writer.forget_written(last_offset)
        self._measure_lag()
        return results

    def _reply(self, results: list[Applied], origin: dict[int, Envelope], now_ms: int) -> None:
        """Queue the replies to the folded commands (persisted within the reply window):
        to this process's callers directly, to other processes through the replies topic
        (in this tick's transaction, before the fold commits)."""
        c = self.config
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
        also: ClaimWriter,
    ) -> tuple[list[LogEntry], list[Applied]]:
        """Fold what was read and write the tick's records with the replies to the folded
        commands, in one Kafka transaction committed BEFORE the fold's store transaction:
        a reply is a pure function of the committed log, so it may go out before this
        owner's copy of the fold is durable, and a crash in between only repeats it (a
        restarted owner folds the same entries again and answers again; a reply nobody
        waits for is ignored). The other order could lose replies."""
        if any(payload is not None for _record, payload in items):
            # Commands, with their bytes, reach this log through the commands topic (the
            # RPC); the runtime hands it only its own records. Refused before anything is
            # taken for writing, whatever `python -O` does to the writer's assert.
            raise TypeError("the Kafka shard log takes no payload bytes with the runtime's records")
        started = time.perf_counter()
        if not self._buffer:
            self._fill(0)
        self._writer.unwritten.extend(items)
        sent = self.snapshots.step(now_ms, self._caught_up)
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
        self.snapshots.finish(sent)
        if lost:
            raise lost[0]
        seconds = time.perf_counter() - started
        self.metrics.observe(COMMIT_SECONDS, seconds, None, COMMIT_BUCKETS_S)
        return [], results

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
        self.snapshots.close()
        self._writer.close()
        self._opened = False
        self._buffer = []
        self._local_replies = []


def _describe(metrics: Metrics) -> None:
    metrics.describe(
        SNAPSHOT_WRITTEN_AT, "gauge", "When the shard's last snapshot was completed (Unix s)."
    )
    metrics.describe(SNAPSHOT_BYTES, "gauge", "Bytes of the shard's last snapshot.")
    metrics.describe(SNAPSHOT_ROWS, "gauge", "Rows of the shard's last snapshot.")
    metrics.describe(
        RESTORE_SECONDS, "gauge", "How long the restore of the shard from a snapshot took."
    )
    metrics.describe(RESTORE_BYTES, "gauge", "Bytes of the snapshot the shard restored.")
    metrics.describe(
        LAG_OFFSETS,
        "gauge",
        "Offsets of the shard's partition not yet folded (high watermark of the last fetch "
        "minus the next offset to fold; transaction markers count).",
    )
    metrics.describe(
        TRIMMED_OFFSET,
        "gauge",
        "The offset below which this owner last deleted records of the shard's partition.",
    )
    metrics.describe(
        COMMIT_SECONDS,
        "histogram",
        "Commits of the Kafka shard log: the fold of what was read (LMDB, synced) and the "
        "tick's Kafka transaction.",
    )
    metrics.describe(
        FROM_MEMORY,
        "counter",
        "Records this owner wrote, folded from memory when the read reached their offsets.",
    )
