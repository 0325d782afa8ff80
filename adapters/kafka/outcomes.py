"""What a Kafka producer's reports prove about a record: the outcome classes of a send.

Theory of operation: the class of an outcome must be the truth. PUBLISHED comes only from a
successful delivery report with a real partition and offset (`adapters.kafka.destination`);
this module decides the classes of failures, for the two ways Nereus produces:

* **Idempotent producer** (`classify_error`, `classify_produce_exception`):
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

* **Transactional producer** (`classify_aborted`): a record of a transaction that was
  aborted can never become visible to a `read_committed` consumer, so every send of an
  aborted transaction is NOT_PUBLISHED, whatever its own report said. The disposition still
  comes from the report: the record that made the broker refuse the batch is `permanent`,
  `lane_unavailable` or retriable by the rules above; its batch-mates are retriable
  (`transaction_aborted`). UNKNOWN never comes from here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from confluent_kafka import TIMESTAMP_NOT_AVAILABLE, KafkaError

from nereus.kernel.records import Evidence, NotPublished, Unknown

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
SIZE_CODES = frozenset({_E.MSG_SIZE_TOO_LARGE, _E.RECORD_LIST_TOO_LARGE})
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
    if code in SIZE_CODES:
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
    if code in SIZE_CODES:
        return NotPublished("permanent", "record_too_large", detail)
    if code in _LANE_CODES:
        return NotPublished("lane_unavailable", str(err.name()).lower().lstrip("_"), detail)
    if code in _PERMANENT_CODES:
        return NotPublished("permanent", str(err.name()).lower().lstrip("_"), detail)
    return NotPublished("retriable", "produce_refused", f"{err.name()}: {detail}")


def classify_aborted(err: Any | None, *, fits_alone: bool) -> NotPublished:
    """The outcome of a send whose transaction was aborted: definitely absent. `err` is its
    own delivery report's error (None if it had none: an innocent batch-mate)."""
    if err is None or err.code() in (_E._PURGE_QUEUE, _E._PURGE_INFLIGHT):
        return NotPublished("retriable", "transaction_aborted")
    outcome = classify_error(err, fits_alone=fits_alone, disturbed=False)
    if isinstance(outcome, NotPublished):
        return outcome
    return NotPublished("retriable", "transaction_aborted", f"{err.name()}: {err.str()}")


def report_evidence(msg: Any, now_ms: int) -> Evidence | None:
    """Where a successful delivery report says the record is, or None when it carries no
    position (librdkafka's DUPLICATE_SEQUENCE_NUMBER path). A report without a timestamp
    is stamped with the send's own time."""
    partition, offset = msg.partition(), msg.offset()
    if partition is None or offset is None or partition < 0 or offset < 0:
        return None
    ts_type, ts = msg.timestamp()
    if ts_type == TIMESTAMP_NOT_AVAILABLE or ts < 0:
        ts = now_ms
    return Evidence(str(msg.topic()), int(partition), int(offset), int(ts))
