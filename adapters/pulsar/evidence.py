"""Evidence searches in Pulsar: every open attempt looked for in one read of each partition.

Theory of operation: a search gets a set of lookups (attempt id, topic, admission time). For
each topic it reads every partition once (`get_topic_partitions`; a non-partitioned topic is
its own single partition) with a non-durable Reader: seeked to the earliest admission time
less `find_slack_ms` (Pulsar seeks a reader by publish timestamp), then read until the
reader says no message is available, matching each record's `nereus-attempt-id` property
against the whole set. A record found is stamped with its own send time (or reveal time),
never its batch's earlier publish time (`adapters.pulsar.stamps`). A Reader is an
exclusive, non-durable subscription, so it sees records that a delayed handoff still holds
back from Shared consumers: the search finds an attempt as soon as the broker has it, not
when it becomes visible. A topic that does not exist holds nothing. The search is complete
when every partition was read to its end; a bound (`find_max_records`, `find_max_seconds`),
an unreachable broker or a cancellation leaves it incomplete. Pulsar's producers cannot be
fenced here, so a search never proves an attempt absent (`SearchOutcome.fence` stays None):
what it does not find stays UNKNOWN.

Searches run one at a time on the reader's own thread; the shard loop only polls the
handle, and is woken when it is done.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pulsar

from nereus.adapters.pulsar.outcomes import evidence_of
from nereus.adapters.pulsar.stamps import found_at_ms
from nereus.adapters.search import BackgroundSearch, SearchWorker
from nereus.kernel.records import Evidence
from nereus.runtime.destination import (
    H_ATTEMPT_ID,
    Lookup,
    SearchOutcome,
)
from nereus.runtime.log import Logger

_READ_TIMEOUT_MS = 2_000


@dataclass(frozen=True)
class SearchLimits:
    slack_ms: int
    max_records: int
    max_seconds: float


class PulsarEvidenceReader(SearchWorker):
    failures = (pulsar.PulsarException, RuntimeError, ValueError)
    failure_event = "pulsar_search_failed"

    def __init__(
        self,
        client: Any,
        name: str,
        limits: SearchLimits,
        log: Logger,
        clock_ms: Callable[[], int],
    ) -> None:
        super().__init__(name, log)
        self._client = client
        self._limits = limits
        self._clock_ms = clock_ms

    def run_search(self, handle: BackgroundSearch) -> SearchOutcome:
        started = time.monotonic()
        wanted = {lk.attempt_id: lk for lk in handle.lookups}
        since = self.since_by_topic(handle.lookups)
        found: dict[str, Evidence] = {}
        complete = True
        scanned = 0
        read: list[str] = []
        deadline = started + self._limits.max_seconds
        for topic, since_ms in since.items():
            try:
                partitions = self._client.get_topic_partitions(topic)
            except pulsar.TopicNotFound:
                continue  # no such topic: nothing can be in it
            for partition in partitions:
                done, n = self._read(
                    partition,
                    since_ms,
                    wanted=wanted,
                    found=found,
                    handle=handle,
                    deadline=deadline,
                    scanned_before=scanned,
                )
                scanned += n
                read.append(partition)
                if not done:
                    complete = False
                    break
            if not complete or len(found) == len(wanted):
                break
        complete = complete or len(found) == len(wanted)
        self.log_done(
            "pulsar_search_done",
            started,
            lookups=len(wanted),
            found=len(found),
            complete=complete,
            partitions=len(read),
            records=scanned,
        )
        searched = ", ".join(read[:8]) + (f" and {len(read) - 8} more" if len(read) > 8 else "")
        return SearchOutcome(found, complete=complete, searched=searched)

    def _read(
        self,
        partition: str,
        since_ms: int,
        *,
        wanted: dict[str, Lookup],
        found: dict[str, Evidence],
        handle: BackgroundSearch,
        deadline: float,
        scanned_before: int,
    ) -> tuple[bool, int]:
        """Read one partition from `since_ms` less the slack to its end: (read to the end,
        records read)."""
        reader = self._client.create_reader(
            partition, pulsar.MessageId.earliest, reader_name=f"{self.name}-evidence"
        )
        scanned = 0
        try:
            reader.seek(max(since_ms - self._limits.slack_ms, 0))
            while reader.has_message_available():
                if handle.cancelled.is_set() or self.stopping.is_set():
                    return False, scanned
                if (
                    scanned_before + scanned >= self._limits.max_records
                    or time.monotonic() > deadline
                ):
                    self.log.warning("pulsar_search_bounded", records=scanned, partition=partition)
                    return False, scanned
                msg = reader.read_next(_READ_TIMEOUT_MS)
                scanned += 1
                properties = msg.properties()
                aid = properties.get(H_ATTEMPT_ID)
                if aid is not None and aid in wanted and aid not in found:
                    msg_id = msg.message_id()
                    stamped_ms = found_at_ms(
                        properties, msg.publish_timestamp(), msg_id.batch_index(), self._clock_ms()
                    )
                    found[aid] = evidence_of(msg.topic_name(), msg_id, stamped_ms)
                    if len(found) == len(wanted):
                        return True, scanned
            return True, scanned
        finally:
            reader.close()
