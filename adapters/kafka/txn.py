"""The transactional capability: sends as Kafka transactions, absence provable by a fence.

Theory of operation: one producer with a stable `transactional.id` (per shard and destination
cluster) sends, on its own thread. The thread first calls `init_transactions()`, which makes
the broker finish whatever an earlier producer under the same id left open (abort it, or
complete a commit it had already asked for) and fences that producer: it can never commit
again. From then on the records of those earlier producers are exactly what the
`read_committed` view shows, which is what lets an evidence search prove an attempt absent
(`adapters.kafka.evidence`).

The sends submitted since the last transaction go out as the next one: begin, produce each,
commit. The outcome of a send follows the transaction's:

* committed: PUBLISHED, with the partition, offset and timestamp of its delivery report;
* aborted (the broker refused a record, a request timed out, ...): every send of it is
  definitely absent. The one the broker refused is NOT_PUBLISHED as
  `adapters.kafka.outcomes.classify_aborted` says; a send aborted for no fault of its own
  (a batch-mate's refusal, and the epoch bump librdkafka needs after one, which can fail the
  next transaction too) goes out again in the next transaction, up to `max_aborts` times,
  and is then reported NOT_PUBLISHED retriable;
* neither known (the commit or the abort itself failed without saying): the sends are in
  doubt. The thread replaces the producer (a new `init_transactions` fences the old one, so
  its transaction is now finished one way or the other) and searches for them; each is then
  PUBLISHED with the evidence found or NOT_PUBLISHED with the proof of absence. UNKNOWN is
  never reported for a send this producer made while it owned its id;
* fenced (another producer took the id: this process is a zombie, or two stores share an
  id): the sends of the open transaction are UNKNOWN, every later send is NOT_PUBLISHED
  (never produced), and the thread never takes the id back.

A transaction is never left open between rounds, so stopping the thread leaves nothing for
the broker to time out; sends still queued at stop are simply not sent (their attempts stay
PUBLISHING in the log, and the next start proves them absent).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from confluent_kafka import KafkaError, KafkaException, Producer

from nereus.adapters.kafka.outcomes import (
    classify_aborted,
    classify_produce_exception,
    report_evidence,
)
from nereus.kernel.records import NotPublished, Published, Unknown
from nereus.runtime.destination import Fence, Lookup, PublishResult, Send, SendResult, proven_absent
from nereus.runtime.log import Logger

# Errors that mean another producer took the transactional id.
FENCED_CODES = frozenset(
    {
        KafkaError._FENCED,
        KafkaError.PRODUCER_FENCED,
        KafkaError.INVALID_PRODUCER_EPOCH,
        KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    }
)

CommitResult = Literal["committed", "aborted", "in_doubt", "fenced"]


@dataclass(frozen=True)
class Outgoing:
    send: Send
    upper_bytes: int  # an upper bound of its encoded size (kafka_outcomes)
    now_ms: int  # wall clock at submit: its record cannot be stamped much earlier
    aborts: int = 0  # transactions it was in that were aborted


@dataclass(frozen=True)
class TxnSettings:
    transactional_id: str
    init_timeout_s: float
    commit_timeout_s: float
    max_sends: int
    retry_backoff_s: float
    close_timeout_s: float
    # A send whose transaction was aborted for no fault of its own is sent again in the next
    # one, up to this many times, before it is reported retriable.
    max_aborts: int = 3


class TransactionalSender:
    def __init__(
        self,
        conf: dict[str, Any],
        settings: TxnSettings,
        *,
        deliver: Callable[[list[SendResult]], None],
        fits_alone: Callable[[str, int], bool],
        log: Logger,
    ) -> None:
        self._conf = {**conf, "transactional.id": settings.transactional_id}
        self.settings = settings
        self._deliver = deliver
        self._fits_alone = fits_alone
        self.log = log
        # Set by the destination once its evidence reader exists (in-doubt resolution).
        self.search: Callable[[Sequence[Lookup]], Any] | None = None
        self._cond = threading.Condition()
        self._queue: list[Outgoing] = []
        self._in_doubt: list[Outgoing] = []
        self._producer: Any = None
        self._fence: Fence | None = None
        self._fenced = threading.Event()
        self._lost: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._serve, name=f"nereus-txn-{settings.transactional_id}", daemon=True
        )
        self.transactions = 0

    def start(self) -> None:
        self._thread.start()

    def submit(self, outgoing: Sequence[Outgoing]) -> None:
        with self._cond:
            self._queue.extend(outgoing)
            self._cond.notify()

    def wait_fenced(self, cancelled: threading.Event, timeout_s: float = 30.0) -> Fence | None:
        """The fence of the current producer, once it has one; None if it cannot get one in
        `timeout_s` (a search then stays incomplete and is tried again later)."""
        deadline = time.monotonic() + timeout_s
        while not self._fenced.wait(0.1):
            if cancelled.is_set() or self._stop.is_set() or time.monotonic() > deadline:
                return None
        return self._fence

    # The thread ---------------------------------------------------------------------------

    def _serve(self) -> None:
        while not self._stop.is_set():
            if self._lost is not None:
                self._refuse_queued()
                continue
            if self._producer is None and not self._init():
                self._stop.wait(self.settings.retry_backoff_s)
                continue
            if self._in_doubt:
                self._resolve_in_doubt()
                continue
            batch = self._take(0.05)
            if batch:
                self._transact(batch)

    def _take(self, wait_s: float) -> list[Outgoing]:
        with self._cond:
            if not self._queue:
                self._cond.wait(wait_s)
            batch = self._queue[: self.settings.max_sends]
            del self._queue[: len(batch)]
        return batch

    def _init(self) -> bool:
        """A new producer under the id, fencing every earlier one. False to try again."""
        self._fenced.clear()
        producer = Producer(self._conf)
        deadline = time.monotonic() + self.settings.init_timeout_s
        while not self._stop.is_set():
            try:
                producer.init_transactions(min(1.0, max(deadline - time.monotonic(), 0.1)))
                break
            except KafkaException as exc:
                err = exc.args[0]
                if err.retriable() and time.monotonic() < deadline:
                    continue
                self.log.error(
                    "kafka_transactions_unavailable",
                    transactional_id=self.settings.transactional_id,
                    error=str(err),
                )
                return False
        else:
            return False
        self._producer = producer
        self._fence = Fence(self.settings.transactional_id, int(time.time() * 1000))
        self._fenced.set()
        self.log.info("kafka_producer_fenced_predecessors", fence=self._fence.fence_id)
        return True

    def _transact(self, batch: list[Outgoing]) -> None:
        producer = self._producer
        try:
            producer.begin_transaction()
        except KafkaException as exc:
            # Nothing was produced: the batch goes out in the next transaction.
            self._requeue(batch)
            self._producer_failed(exc.args[0])
            return
        reports: dict[int, tuple[Any, Any]] = {}
        results: list[SendResult] = []
        produced: list[tuple[int, Outgoing]] = []
        for index, out in enumerate(batch):
            p = out.send.prepared
            try:
                producer.produce(
                    p.topic,
                    value=p.value,
                    key=p.key,
                    headers=list(out.send.headers()),
                    on_delivery=_reporter(reports, index),
                )
                produced.append((index, out))
            except BufferError as exc:
                results.append(
                    SendResult.of(out.send, NotPublished("retriable", "queue_full", str(exc)))
                )
            except KafkaException as exc:
                results.append(SendResult.of(out.send, classify_produce_exception(exc.args[0])))
        verdict = self._commit(producer)
        producer.poll(0)
        self.transactions += 1
        again: list[Outgoing] = []
        for index, out in produced:
            err, msg = reports.get(index, (None, None))
            result = self._outcome(verdict, out, err, msg)
            if result is None:
                self._in_doubt.append(out)
            elif verdict == "aborted" and _innocent(err) and out.aborts < self.settings.max_aborts:
                # Absent, and not for anything of its own (a batch-mate's refusal, the epoch
                # bump that follows one): it goes out in the next transaction.
                again.append(dataclasses.replace(out, aborts=out.aborts + 1))
            else:
                results.append(SendResult.of(out.send, result))
        if again:
            self._requeue(again)
        if verdict in ("in_doubt", "fenced"):
            self._producer = None
            self._fenced.clear()
        if results:
            self._deliver(results)

    def _outcome(
        self, verdict: CommitResult, out: Outgoing, err: Any, msg: Any
    ) -> PublishResult | None:
        """A send's outcome under its transaction's verdict; None when it is in doubt."""
        if verdict == "committed":
            evidence = None if err is not None or msg is None else report_evidence(msg, out.now_ms)
            return Published(evidence) if evidence is not None else None
        if verdict == "aborted":
            topic = out.send.prepared.topic
            return classify_aborted(err, fits_alone=self._fits_alone(topic, out.upper_bytes))
        if verdict == "fenced":
            return Unknown("producer_fenced", self._lost or "")
        return None

    def _commit(self, producer: Any) -> CommitResult:
        deadline = time.monotonic() + self.settings.commit_timeout_s
        while True:
            try:
                producer.commit_transaction(max(deadline - time.monotonic(), 0.1))
                return "committed"
            except KafkaException as exc:
                err = exc.args[0]
                if self._is_fenced(err):
                    return "fenced"
                if err.txn_requires_abort():
                    return self._abort(producer, err)
                if err.retriable() and not err.fatal() and time.monotonic() < deadline:
                    continue
                self.log.warning("kafka_commit_in_doubt", error=str(err))
                return "in_doubt"

    def _abort(self, producer: Any, cause: Any) -> CommitResult:
        try:
            producer.abort_transaction(self.settings.commit_timeout_s)
        except KafkaException as exc:
            err = exc.args[0]
            if self._is_fenced(err):
                return "fenced"
            self.log.warning("kafka_abort_in_doubt", error=str(err), cause=str(cause))
            return "in_doubt"
        self.log.warning("kafka_transaction_aborted", cause=str(cause))
        return "aborted"

    def _is_fenced(self, err: Any) -> bool:
        if err.code() not in FENCED_CODES:
            return False
        self._lost = f"{self.settings.transactional_id}: {err}"
        self.log.error("kafka_producer_fenced", transactional_id=self.settings.transactional_id)
        return True

    def _producer_failed(self, err: Any) -> None:
        if not self._is_fenced(err):
            self.log.warning("kafka_producer_replaced", error=str(err))
        self._producer = None
        self._fenced.clear()

    def _requeue(self, batch: list[Outgoing]) -> None:
        with self._cond:
            self._queue[:0] = batch

    def _refuse_queued(self) -> None:
        batch = self._take(0.2)
        if batch:
            refused = NotPublished("retriable", "producer_fenced", self._lost or "")
            self._deliver([SendResult.of(out.send, refused) for out in batch])

    def _resolve_in_doubt(self) -> None:
        """After the producer was replaced (the new one fenced the old), settle the sends of
        the transaction whose end was not known, by one search."""
        assert self.search is not None, "the destination wires its evidence reader first"
        lookups = [
            Lookup(o.send.attempt_id, o.send.prepared.topic, o.now_ms) for o in self._in_doubt
        ]
        handle = self.search(lookups)
        while not handle.wait(0.2):
            if self._stop.is_set():
                handle.cancel()
                return
        outcome = handle.outcome()
        tid = self.settings.transactional_id
        proofs = {
            aid: outcome.proof_for(tid, aid)
            for aid in (o.send.attempt_id for o in self._in_doubt)
            if aid not in outcome.found
        }
        if None in proofs.values():
            self._stop.wait(self.settings.retry_backoff_s)  # try again: never guess
            return
        results: list[SendResult] = []
        for out in self._in_doubt:
            evidence = outcome.found.get(out.send.attempt_id)
            result: PublishResult
            if evidence is not None:
                result = Published(evidence)
            else:
                proof = proofs[out.send.attempt_id]
                assert proof is not None  # checked above: a send not found needs the proof
                result = proven_absent(proof, "the transaction did not commit")
            results.append(SendResult.of(out.send, result))
        self._in_doubt = []
        self.log.info("kafka_in_doubt_settled", sends=len(results), found=len(outcome.found))
        self._deliver(results)

    def close(self) -> None:
        self._stop.set()
        with self._cond:
            self._cond.notify()
        if self._thread.is_alive():
            self._thread.join(self.settings.close_timeout_s)
        if not self._thread.is_alive():
            self._producer = None


def _innocent(err: Any) -> bool:
    """A send of an aborted transaction with no error of its own (or purged by the abort)."""
    return err is None or err.code() in (KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT)


def _reporter(reports: dict[int, tuple[Any, Any]], index: int) -> Callable[[Any, Any], None]:
    def on_delivery(err: Any, msg: Any) -> None:
        reports[index] = (err, msg)

    return on_delivery
