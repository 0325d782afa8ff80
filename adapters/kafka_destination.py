"""The Kafka destination: timers published as records to Apache Kafka with confluent-kafka.

Theory of operation: one idempotent producer (`enable.idempotence`, `acks=all`) writes each
`Send` to the topic its queue maps to, keyed by the timer's partition key, with Nereus's
headers (message id, generation, attempt id, txn, producer). `submit` only enqueues; the
per-message delivery report, served by `poll`, becomes the attempt's outcome, and the class of
that outcome must be the truth:

* PUBLISHED only with a delivery report that carries a real partition and offset; the
  evidence is (topic, partition, offset, timestamp). On a `LogAppendTime` topic the timestamp
  is the broker's persistence time; on a `CreateTime` topic it is the record's create time.
* NOT_PUBLISHED only when the record is definitely absent. librdkafka knows a per-message
  persistence status (`rd_kafka_message_status`: NOT_PERSISTED / POSSIBLY_PERSISTED /
  PERSISTED), but confluent-kafka-python does not expose it (its `Message` has `latency()`
  and `leader_epoch()`, no status; the PR that proposed `PersistenceStatus` was not merged).
  So the class is derived from the error code, following librdkafka's own table of
  produce-error actions (`rd_kafka_handle_Produce_error`), and made more cautious where the
  code alone cannot carry the truth:
  - `MSG_SIZE_TOO_LARGE` / `RECORD_LIST_TOO_LARGE`: the broker refused the whole batch. If
    this record alone is over the topic's limit -> permanent `record_too_large`; if it would
    fit alone, it was refused for its batch-mates -> retriable `batch_too_large`.
  - unknown topic or partition -> `lane_unavailable` (nothing of it exists to hold a record).
  - `INVALID_MSG` / `INVALID_RECORD` and configuration refusals (authorization, policy,
    timestamp, message format) -> permanent; errors librdkafka marks "not persisted, retry"
    -> retriable. A message can reach such an error on a retry after an earlier attempt of
    the same batch was possibly persisted (an in-flight request lost with its connection),
    which only librdkafka's hidden status would tell; so when the producer reported any
    error (error callback, or a possibly-persisted delivery report) between this record's
    produce() and its report, these classes become UNKNOWN instead.
  - everything else -> UNKNOWN: `_MSG_TIMED_OUT` (also for a record that never left the
    queue: the code does not tell which), `_PURGE_INFLIGHT`, request timeouts, transport
    failures, `NOT_ENOUGH_REPLICAS_AFTER_APPEND`, idempotence errors, fatal errors, unknown
    codes. A success report without a valid offset (librdkafka's DUPLICATE_SEQUENCE_NUMBER
    path) is UNKNOWN too: persisted, but without evidence the reconciler can find it.
* A produce() call that raises never enqueued the record: `BufferError` (local queue full)
  -> retriable; `KafkaException` classified by its code as above, never UNKNOWN.

Size limits: `max_record_bytes(topic)` is the topic's `max.message.bytes` (read with
AdminClient.describe_configs, cached for `limits_ttl_s`), capped by the producer's
`message.max.bytes`, minus `FRAMING_RESERVE_BYTES` for the record batch header and the
per-record and per-header varint framing that `PreparedPublish.size_bytes()` does not count.
`submit` checks an upper bound of the encoded single-record batch against the same limit and
answers NOT_PUBLISHED permanent without sending (sends that skipped the claim check, such as
dead letters, cannot poison a batch). Records under the limit can still be refused together
when the producer's `batch.size` exceeds a topic's `max.message.bytes`: keep `batch_size`
below the smallest topic limit (they come back retriable, `batch_too_large`).

Evidence lookup (`find`) is the reconciler's only way to turn UNKNOWN into PUBLISHED: it reads
every partition of the topic from the offset of timestamp `since_ms - find_slack_ms`
(offsets_for_times; the slack absorbs a broker clock behind ours on `LogAppendTime` topics)
up to the end of the partition at scan time (the high watermark; `read_committed`, so the
last stable offset), with a consumer that never joins or commits to a group, and returns the
first record whose `nereus-attempt-id` header equals the attempt id. The scan is bounded by
`find_max_records` records and `find_max_seconds` seconds over all partitions (defaults
1,000,000 and 10 s); a scan that hits a bound, like one that finds nothing, returns None,
which proves nothing: the attempt stays UNKNOWN and is looked for again later.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import msgspec
from confluent_kafka import (
    TIMESTAMP_NOT_AVAILABLE,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._config import ConfigResource

from kernel.records import IMMEDIATE, Capability, Evidence, NotPublished, Published, Unknown
from runtime.destination import H_ATTEMPT_ID, PublishResult, Send, SendResult
from runtime.log import Logger, NullLogger

# Kafka's default topic max.message.bytes (1 MiB + 12 bytes of batch overhead).
DEFAULT_MAX_MESSAGE_BYTES = 1_048_588
# Record batch header (61 bytes), one record's framing (length, attributes, timestamp and
# offset deltas, key/value lengths, header count: at most 36 bytes) and the varint framing of
# up to 16 headers (10 bytes each), rounded up.
FRAMING_RESERVE_BYTES = 320
_BATCH_HEADER_BYTES = 61
_RECORD_FRAMING_BYTES = 36
_HEADER_FRAMING_BYTES = 10

_E = KafkaError
_SIZE_CODES = frozenset({_E.MSG_SIZE_TOO_LARGE, _E.RECORD_LIST_TOO_LARGE})
_LANE_CODES = frozenset(
    {_E.UNKNOWN_TOPIC_OR_PART, _E._UNKNOWN_TOPIC, _E._UNKNOWN_PARTITION, _E.UNKNOWN_TOPIC_ID}
)
# Refused by the broker's validation or configuration before anything is appended.
_PERMANENT_CODES = frozenset(
    {
        _E.INVALID_MSG,
        _E.INVALID_RECORD,
        _E.TOPIC_AUTHORIZATION_FAILED,
        _E.CLUSTER_AUTHORIZATION_FAILED,
        _E.POLICY_VIOLATION,
        _E.INVALID_TIMESTAMP,
        _E.UNSUPPORTED_FOR_MESSAGE_FORMAT,
        _E.INVALID_REQUIRED_ACKS,
    }
)
# librdkafka: "not persisted" and retried (rd_kafka_err_action / rd_kafka_handle_Produce_error).
_RETRIABLE_CODES = frozenset(
    {
        _E.NOT_ENOUGH_REPLICAS,
        _E.KAFKA_STORAGE_ERROR,
        _E.LEADER_NOT_AVAILABLE,
        _E.NOT_LEADER_FOR_PARTITION,
        _E.BROKER_NOT_AVAILABLE,
        _E.REPLICA_NOT_AVAILABLE,
        _E._TIMED_OUT_QUEUE,
        _E._QUEUE_FULL,
        _E._PURGE_QUEUE,
    }
)


class KafkaDestinationConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    bootstrap: str
    name: str = "kafka"
    # queue -> topic; a queue not listed publishes to the topic of its own name.
    topics: dict[str, str] = msgspec.field(default_factory=dict)
    linger_ms: int = 5
    # How long librdkafka keeps trying a record; after it the report is _MSG_TIMED_OUT.
    message_timeout_ms: int = 30_000
    # How long a record for a topic missing from the metadata waits before it fails.
    metadata_propagation_ms: int = 5_000
    # The producer's request/message size cap, and its batch size (see the module doc).
    message_max_bytes: int = 1_100_000
    batch_size: int = 1_000_000
    # Extra librdkafka settings: for every client (producer, admin, evidence consumer), and
    # for the producer only. They win over the above.
    client_config: dict[str, str | int | float | bool] = msgspec.field(default_factory=dict)
    producer_config: dict[str, str | int | float | bool] = msgspec.field(default_factory=dict)
    limits_ttl_s: float = 60.0
    admin_timeout_s: float = 5.0
    find_slack_ms: int = 10_000
    find_max_records: int = 1_000_000
    find_max_seconds: float = 10.0
    close_timeout_s: float = 10.0


def record_batch_upper_bytes(
    key: bytes | None, value: bytes, headers: Sequence[tuple[str, bytes]]
) -> int:
    """An upper bound of a batch holding only this record, as the broker measures it."""
    size = _BATCH_HEADER_BYTES + _RECORD_FRAMING_BYTES + len(key or b"") + len(value)
    for k, v in headers:
        size += _HEADER_FRAMING_BYTES + len(k.encode()) + len(v)
    return size


def classify_error(err: Any, *, fits_alone: bool, disturbed: bool) -> NotPublished | Unknown:
    """The outcome a failed delivery report (or produce() exception) proves; see the module
    doc. `fits_alone`: this record alone is within the topic's limit. `disturbed`: the producer
    reported some error between this record's produce() and this report, so an earlier
    attempt may have been possibly persisted."""
    code: int = err.code()
    name = str(err.name())
    detail = str(err.str())
    if code in _SIZE_CODES:
        if not fits_alone:
            return NotPublished("permanent", "record_too_large", detail)
        return NotPublished("retriable", "batch_too_large", detail)
    if code in _LANE_CODES:
        return NotPublished("lane_unavailable", name.lower().lstrip("_"), detail)
    if code in _PERMANENT_CODES or code in _RETRIABLE_CODES:
        if disturbed:
            return Unknown("possibly_persisted", f"{name} after a producer error: {detail}")
        disposition: Literal["permanent", "retriable"] = (
            "permanent" if code in _PERMANENT_CODES else "retriable"
        )
        return NotPublished(disposition, name.lower().lstrip("_"), detail)
    if code == _E._MSG_TIMED_OUT:
        return Unknown("timeout", detail)
    return Unknown("possibly_persisted", f"{name}: {detail}")


def classify_produce_exception(err: Any) -> NotPublished:
    """produce() raised: the record was never enqueued, so it is definitely absent. A size
    refusal here is the producer's own limit (message.max.bytes) for this record alone."""
    code: int = err.code()
    detail = str(err.str())
    if code in _SIZE_CODES:
        return NotPublished("permanent", "record_too_large", detail)
    if code in _LANE_CODES:
        return NotPublished("lane_unavailable", str(err.name()).lower().lstrip("_"), detail)
    if code in _PERMANENT_CODES:
        return NotPublished("permanent", str(err.name()).lower().lstrip("_"), detail)
    return NotPublished("retriable", "produce_refused", f"{err.name()}: {detail}")


@dataclass(frozen=True)
class _Pending:
    send: Send
    seen: int  # the producer's disturbance count at produce()
    upper: int  # record_batch_upper_bytes of the record
    now_ms: int


class KafkaDestination:
    """A `runtime.destination.Destination` publishing to Apache Kafka."""

    capability: Capability = IMMEDIATE

    def __init__(self, config: KafkaDestinationConfig, *, logger: Logger | None = None) -> None:
        self.config = config
        self.name = config.name
        self.log = logger or NullLogger()
        self._lock = threading.Lock()
        self._results: list[SendResult] = []
        # Bumped on every producer error callback and every possibly-persisted report.
        self._disturbances = 0
        self._fatal: Any = None
        self._limits: dict[str, tuple[int | None, float]] = {}
        self._admin: Any = None
        self._reader: Any = None
        # Sends handed to the current producer whose report has not come yet, by token.
        self._pending: dict[int, _Pending] = {}
        self._tokens = 0
        self._producer: Any = self._new_producer()

    # Configuration ------------------------------------------------------------------------

    def _new_producer(self) -> Any:
        c = self.config
        conf: dict[str, Any] = {
            "bootstrap.servers": c.bootstrap,
            "client.id": f"{c.name}-producer",
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": c.linger_ms,
            "message.timeout.ms": c.message_timeout_ms,
            "topic.metadata.propagation.max.ms": c.metadata_propagation_ms,
            "message.max.bytes": c.message_max_bytes,
            "batch.size": c.batch_size,
            # The Java client's partitioner: same key, same partition, whoever produces.
            "partitioner": "murmur2_random",
            "error_cb": self._on_error,
        }
        conf.update(c.client_config)
        conf.update(c.producer_config)
        return Producer(conf)

    def _admin_client(self) -> Any:
        if self._admin is None:
            conf: dict[str, Any] = {
                "bootstrap.servers": self.config.bootstrap,
                "client.id": f"{self.config.name}-admin",
            }
            conf.update(self.config.client_config)
            self._admin = AdminClient(conf)
        return self._admin

    def topic_for(self, queue: str) -> str:
        return self.config.topics.get(queue, queue)

    def _topic_limit(self, topic: str, *, fetch: bool = True) -> int | None:
        """The topic's max.message.bytes, or None if it was never read (no such topic, or no
        broker). With `fetch` False only the cache answers, whatever its age (for `submit`,
        which must not block). A failed refresh keeps the last value read."""
        now = time.monotonic()
        cached = self._limits.get(topic)
        if not fetch or (cached is not None and cached[1] > now):
            return cached[0] if cached is not None else None
        limit: int | None = None
        try:
            resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
            futures = self._admin_client().describe_configs([resource])
            entries = futures[resource].result(timeout=self.config.admin_timeout_s)
            entry = entries.get("max.message.bytes")
            limit = int(entry.value) if entry is not None else DEFAULT_MAX_MESSAGE_BYTES
        except (KafkaException, TimeoutError, ValueError) as exc:
            self.log.warning("kafka_topic_limit_unread", topic=topic, error=str(exc))
            if cached is not None:
                limit = cached[0]
        self._limits[topic] = (limit, now + self.config.limits_ttl_s)
        return limit

    def _effective_limit(self, topic: str, *, fetch: bool = True) -> int | None:
        limit = self._topic_limit(topic, fetch=fetch)
        return None if limit is None else min(limit, self.config.message_max_bytes)

    def max_record_bytes(self, topic: str) -> int:
        limit = self._effective_limit(topic)
        if limit is None:
            # Unknown topic: let the claim pass; the send answers lane_unavailable.
            limit = min(DEFAULT_MAX_MESSAGE_BYTES, self.config.message_max_bytes)
        return limit - FRAMING_RESERVE_BYTES

    # Sending ------------------------------------------------------------------------------

    def _on_error(self, err: Any) -> None:
        with self._lock:
            self._disturbances += 1
            if err.fatal():
                self._fatal = err
        self.log.warning("kafka_producer_error", error=str(err), fatal=bool(err.fatal()))

    def _deliver(self, res: SendResult) -> None:
        with self._lock:
            self._results.append(res)

    def submit(self, sends: Sequence[Send], now_ms: int) -> None:
        if not sends:
            return
        if self._fatal is not None:
            self._replace_producer()
        for send in sends:
            p = send.prepared
            headers = send.headers()
            upper = record_batch_upper_bytes(p.key, p.value, headers)
            limit = self._effective_limit(p.topic, fetch=False)
            fits = limit is None or upper <= limit
            if not fits:
                self._deliver(
                    _result(
                        send,
                        NotPublished(
                            "permanent",
                            "record_too_large",
                            f"about {upper} bytes encoded > {limit} accepted by {p.topic}",
                        ),
                    )
                )
                continue
            with self._lock:
                seen = self._disturbances
            self._tokens += 1
            token, pending = self._tokens, self._pending
            pending[token] = _Pending(send, seen, upper, now_ms)
            try:
                self._producer.produce(
                    p.topic,
                    value=p.value,
                    key=p.key,
                    headers=list(headers),
                    on_delivery=self._callback(pending, token),
                )
            except BufferError as exc:
                del pending[token]
                self._deliver(_result(send, NotPublished("retriable", "queue_full", str(exc))))
            except KafkaException as exc:
                del pending[token]
                self._deliver(_result(send, classify_produce_exception(exc.args[0])))
        self._producer.poll(0)

    def _callback(self, pending: dict[int, _Pending], token: int) -> Callable[[Any, Any], None]:
        def on_delivery(err: Any, msg: Any) -> None:
            item = pending.pop(token, None)
            if item is None:
                return  # already reported UNKNOWN when its producer was abandoned
            self._deliver(_result(item.send, self._outcome(err, msg, item)))

        return on_delivery

    def _outcome(self, err: Any, msg: Any, item: _Pending) -> PublishResult:
        if err is None:
            partition, offset = msg.partition(), msg.offset()
            if partition is None or offset is None or partition < 0 or offset < 0:
                return Unknown(
                    "persisted_without_position",
                    "delivered (a retry found it already written) but without an offset",
                )
            ts_type, ts = msg.timestamp()
            if ts_type == TIMESTAMP_NOT_AVAILABLE or ts < 0:
                ts = item.now_ms
            return Published(Evidence(str(msg.topic()), int(partition), int(offset), int(ts)))
        with self._lock:
            disturbed = self._disturbances != item.seen
        fits = True
        if err.code() in _SIZE_CODES:
            # Rare: may ask the broker. Unreadable limit: assume it was this record.
            limit = self._effective_limit(str(msg.topic()))
            fits = limit is not None and item.upper <= limit
        outcome = classify_error(err, fits_alone=fits, disturbed=disturbed)
        if isinstance(outcome, Unknown):
            with self._lock:
                self._disturbances += 1
        return outcome

    def poll(self, timeout_s: float) -> list[SendResult]:
        self._producer.poll(timeout_s)
        with self._lock:
            results, self._results = self._results, []
        return results

    def _replace_producer(self) -> None:
        """A fatal (idempotence) error makes the producer unusable: purge what it still holds,
        serve the reports that come (classified by the rules above: the fatal error counts
        as a disturbance), report any send still without one UNKNOWN, and start afresh."""
        old, pending = self._producer, self._pending
        self.log.error("kafka_producer_replaced", error=str(self._fatal), pending=len(pending))
        try:
            old.purge(in_queue=True, in_flight=True)
            old.flush(min(self.config.close_timeout_s, 5.0))
        except KafkaException as exc:
            self.log.warning("kafka_purge_failed", error=str(exc))
        for token in list(pending):
            item = pending.pop(token)
            self._deliver(_result(item.send, Unknown("producer_failed", str(self._fatal))))
        with self._lock:
            self._fatal = None
        self._pending = {}
        self._producer = self._new_producer()

    # Evidence -----------------------------------------------------------------------------

    def _consumer(self) -> Any:
        if self._reader is None:
            conf: dict[str, Any] = {
                "bootstrap.servers": self.config.bootstrap,
                "client.id": f"{self.config.name}-evidence",
                # Required by the client; never joined (assign only) nor committed to.
                "group.id": f"nereus-evidence-{uuid.uuid4().hex}",
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "isolation.level": "read_committed",
                "enable.partition.eof": True,
                "auto.offset.reset": "earliest",
                "fetch.wait.max.ms": 50,
            }
            conf.update(self.config.client_config)
            self._reader = Consumer(conf)
        return self._reader

    def find(self, attempt_id: str, topic: str, since_ms: int) -> Evidence | None:
        """Positive evidence that `attempt_id` is in `topic`, or None (proves nothing).
        Bounded by `find_max_records` and `find_max_seconds`; see the module doc."""
        c = self.config
        deadline = time.monotonic() + c.find_max_seconds
        want = attempt_id.encode()
        consumer = self._consumer()
        try:
            md = consumer.list_topics(topic, timeout=c.admin_timeout_s)
        except KafkaException as exc:
            self.log.warning("kafka_find_failed", topic=topic, error=str(exc))
            return None
        meta = md.topics.get(topic)
        if meta is None or meta.error is not None:
            return None
        start_ts = max(since_ms - c.find_slack_ms, 0)
        query = [TopicPartition(topic, p, start_ts) for p in sorted(meta.partitions)]
        try:
            starts = consumer.offsets_for_times(query, timeout=c.admin_timeout_s)
            ends: dict[int, int] = {}
            assignment = []
            for tp in starts:
                if tp.error is not None or tp.offset < 0:
                    continue  # no record at or after start_ts in this partition
                marks = consumer.get_watermark_offsets(
                    TopicPartition(topic, tp.partition), timeout=c.admin_timeout_s
                )
                if marks is None or tp.offset >= marks[1]:
                    continue
                high = marks[1]
                ends[tp.partition] = high
                assignment.append(TopicPartition(topic, tp.partition, tp.offset))
        except KafkaException as exc:
            self.log.warning("kafka_find_failed", topic=topic, error=str(exc))
            return None
        if not assignment:
            return None
        scanned = 0
        consumer.assign(assignment)
        try:
            while ends and scanned < c.find_max_records:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                for m in consumer.consume(num_messages=500, timeout=min(left, 0.5)):
                    err = m.error()
                    if err is not None:
                        if err.code() == KafkaError._PARTITION_EOF:
                            ends.pop(m.partition(), None)
                        continue
                    scanned += 1
                    for k, v in m.headers() or ():
                        if k == H_ATTEMPT_ID and v == want:
                            return Evidence(
                                str(m.topic()),
                                int(m.partition()),
                                int(m.offset()),
                                m.timestamp()[1],
                            )
                    if m.offset() >= ends.get(m.partition(), 0) - 1:
                        ends.pop(m.partition(), None)
        finally:
            consumer.unassign()
        if ends:
            self.log.warning(
                "kafka_find_bounded",
                attempt_id=attempt_id,
                topic=topic,
                scanned=scanned,
                partitions_left=sorted(ends),
            )
        return None

    # Lifecycle ----------------------------------------------------------------------------

    def close(self) -> None:
        """Flush what was submitted, for at most `close_timeout_s`; reports that come after
        `close` are not collected (recovery resolves those attempts by evidence)."""
        left = self._producer.flush(self.config.close_timeout_s)
        if left:
            self.log.warning("kafka_close_unflushed", records=left)
        if self._reader is not None:
            self._reader.close()
            self._reader = None


def _result(send: Send, outcome: PublishResult) -> SendResult:
    p = send.prepared
    return SendResult(send.attempt_id, p.message_id, p.generation, outcome)
