"""The Kafka destination: timers published as records to Apache Kafka with confluent-kafka.

Theory of operation: each `Send` becomes one record in the topic its tenant's queue maps to
(`adapters.tenant_topics.broker_topic`: a `tenant/queue` mapping, a `queue` mapping, else
`<tenant>.<queue>`, the plain queue for the default tenant), keyed by the timer's partition
key, with Nereus's headers (message id, generation, attempt id, txn, tenant, producer).
`submit` never blocks; results come back through `poll`. Two capabilities
(`KafkaDestinationConfig.delivery`, decided in `specs/kafka.md`):

* **transactional** (the default): a producer with a stable `transactional.id` per shard and
  destination cluster sends each round of sends as one Kafka transaction, on its own thread
  (`adapters.kafka.txn`). Its first `init_transactions()` fences every earlier producer
  under the id, so after a crash or a takeover an admitted attempt that a complete search of
  the `read_committed` view does not find is proven absent: NOT_PUBLISHED, retried with no
  chance of a duplicate. The id is the Admission's `fence_id`. Consumers of the topics must
  read with `isolation.level=read_committed` (records of aborted transactions are in the
  log too, and a read_uncommitted consumer sees them).
* **idempotent**: one idempotent producer (`enable.idempotence`, `acks=all`), for clusters
  where transactions are not allowed. Its per-message delivery report is the attempt's
  outcome, classified by `adapters.kafka.outcomes`; absence is never proven after the fact,
  so an attempt whose send gate died with a process is recorded UNKNOWN unless a search finds
  it, and a retry after UNKNOWN may duplicate it.

PUBLISHED only ever comes with evidence from a delivery report (topic, partition, offset,
timestamp; on a `LogAppendTime` topic the broker's persistence time) — in the transactional
capability, only once the transaction committed.

Size limits (`adapters.kafka.topic_limits`): `max_record_bytes(topic)` is the topic's
`max.message.bytes` (read with AdminClient.describe_configs, cached for `limits_ttl_s`),
capped by the producer's `message.max.bytes`, minus `FRAMING_RESERVE_BYTES` for the record
batch header and the per-record and per-header varint framing that
`PreparedPublish.size_bytes()` does not count.
`submit` checks an upper bound of the encoded single-record batch against the same limit and
answers NOT_PUBLISHED permanent without sending (sends that skipped the claim check, such as
dead letters, cannot poison a batch). Records under the limit can still be refused together
when the producer's `batch.size` exceeds a topic's `max.message.bytes`: keep `batch_size`
below the smallest topic limit (they come back retriable, `batch_too_large`).

Evidence (`search`) is looked for in bulk by `adapters.kafka.evidence`: one read of each
partition for every lookup of a search, in the background. A tenant's queue whose topic was
another before topics were named by tenant (`tenant_topics.legacy_topic`) is looked for in
both: an attempt admitted before the upgrade was sent to the old one, and a search that read
only the new one would take its absence there for proof.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import msgspec
from confluent_kafka import KafkaException, Producer

from nereus.adapters.kafka.evidence import EvidenceReader, SearchLimits
from nereus.adapters.kafka.outcomes import (
    FRAMING_RESERVE_BYTES,
    SIZE_CODES,
    classify_error,
    classify_produce_exception,
    record_batch_upper_bytes,
    report_evidence,
)
from nereus.adapters.kafka.topic_limits import TopicLimits
from nereus.adapters.kafka.txn import Outgoing, TransactionalSender, TxnSettings
from nereus.adapters.tenant_topics import broker_topic, legacy_topic
from nereus.kernel.keys import DEFAULT_TENANT
from nereus.kernel.records import IMMEDIATE, Capability, Evidence, NotPublished, Published, Unknown
from nereus.runtime.destination import (
    DLQ_SUFFIX,
    Lookup,
    PublishResult,
    Search,
    Send,
    SendResult,
    find_one,
)
from nereus.runtime.log import Logger, NullLogger

__all__ = ["FRAMING_RESERVE_BYTES", "Delivery", "KafkaDestination", "KafkaDestinationConfig"]

Delivery = Literal["transactional", "idempotent"]


class KafkaDestinationConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    bootstrap: str
    name: str = "kafka"
    # "queue" (every tenant's) or "tenant/queue" -> topic; a queue not listed publishes to
    # "<tenant>.<queue>" (the default tenant's to the queue's own name).
    topics: dict[str, str] = msgspec.field(default_factory=dict)
    delivery: Delivery = "transactional"
    # The transactional capability's producer id. None: "nereus-dest.<store id>", set when
    # the runtime opens the destination (one store, one id). Kafka mode names it per shard.
    transactional_id: str | None = None
    linger_ms: int = 5
    # How long librdkafka keeps trying a record; after it the report is _MSG_TIMED_OUT.
    message_timeout_ms: int = 30_000
    # The broker aborts a transaction left open this long (must be >= message_timeout_ms).
    transaction_timeout_ms: int = 60_000
    # init_transactions / commit_transaction: how long one call may take before it is
    # retried (init) or the transaction is treated as in doubt (commit).
    init_timeout_s: float = 30.0
    commit_timeout_s: float = 30.0
    max_sends_per_transaction: int = 10_000
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
    # Evidence searches: a record is looked for from its admission time less this slack
    # (the proof of absence assumes no record is stamped earlier than that), and one search
    # reads at most this many records for at most this long.
    find_slack_ms: int = 30_000
    find_max_records: int = 10_000_000
    find_max_seconds: float = 60.0
    close_timeout_s: float = 10.0
    retry_backoff_s: float = 1.0


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
        self._limits = TopicLimits(config, self._common(), self.log)
        # Topic a tenant's queue is sent to now -> the one it had before topics were named
        # by tenant, where they differ (filled as topics are asked for: recovery asks for
        # an attempt's topic before it looks for it).
        self._legacy: dict[str, str] = {}
        self.fence_id: str | None = None
        self._sender: TransactionalSender | None = None
        # The idempotent capability: its producer, the sends it holds whose report has not
        # come yet (by token), and the disturbances that make an error report uncertain.
        self._producer: Any = None
        self._pending: dict[int, _Pending] = {}
        self._tokens = 0
        self._disturbances = 0
        self._fatal: Any = None
        self._reader: EvidenceReader | None = None
        if config.delivery == "idempotent":
            self._producer = self._new_producer()
            self._reader = self._new_reader(None)
        elif config.transactional_id is not None:
            self._start_transactions(config.transactional_id)

    # Configuration ------------------------------------------------------------------------

    def _common(self) -> dict[str, Any]:
        return {"bootstrap.servers": self.config.bootstrap, **self.config.client_config}

    def _producer_conf(self) -> dict[str, Any]:
        c = self.config
        conf: dict[str, Any] = {
            **self._common(),
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
        }
        if c.delivery == "transactional":
            conf["transaction.timeout.ms"] = c.transaction_timeout_ms
        else:
            conf["error_cb"] = self._on_error
        conf.update(c.producer_config)
        return conf

    def _new_producer(self) -> Any:
        return Producer(self._producer_conf())

    def _new_reader(self, fence: Callable[[threading.Event], Any] | None) -> EvidenceReader:
        c = self.config
        limits = SearchLimits(
            c.find_slack_ms, c.find_max_records, c.find_max_seconds, c.admin_timeout_s
        )
        return EvidenceReader(self._common(), c.name, limits, self.log, fence=fence)

    def _start_transactions(self, transactional_id: str) -> None:
        c = self.config
        settings = TxnSettings(
            transactional_id=transactional_id,
            init_timeout_s=c.init_timeout_s,
            commit_timeout_s=c.commit_timeout_s,
            max_sends=c.max_sends_per_transaction,
            retry_backoff_s=c.retry_backoff_s,
            close_timeout_s=c.close_timeout_s,
        )
        sender = TransactionalSender(
            self._producer_conf(),
            settings,
            deliver=self._deliver,
            fits_alone=self._limits.fits_alone,
            log=self.log,
        )
        reader = self._new_reader(sender.wait_fenced)
        sender.search = lambda lookups: reader.search(lookups, _nothing)
        self._reader = reader
        self._sender = sender
        self.fence_id = transactional_id
        sender.start()

    def open(self, store_id: str) -> None:
        """The transactional capability takes its id from the store if none was given, and
        starts fencing its predecessors now, before recovery searches for their records."""
        if self.config.delivery == "transactional" and self._sender is None:
            self._start_transactions(f"nereus-dest.{store_id}")

    def topic_for(self, queue: str, *, tenant: str = DEFAULT_TENANT) -> str:
        topic = broker_topic(self.config.topics, tenant, queue)
        old = legacy_topic(self.config.topics, queue)
        if old != topic:
            self._legacy[topic] = old
        return topic

    def max_record_bytes(self, topic: str) -> int:
        return self._limits.max_record_bytes(topic)

    # Sending ------------------------------------------------------------------------------

    def _deliver(self, results: list[SendResult]) -> None:
        with self._lock:
            self._results.extend(results)

    def submit(self, sends: Sequence[Send], now_ms: int) -> None:
        if not sends:
            return
        outgoing: list[Outgoing] = []
        for send in sends:
            p = send.prepared
            upper = record_batch_upper_bytes(p.key, p.value, send.headers())
            limit = self._limits.effective(p.topic, fetch=False)
            if limit is not None and upper > limit:
                detail = f"about {upper} bytes encoded > {limit} accepted by {p.topic}"
                refused = NotPublished("permanent", "record_too_large", detail)
                self._deliver([SendResult.of(send, refused)])
            else:
                outgoing.append(Outgoing(send, upper, now_ms))
        if self._sender is not None:
            self._sender.submit(outgoing)
            return
        if self.config.delivery == "transactional":
            raise RuntimeError("a transactional destination sends only after open()")
        self._produce_idempotent(outgoing)

    def poll(self, timeout_s: float) -> list[SendResult]:
        if self._producer is not None:
            self._producer.poll(timeout_s)
        with self._lock:
            results, self._results = self._results, []
        return results

    # The idempotent capability ----------------------------------------------------------

    def _on_error(self, err: Any) -> None:
        with self._lock:
            self._disturbances += 1
            if err.fatal():
                self._fatal = err
        self.log.warning("kafka_producer_error", error=str(err), fatal=bool(err.fatal()))

    def _produce_idempotent(self, outgoing: list[Outgoing]) -> None:
        if self._fatal is not None:
            self._replace_producer()
        for out in outgoing:
            send, p = out.send, out.send.prepared
            with self._lock:
                seen = self._disturbances
            self._tokens += 1
            token, pending = self._tokens, self._pending
            pending[token] = _Pending(send, seen, out.upper_bytes, out.now_ms)
            try:
                self._producer.produce(
                    p.topic,
                    value=p.value,
                    key=p.key,
                    headers=list(send.headers()),
                    on_delivery=self._callback(pending, token),
                )
            except BufferError as exc:
                del pending[token]
                self._deliver(
                    [SendResult.of(send, NotPublished("retriable", "queue_full", str(exc)))]
                )
            except KafkaException as exc:
                del pending[token]
                self._deliver([SendResult.of(send, classify_produce_exception(exc.args[0]))])
        self._producer.poll(0)

    def _callback(self, pending: dict[int, _Pending], token: int) -> Callable[[Any, Any], None]:
        def on_delivery(err: Any, msg: Any) -> None:
            item = pending.pop(token, None)
            if item is None:
                return  # already reported UNKNOWN when its producer was abandoned
            self._deliver([SendResult.of(item.send, self._outcome(err, msg, item))])

        return on_delivery

    def _outcome(self, err: Any, msg: Any, item: _Pending) -> PublishResult:
        if err is None:
            evidence = report_evidence(msg, item.now_ms)
            if evidence is None:
                return Unknown(
                    "persisted_without_position",
                    "delivered (a retry found it already written) but without an offset",
                )
            return Published(evidence)
        with self._lock:
            disturbed = self._disturbances != item.seen
        fits = True
        if err.code() in SIZE_CODES:
            # Rare: may ask the broker.
            fits = self._limits.fits_alone(str(msg.topic()), item.upper)
        outcome = classify_error(err, fits_alone=fits, disturbed=disturbed)
        if isinstance(outcome, Unknown):
            with self._lock:
                self._disturbances += 1
        return outcome

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
            self._deliver([SendResult.of(item.send, Unknown("producer_failed", str(self._fatal)))])
        with self._lock:
            self._fatal = None
        self._pending = {}
        self._producer = self._new_producer()

    # Evidence -----------------------------------------------------------------------------

    def search(self, lookups: Sequence[Lookup], wake: Callable[[], None]) -> Search:
        if self._reader is None:
            raise RuntimeError("a transactional destination searches only after open()")
        return self._reader.search([*lookups, *self._legacy_lookups(lookups)], wake)

    def _legacy_lookups(self, lookups: Sequence[Lookup]) -> list[Lookup]:
        """The same attempts in the topics their queues had before topics were named by
        tenant (the reader matches attempt ids in every partition it reads)."""
        twins: list[Lookup] = []
        for lk in lookups:
            base, dlq = lk.topic, ""
            if base not in self._legacy and base.endswith(DLQ_SUFFIX):
                base, dlq = base[: -len(DLQ_SUFFIX)], DLQ_SUFFIX
            old = self._legacy.get(base)
            if old is not None:
                twins.append(Lookup(lk.attempt_id, old + dlq, lk.since_ms))
        return twins

    def find(self, attempt_id: str, topic: str, since_ms: int) -> Evidence | None:
        """One lookup, waiting for its search: for tools and tests, not the runtime."""
        timeout_s = self.config.find_max_seconds + 2 * self.config.admin_timeout_s + 5
        return find_one(self, attempt_id, topic, since_ms, timeout_s)

    # Lifecycle ----------------------------------------------------------------------------

    def close(self) -> None:
        """Stop sending. The idempotent producer is flushed for at most `close_timeout_s`;
        the transactional one finishes the transaction it is in (reports that come after
        `close` are not collected: the next start settles those attempts by evidence)."""
        if self._sender is not None:
            self._sender.close()
        if self._producer is not None:
            left = self._producer.flush(self.config.close_timeout_s)
            if left:
                self.log.warning("kafka_close_unflushed", records=left)
        if self._reader is not None:
            self._reader.close()


def _nothing() -> None:
    pass
