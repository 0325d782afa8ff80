"""What the shard runtime reports: the tally of each commit's entries, and its gauges.

Theory of operation: a commit folds many entries; counting each into the shared registry
would take its lock once per entry and series. A `Tally` collects one commit's counts (by
record type and code, publish outcomes by class, Admissions won or stale) and its fire lags,
split in two: deliverAt to the won Admission's persistence time (discovery, the claim and
the Admission's commit), and deliverAt to the publish (that, then the send), and writes them
in one update per series after the commit. It only counts: what a folded
entry means for claims, lanes or dead-letter copies is the runtime's to act on. The gauges
(claims, sends waiting, messages by status, obligations, recovery, clock error bound, due
backlog) are set once per tick.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from nereus.kernel.effects import EntryOutcome
from nereus.kernel.keys import timeline_key
from nereus.kernel.records import PublishAdmission, Published, PublishOutcome, Record
from nereus.kernel.timing import TrustedInterval
from nereus.runtime.log import Logger
from nereus.runtime.metrics import LabelKey, Metrics
from nereus.storage.store import ShardStore

BACKLOG_COUNT_LIMIT = 1_000_000


@dataclass
class Tally:
    """What one commit's entries add to the metrics, written in one update per series.
    `recovered`: whether this runtime has recovered, so that a delivery it observes is its
    own (a former owner's deliveries were measured by that owner)."""

    log: Logger
    recovered: bool
    counts: dict[tuple[str, LabelKey], int] = field(default_factory=dict)
    fire_lags_s: list[float] = field(default_factory=list)
    admission_lags_s: list[float] = field(default_factory=list)

    def count(self, name: str, *labels: tuple[str, str]) -> None:
        series = (name, labels)
        self.counts[series] = self.counts.get(series, 0) + 1

    def entry(self, record: Record, outcome: EntryOutcome, persisted_at_ms: int) -> None:
        """One folded record (or batch item) and its outcome; `persisted_at_ms`: its log
        entry's persistence time."""
        self.count("nereus_entries_total", ("code", outcome.code), ("type", outcome.record_type))
        if isinstance(record, PublishOutcome):
            if outcome.applied:
                self._outcome(record, outcome)
        elif isinstance(record, PublishAdmission):
            self.count("nereus_admissions_total", ("result", "won" if outcome.applied else "stale"))
            if outcome.applied and outcome.deliver_at_ms is not None and self.recovered:
                # Negative only where a delayed-handoff destination admits before deliverAt.
                lag_ms = persisted_at_ms - outcome.deliver_at_ms
                self.admission_lags_s.append(max(lag_ms, 0) / 1000)

    def _outcome(self, record: PublishOutcome, outcome: EntryOutcome) -> None:
        result = record.result
        self.count("nereus_outcomes_total", ("class", str(type(result).__struct_config__.tag)))
        if isinstance(result, Published) and outcome.deliver_at_ms is not None and self.recovered:
            lag_ms = result.evidence.timestamp_ms - outcome.deliver_at_ms
            self.fire_lags_s.append(max(lag_ms, 0) / 1000)
            if lag_ms < 0:
                self.count("nereus_early_deliveries_total")
                self.log.error("early_delivery", attempt_id=outcome.attempt_id, lag_ms=lag_ms)

    def write(self, metrics: Metrics) -> None:
        for (name, labels), count in self.counts.items():
            metrics.inc(name, count, dict(labels))
        if self.fire_lags_s:
            metrics.observe_many("nereus_fire_lag_seconds", self.fire_lags_s)
        if self.admission_lags_s:
            metrics.observe_many("nereus_admission_lag_seconds", self.admission_lags_s)


class Gauges:
    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self._last_backlog_ms = 0
        describe(metrics)

    def update(
        self,
        store: ShardStore,
        interval: TrustedInterval,
        now_ms: int,
        *,
        claims: int,
        sends_waiting: int,
        recovering: int,
    ) -> None:
        m = self.metrics
        m.set("nereus_claims_inflight", claims)
        m.set("nereus_pending_sends", sends_waiting)
        c = store.meta.counters
        m.set("nereus_messages", c.scheduled, {"status": "scheduled"})
        m.set("nereus_messages", c.publishing, {"status": "publishing"})
        m.set("nereus_messages", c.uncertain, {"status": "uncertain"})
        m.set("nereus_open_obligations", c.attempts_publishing + c.attempts_unknown)
        m.set("nereus_recovery_pending_attempts", recovering)
        m.set("nereus_dead_letters_pending", c.dead_letters_pending)
        m.set("nereus_applied_position", store.meta.position)
        bounded = interval.bounded
        m.set("nereus_clock_error_bound_seconds", interval.width_ms / 2000 if bounded else -1)
        if now_ms - self._last_backlog_ms >= 1000 and bounded:
            # Counted at most once a second and at most BACKLOG_COUNT_LIMIT rows: a scan.
            self._last_backlog_ms = now_ms
            stop = timeline_key(interval.earliest_ms + 1, "00" * 16, 0)
            with store.read() as view:
                backlog = view.count_timeline_before(stop, BACKLOG_COUNT_LIMIT)
            m.set("nereus_due_backlog", backlog)


def describe(m: Metrics) -> None:
    m.describe(
        "nereus_entries_total",
        "counter",
        "Shard log entries applied, by record type and outcome code.",
    )
    m.describe("nereus_outcomes_total", "counter", "Publish outcomes recorded, by class.")
    m.describe("nereus_admissions_total", "counter", "Publish Admissions applied, won or stale.")
    m.describe(
        "nereus_fire_lag_seconds", "histogram", "deliveredAt minus deliverAt of published attempts."
    )
    m.describe(
        "nereus_admission_lag_seconds",
        "histogram",
        "The won Admission's persistence time minus deliverAt (0 when before it).",
    )
    m.describe(
        "nereus_early_deliveries_total", "counter", "Deliveries before deliverAt (must stay 0)."
    )
    m.describe("nereus_claims_inflight", "gauge", "Local claims held.")
    m.describe("nereus_pending_sends", "gauge", "Admitted attempts waiting for their send.")
    m.describe("nereus_messages", "gauge", "Messages by status.")
    m.describe("nereus_open_obligations", "gauge", "Attempts PUBLISHING or UNKNOWN.")
    m.describe(
        "nereus_recovery_pending_attempts",
        "gauge",
        "Attempts open at the last restart or takeover whose evidence search has not settled.",
    )
    m.describe(
        "nereus_dead_letters_pending", "gauge", "Dead-letter copies owed and not yet recorded."
    )
    m.describe(
        "nereus_dead_letters_total",
        "counter",
        "Dead-letter copy writes: written, failed (retried after a backoff), found by lookup.",
    )
    m.describe("nereus_applied_position", "gauge", "appliedShardLogPosition.")
    m.describe(
        "nereus_clock_error_bound_seconds",
        "gauge",
        "Half-width of the trusted interval; -1 when unbounded.",
    )
    m.describe("nereus_http_requests_total", "counter", "HTTP requests by route and status.")
    m.describe(
        "nereus_due_backlog", "gauge", "Timeline work already due (counted up to 1,000,000)."
    )
