"""The writing side of the Kafka shard log: one transaction per tick, fencing, the send lease.

Theory of operation (`adapters.kafka.log` reads and folds): the owner's system mutations,
and the replies to the commands just folded, are produced in one Kafka transaction per tick
by a producer whose `transactional.id` is tied to the shard, so `init_transactions` by a new
owner aborts the old owner's open transaction and fences its producer: a zombie can never
again commit to the partition. Each record is named `<tenure>:<seq>`, so the reader knows
when everything this owner wrote has come back. A fenced or otherwise fatal producer means
`ShardLost`; a transaction that must be aborted is retried whole after a backoff (every
record in it stays true if written later: an Admission's own persistence time decides
whether it qualifies).

A send may start only within `send_lease_ms` of the start of the last transaction this
owner committed; while idle the owner commits a proof transaction every `proof_interval_ms`
(its consumer offsets, through the group coordinator, which also checks that this process
is still a member of the group's current generation). After a pause (SIGSTOP, a stall)
nothing is sent before a new commit succeeds, which a fenced zombie can never do.

The records a committed transaction wrote are kept by the offsets their delivery reports
gave (`written`), so the reader folds them from memory when it reaches those offsets rather
than decoding the bytes it wrote. It still has to reach them: a record's shard log position
counts the clients' commands committed before it in the partition, which only the read
tells.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition

from nereus.adapters.kafka.wire import Envelope, Reply, encode_envelope, encode_reply
from nereus.kernel.codes import Code
from nereus.kernel.effects import EntryOutcome
from nereus.kernel.records import Appendable
from nereus.runtime.log import Logger
from nereus.runtime.metrics import Metrics
from nereus.runtime.shardlog import ShardLost

if TYPE_CHECKING:
    from nereus.adapters.kafka.log import KafkaLogConfig

_PROOF_OUTCOME = EntryOutcome(0, "PROOF", True, Code.UNCHANGED)

# Producer errors after which this owner can never write to the partition again.
_FENCED_CODES = frozenset(
    {
        KafkaError._FENCED,
        KafkaError.PRODUCER_FENCED,
        KafkaError.INVALID_PRODUCER_EPOCH,
        KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    }
)


class LogWriter:
    def __init__(
        self,
        config: KafkaLogConfig,
        tenure: str,
        *,
        group_metadata: Callable[[], Any] | None,
        metrics: Metrics,
        log: Logger,
    ) -> None:
        self.config = config
        self.tenure = tenure
        self._group_metadata = group_metadata
        self.metrics = metrics
        self.log = log
        self._producer: Any = None
        self._seq = 0
        self.committed_seq = 0  # the last of this tenure's records a transaction committed
        self.unwritten: list[Appendable] = []
        self.replies: list[tuple[str, Reply]] = []
        # Records of other topics for the next transaction (a snapshot's chunks or manifest):
        # (topic, partition, key, value). Cleared when a transaction commits them; after a
        # failed one the caller decides (KafkaLog drops the snapshot).
        self.extra: list[tuple[str, int, bytes, bytes]] = []
        # The offsets the last committed transaction's extra records were written at.
        self.extra_offsets: list[int] = []
        # Offset -> envelope of the records committed transactions wrote, until folded.
        self.written: dict[int, Envelope] = {}
        self._proof_at = float("-inf")  # monotonic start of the last committed transaction
        self._offsets_proof_at = float("-inf")
        self._retry_at = 0.0

    def open(self, common: dict[str, Any]) -> None:
        """Take the shard's transactional id, fencing any former owner."""
        c = self.config
        producer = Producer(
            {
                **common,
                "client.id": f"nereus-shard-{c.partition}",
                "transactional.id": c.transactional_id,
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 1,
                "transaction.timeout.ms": c.transaction_timeout_ms,
                # A snapshot chunk holding one row as large as a payload may pass 1 MB; the
                # topic's own max.message.bytes is the limit that decides.
                "message.max.bytes": 4 * 1024 * 1024,
                "message.timeout.ms": c.transaction_timeout_ms,
            }
        )
        started = time.monotonic()
        self._init_transactions(producer)
        self._proof_at = started
        self._producer = producer

    def _init_transactions(self, producer: Any) -> None:
        deadline = time.monotonic() + self.config.init_timeout_s
        while True:
            try:
                producer.init_transactions(max(deadline - time.monotonic(), 0.1))
                return
            except KafkaException as exc:
                err = exc.args[0]
                if err.retriable() and time.monotonic() < deadline:
                    time.sleep(0.1)
                    continue
                raise ShardLost(f"cannot take the shard's transactional id: {err}") from exc

    def send_allowed(self) -> bool:
        return time.monotonic() - self._proof_at < self.config.send_lease_ms / 1000

    def pending(self, caught_up: bool) -> bool:
        """Something to write now, even without new records (a proof of ownership)."""
        if time.monotonic() < self._retry_at:
            return False
        return bool(self.unwritten or self.replies or self.extra) or self._proof_due(caught_up)

    def _proof_due(self, caught_up: bool) -> bool:
        """Time to prove again that this owner still owns the shard (a heartbeat commit:
        while idle it keeps the send lease fresh and finds out about fencing)."""
        return (
            caught_up and time.monotonic() - self._proof_at >= self.config.proof_interval_ms / 1000
        )

    def write_due(self, caught_up: bool) -> bool:
        return time.monotonic() >= self._retry_at and bool(
            self.unwritten
            or self.replies
            or self.extra
            or self._proof_due(caught_up)
            or not self.send_allowed()
        )

    def transact(self, folded_offset: int) -> ShardLost | None:
        """Write the unwritten records and replies in one transaction. Returns ShardLost if
        this owner was fenced; an abortable failure is retried later."""
        c = self.config
        producer = self._producer
        items, replies = self.unwritten, self.replies
        started = time.monotonic()
        # The consumer offsets go through the group coordinator, which checks that this
        # process is still a member of the group's current generation (at most once per
        # proof interval: two more round trips).
        group = None
        if (
            self._group_metadata is not None
            and started - self._offsets_proof_at >= c.proof_interval_ms / 1000
        ):
            group = self._group_metadata()
        with_offsets = group is not None
        first_seq = self._seq
        delivered: dict[int, Envelope] = {}
        extra_offsets: list[int] = []
        try:
            producer.begin_transaction()
            for record, payload in items:
                assert payload is None, "system mutations carry no payload"
                self._seq += 1
                envelope = Envelope(f"{self.tenure}:{self._seq}", None, record)
                producer.produce(
                    c.topic,
                    value=encode_envelope(envelope),
                    partition=c.partition,
                    on_delivery=_keep_at_offset(delivered, envelope),
                )
            for reply_to, reply in replies:
                producer.produce(c.replies_topic, value=encode_reply(reply), key=reply_to)
            for topic, partition, key, value in self.extra:
                producer.produce(
                    topic,
                    value=value,
                    key=key,
                    partition=partition,
                    on_delivery=_offset_into(extra_offsets),
                )
            if not items and not replies and not self.extra and not with_offsets:
                # A proof with nothing to say: an empty transaction never reaches the
                # coordinator, so write a reply nobody waits for.
                proof = Reply(f"proof:{self.tenure}", _PROOF_OUTCOME)
                producer.produce(c.replies_topic, value=encode_reply(proof), key="proof")
            if with_offsets:
                offsets = [TopicPartition(c.topic, c.partition, folded_offset + 1)]
                producer.send_offsets_to_transaction(offsets, group, c.commit_timeout_s)
            self._commit_transaction(producer)
        except KafkaException as exc:
            self._seq = first_seq
            return self._failed(producer, exc.args[0])
        self._proof_at = started
        if with_offsets:
            self._offsets_proof_at = started
        if items:
            self.committed_seq = self._seq
            # commit_transaction flushed every delivery report of this transaction.
            self.written.update(delivered)
        self.unwritten, self.replies = [], []
        # Reported before the commit returned; an aborted try's reports were for records
        # no reader will ever see, so only a committed transaction's are kept.
        self.extra, self.extra_offsets = [], extra_offsets
        self.metrics.inc("nereus_shard_log_transactions_total", labels={"result": "committed"})
        return None

    def _commit_transaction(self, producer: Any) -> None:
        deadline = time.monotonic() + self.config.commit_timeout_s
        while True:
            try:
                producer.commit_transaction(max(deadline - time.monotonic(), 0.1))
                return
            except KafkaException as exc:
                err = exc.args[0]
                retry = err.retriable() and not err.txn_requires_abort()
                if retry and time.monotonic() < deadline:
                    continue
                raise

    def _failed(self, producer: Any, err: Any) -> ShardLost | None:
        """A transaction did not commit. Fenced (or fatal): the shard is lost. Abortable:
        abort, and write the same records again after a backoff."""
        self.metrics.inc("nereus_shard_log_transactions_total", labels={"result": "failed"})
        if err.fatal() or err.code() in _FENCED_CODES:
            self.log.warning("shard_log_fenced", partition=self.config.partition, error=str(err))
            return ShardLost(f"{self.config.transactional_id}: {err}")
        self.log.warning(
            "shard_log_transaction_aborted",
            partition=self.config.partition,
            error=str(err),
            records=len(self.unwritten),
        )
        try:
            producer.abort_transaction(self.config.commit_timeout_s)
        except KafkaException as exc:
            return ShardLost(f"cannot abort a failed transaction: {exc.args[0]}")
        self._retry_at = time.monotonic() + self.config.retry_backoff_ms / 1000
        return None

    def take_written(self, offset: int) -> Envelope | None:
        """The envelope this owner committed at `offset`, if it did (once)."""
        return self.written.pop(offset, None) if self.written else None

    def forget_written(self, folded_offset: int) -> None:
        """Drop what can no longer be read back (a record at or below the folded offset that
        the read skipped: the reader never saw it, so it was never committed for it)."""
        if self.written and min(self.written) <= folded_offset:
            self.written = {o: e for o, e in self.written.items() if o > folded_offset}

    def close(self) -> None:
        """Transactions never stay open between ticks, so there is nothing to abort; records
        not yet written are dropped (the next owner's recovery resolves the attempts they
        would have reported)."""
        self._producer = None
        if self.unwritten:
            self.log.info("shard_log_unwritten_dropped", records=len(self.unwritten))
        self.unwritten, self.replies, self.written = [], [], {}
        self.extra, self.extra_offsets = [], []


def _keep_at_offset(
    delivered: dict[int, Envelope], envelope: Envelope
) -> Callable[[Any, Any], None]:
    def on_delivery(err: Any, msg: Any) -> None:
        if err is None and msg.offset() >= 0:
            delivered[msg.offset()] = envelope

    return on_delivery


def _offset_into(offsets: list[int]) -> Callable[[Any, Any], None]:
    def on_delivery(err: Any, msg: Any) -> None:
        if err is None and msg.offset() >= 0:
            offsets.append(msg.offset())

    return on_delivery
