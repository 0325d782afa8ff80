"""Evidence searches in Kafka: every open attempt looked for in one read of each partition.

Theory of operation: a search gets a set of lookups (attempt id, topic, admission time). For
each topic it takes, per partition, the offset of the first record at or after the earliest
admission time less `find_slack_ms` (`list_offsets` for a timestamp) and the partition's end
(`list_offsets` latest, read_uncommitted: the log end itself, not the last stable offset,
which another producer's open transaction can hold back below records that are already
committed). It then reads every partition from its start to that end with an assign-only
`read_committed` consumer that never joins or commits to a group, and matches each record's
`nereus-attempt-id` header against the whole set. A partition is done when a record at or
past `end - 1` arrives, or the consumer reports the partition's end at or past `end`
(`read_committed` stops at the last stable offset, so an end reported below `end` only means
"wait": another transaction is still open). The search is complete when every partition is
done; a bound (`find_max_records`, `find_max_seconds`), an unreachable broker or a
cancellation leaves it incomplete, and an incomplete search proves nothing by what it did not
find.

When the destination's producer can be fenced (the transactional capability), the search
first waits until the producer has fenced its predecessors (`fence`), and only then takes
the end offsets: every record a fenced producer could still make visible is below them, so a
complete search that misses an attempt sent under that fence proves it absent. The proof
also rests on one stated assumption, the clock slack: a record is never stamped more than
`find_slack_ms` before its admission's persistence time (broker clocks on LogAppendTime
topics, the producer's clock on CreateTime topics).

Searches run one at a time on the reader's own thread, which alone uses its consumer; the
shard loop only polls the handle (`KafkaSearch`), and is woken when it is done.
"""

from __future__ import annotations

import queue
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, IsolationLevel, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._listoffsets import OffsetSpec

from kernel.records import Evidence
from runtime.destination import H_ATTEMPT_ID, Fence, Lookup, SearchOutcome
from runtime.log import Logger

# Records asked of the consumer per call while scanning.
_CONSUME_BATCH = 1_000


@dataclass(frozen=True)
class SearchLimits:
    slack_ms: int
    max_records: int
    max_seconds: float
    admin_timeout_s: float


class KafkaSearch:
    """A search handle (`runtime.destination.Search`) the reader thread completes."""

    def __init__(self, lookups: Sequence[Lookup], wake: Callable[[], None]) -> None:
        self.lookups = list(lookups)
        self._wake = wake
        self._done = threading.Event()
        self.cancelled = threading.Event()
        self._outcome: SearchOutcome | None = None

    def done(self) -> bool:
        return self._done.is_set()

    def outcome(self) -> SearchOutcome:
        assert self._outcome is not None, "outcome() before done()"
        return self._outcome

    def cancel(self) -> None:
        self.cancelled.set()

    def wait(self, timeout_s: float) -> bool:
        return self._done.wait(timeout_s)

    def finish(self, outcome: SearchOutcome) -> None:
        self._outcome = outcome
        self._done.set()
        self._wake()


class EvidenceReader:
    """The searches of one destination, run one at a time on their own thread."""

    def __init__(
        self,
        common: dict[str, Any],
        name: str,
        limits: SearchLimits,
        log: Logger,
        *,
        fence: Callable[[threading.Event], Fence | None] | None = None,
    ) -> None:
        self._common = common
        self._name = name
        self._limits = limits
        self.log = log
        # Waits until the producer fenced its predecessors (None: it cannot, or gave up).
        self._fence = fence
        self._queue: queue.Queue[KafkaSearch] = queue.Queue()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._consumer: Any = None
        self._admin: Any = None
        self._lock = threading.Lock()

    def search(self, lookups: Sequence[Lookup], wake: Callable[[], None]) -> KafkaSearch:
        handle = KafkaSearch(lookups, wake)
        with self._lock:
            if self._stop.is_set():
                handle.finish(SearchOutcome({}, complete=False, error="destination closed"))
                return handle
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._serve, name=f"{self._name}-evidence", daemon=True
                )
                self._thread.start()
        self._queue.put(handle)
        return handle

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                handle = self._queue.get(timeout=0.2)
            except queue.Empty:
                continue
            try:
                outcome = self._run(handle)
            except (KafkaException, RuntimeError, ValueError) as exc:
                self.log.warning("kafka_search_failed", error=str(exc))
                outcome = SearchOutcome({}, complete=False, error=str(exc))
            handle.finish(outcome)
        while not self._queue.empty():
            self._queue.get_nowait().finish(
                SearchOutcome({}, complete=False, error="destination closed")
            )

    # One search ---------------------------------------------------------------------------

    def _run(self, handle: KafkaSearch) -> SearchOutcome:
        started = time.monotonic()
        cancelled = handle.cancelled
        fence: Fence | None = None
        if self._fence is not None:
            fence = self._fence(cancelled)
            if fence is None:
                return SearchOutcome({}, complete=False, error="the producer is not fenced yet")
        wanted: dict[bytes, Lookup] = {lk.attempt_id.encode(): lk for lk in handle.lookups}
        since: dict[str, int] = {}
        for lk in handle.lookups:
            since[lk.topic] = min(since.get(lk.topic, lk.since_ms), lk.since_ms)
        ranges = self._ranges(since)
        found, complete, scanned = self._scan(ranges, wanted, cancelled, started)
        searched = _describe(ranges)
        self.log.info(
            "kafka_search_done",
            lookups=len(wanted),
            found=len(found),
            complete=complete,
            partitions=len(ranges),
            records=scanned,
            took_ms=int((time.monotonic() - started) * 1000),
        )
        return SearchOutcome(found, complete=complete, fence=fence, searched=searched)

    def _ranges(self, since: dict[str, int]) -> dict[tuple[str, int], tuple[int, int]]:
        """(topic, partition) -> (first offset to read, end offset) for every partition
        that may hold a record; a topic that does not exist holds none."""
        consumer = self._client()
        admin = self._admin_client()
        timeout_s = self._limits.admin_timeout_s
        starts: dict[TopicPartition, Any] = {}
        ends: dict[TopicPartition, Any] = {}
        for topic, since_ms in since.items():
            meta = consumer.list_topics(topic, timeout=timeout_s).topics.get(topic)
            if meta is None or meta.error is not None:
                if meta is not None and meta.error.code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                    raise RuntimeError(f"cannot read the metadata of {topic}: {meta.error}")
                continue  # no such topic: nothing can be in it
            from_ms = max(since_ms - self._limits.slack_ms, 0)
            for p in meta.partitions:
                starts[TopicPartition(topic, p)] = OffsetSpec.for_timestamp(from_ms)
                ends[TopicPartition(topic, p)] = OffsetSpec.latest()  # type: ignore[no-untyped-call]
        if not starts:
            return {}
        level = IsolationLevel.READ_UNCOMMITTED
        start_offsets = _offsets(admin.list_offsets(starts, isolation_level=level), timeout_s)
        end_offsets = _offsets(admin.list_offsets(ends, isolation_level=level), timeout_s)
        ranges: dict[tuple[str, int], tuple[int, int]] = {}
        for key, end in end_offsets.items():
            start = start_offsets[key]
            # -1: no record at or after the timestamp, so none this search could want.
            if start >= 0 and start < end:
                ranges[key] = (start, end)
        return ranges

    def _scan(
        self,
        ranges: dict[tuple[str, int], tuple[int, int]],
        wanted: dict[bytes, Lookup],
        cancelled: threading.Event,
        started: float,
    ) -> tuple[dict[str, Evidence], bool, int]:
        found: dict[str, Evidence] = {}
        if not ranges:
            return found, True, 0
        consumer = self._client()
        ends = {key: end for key, (_start, end) in ranges.items()}
        consumer.assign([TopicPartition(t, p, s) for (t, p), (s, _e) in ranges.items()])
        deadline = started + self._limits.max_seconds
        scanned = 0
        try:
            while ends and len(found) < len(wanted):
                if cancelled.is_set() or self._stop.is_set():
                    break
                if scanned >= self._limits.max_records or time.monotonic() > deadline:
                    self.log.warning(
                        "kafka_search_bounded", records=scanned, partitions_left=len(ends)
                    )
                    break
                for m in consumer.consume(num_messages=_CONSUME_BATCH, timeout=0.2):
                    key = (m.topic(), m.partition())
                    err = m.error()
                    if err is not None:
                        if err.code() == KafkaError._PARTITION_EOF:
                            if key in ends and m.offset() >= ends[key]:
                                del ends[key]
                        elif err.fatal():
                            raise RuntimeError(f"cannot read {key[0]}: {err}")
                        continue
                    scanned += 1
                    for name, value in m.headers() or ():
                        if name == H_ATTEMPT_ID:
                            lookup = wanted.get(value)
                            if lookup is not None and lookup.attempt_id not in found:
                                found[lookup.attempt_id] = Evidence(
                                    str(m.topic()),
                                    int(m.partition()),
                                    int(m.offset()),
                                    m.timestamp()[1],
                                )
                            break
                    end = ends.get(key)
                    if end is not None and m.offset() >= end - 1:
                        del ends[key]
        finally:
            consumer.unassign()
        # Everything wanted was found: the rest of the read could not change the answer.
        complete = not ends or len(found) == len(wanted)
        return found, complete, scanned

    # Clients --------------------------------------------------------------------------------

    def _client(self) -> Any:
        if self._consumer is None:
            self._consumer = Consumer(
                {
                    **self._common,
                    "client.id": f"{self._name}-evidence",
                    # Required by the client; never joined (assign only) nor committed to.
                    "group.id": f"nereus-evidence-{uuid.uuid4().hex}",
                    "enable.auto.commit": False,
                    "enable.auto.offset.store": False,
                    "isolation.level": "read_committed",
                    "enable.partition.eof": True,
                    "auto.offset.reset": "earliest",
                    "fetch.wait.max.ms": 50,
                }
            )
        return self._consumer

    def _admin_client(self) -> Any:
        if self._admin is None:
            self._admin = AdminClient({**self._common, "client.id": f"{self._name}-evidence"})
        return self._admin

    def close(self, timeout_s: float = 5.0) -> None:
        with self._lock:
            self._stop.set()
            thread = self._thread
        if thread is not None:
            thread.join(timeout_s)
        if self._consumer is not None and (thread is None or not thread.is_alive()):
            self._consumer.close()
            self._consumer = None


def _describe(ranges: dict[tuple[str, int], tuple[int, int]], shown: int = 8) -> str:
    """The partitions read and their end offsets, short enough to go into every proof."""
    if not ranges:
        return "no partition held a record from the search's start on"
    items = sorted(ranges.items())
    text = ", ".join(f"{t}[{p}] to {end}" for (t, p), (_start, end) in items[:shown])
    more = len(items) - shown
    return text + (f" and {more} more partitions" if more > 0 else "")


def _offsets(futures: dict[TopicPartition, Any], timeout_s: float) -> dict[tuple[str, int], int]:
    out: dict[tuple[str, int], int] = {}
    for tp, future in futures.items():
        out[(tp.topic, tp.partition)] = int(future.result(timeout=timeout_s).offset)
    return out
