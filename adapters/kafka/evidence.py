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
shard loop only polls the handle, and is woken when it is done.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, IsolationLevel, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._listoffsets import OffsetSpec

from nereus.adapters.search import BackgroundSearch, SearchWorker
from nereus.kernel.records import Evidence
from nereus.runtime.destination import (
    H_ATTEMPT_ID,
    Fence,
    Lookup,
    SearchOutcome,
)
from nereus.runtime.log import Logger

# Records asked of the consumer per call while scanning.
_CONSUME_BATCH = 1_000
# confluent-kafka leaves this constructor unannotated; bound to a typed name once, the call
# type-checks the same whether mypy sees the installed package (the dev environment) or
# none at all (the isolated environment mypyc builds in), so no `type: ignore` is needed.
_latest_offset: Callable[[], Any] = OffsetSpec.latest


@dataclass(frozen=True)
class SearchLimits:
    slack_ms: int
    max_records: int
    max_seconds: float
    admin_timeout_s: float


class EvidenceReader(SearchWorker):
    """The searches of one destination, run one at a time on their own thread, which alone
    uses the consumer."""

    # TimeoutError: an admin call (list_offsets) not answered within its timeout.
    failures = (KafkaException, RuntimeError, ValueError, TimeoutError)
    failure_event = "kafka_search_failed"

    def __init__(
        self,
        common: dict[str, Any],
        name: str,
        limits: SearchLimits,
        log: Logger,
        *,
        fence: Callable[[threading.Event], Fence | None] | None = None,
    ) -> None:
        super().__init__(name, log)
        self._common = common
        self._limits = limits
        # Waits until the producer fenced its predecessors (None: it cannot, or gave up).
        self._fence = fence
        self._consumer: Any = None
        self._admin: Any = None

    # One search ---------------------------------------------------------------------------

    def run_search(self, handle: BackgroundSearch) -> SearchOutcome:
        started = time.monotonic()
        cancelled = handle.cancelled
        fence: Fence | None = None
        if self._fence is not None:
            fence = self._fence(cancelled)
            if fence is None:
                return SearchOutcome({}, complete=False, error="the producer is not fenced yet")
        wanted: dict[bytes, Lookup] = {lk.attempt_id.encode(): lk for lk in handle.lookups}
        ranges = self._ranges(self.since_by_topic(handle.lookups))
        found, complete, scanned = self._scan(ranges, wanted, cancelled, started)
        searched = _describe(ranges)
        self.log_done(
            "kafka_search_done",
            started,
            lookups=len(wanted),
            found=len(found),
            complete=complete,
            partitions=len(ranges),
            records=scanned,
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
                ends[TopicPartition(topic, p)] = _latest_offset()
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
                if cancelled.is_set() or self.stopping.is_set():
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
                    "client.id": f"{self.name}-evidence",
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
            self._admin = AdminClient({**self._common, "client.id": f"{self.name}-evidence"})
        return self._admin

    def close(self, timeout_s: float = 5.0) -> bool:
        stopped = super().close(timeout_s)
        if stopped and self._consumer is not None:
            self._consumer.close()
            self._consumer = None
        return stopped


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
