"""Fire lag split in two (specs/compiled.md, "Where fire lag goes"): the runtime reports
`nereus_admission_lag_seconds`, the won Admission's persistence time minus deliverAt, beside
`nereus_fire_lag_seconds`, the publish's time minus deliverAt. The first part is what
discovery, the claim and the Admission's commit took; the rest is the send.

The expected values come from the store's own rows (each attempt's `admitted_at_ms`, each
message's `deliver_at_ms`) and the destination's records, not from the tally: the histogram
must hold exactly one observation per won Admission, whose sum is the sum of those
differences, and the part can never exceed the whole, because a send starts only after its
Admission is durable.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nereus.adapters.clock import SimulatedClock
from nereus.kernel.codes import Code
from nereus.kernel.effects import EntryOutcome
from nereus.kernel.keys import message_id
from nereus.kernel.records import IMMEDIATE, Capacity, PublishAdmission
from nereus.kernel.timing import TrustedInterval
from nereus.runtime.log import Logger
from nereus.runtime.metrics import Metrics
from nereus.runtime.tally import Tally
from tests.support.runtime_harness import T0_MS, TENANT, Harness

GRANTED = Capacity(True, lane_permits=1, bytes_reserved=1)


def _histogram(text: str, name: str) -> tuple[float, float]:
    """(count, sum) of a rendered histogram."""
    found = {}
    for part in ("count", "sum"):
        match = re.search(rf"^{name}_{part}(?:{{[^}}]*}})? (\S+)$", text, re.M)
        assert match, f"{name}_{part} not rendered"
        found[part] = float(match.group(1))
    return found["count"], found["sum"]


@pytest.fixture
def h(tmp_path: Path) -> Iterator[Harness]:
    harness = Harness(tmp_path, SimulatedClock(T0_MS, error_ms=2))
    try:
        harness.tick()
        yield harness
    finally:
        harness.close()


def test_each_won_admission_is_observed_once_with_its_persistence_time_minus_deliver_at(
    h: Harness,
) -> None:
    delays_ms = [0, 5, 17, 40, 41, 90, 200, 333]
    for i, delay_ms in enumerate(delays_ms):
        assert h.schedule(f"k{i}", delay_ms=delay_ms).code is Code.SCHEDULED
    published = {"class": "PUBLISHED"}
    for _ in range(200):
        if h.runtime.metrics.value("nereus_outcomes_total", published) == len(delays_ms):
            break  # every outcome is folded too, not only sent
        h.clock.advance(7)
        h.tick()
    delivered = h.delivered()
    assert len(delivered) == len(delays_ms)

    expected_admission_s = 0.0
    expected_fire_s = 0.0
    for i in range(len(delays_ms)):
        message = h.message(f"k{i}")
        (attempt,) = h.attempts(message_id(TENANT, "q", f"k{i}"))
        assert attempt.admitted_at_ms >= message.deliver_at_ms
        expected_admission_s += (attempt.admitted_at_ms - message.deliver_at_ms) / 1000
    for record in delivered:
        expected_fire_s += (record.delivered_at_ms - record.deliver_at_ms) / 1000

    text = h.runtime.metrics.render()
    admission_count, admission_sum = _histogram(text, "nereus_admission_lag_seconds")
    fire_count, fire_sum = _histogram(text, "nereus_fire_lag_seconds")
    assert admission_count == fire_count == len(delays_ms)
    assert admission_sum == pytest.approx(expected_admission_s, abs=1e-9)
    assert fire_sum == pytest.approx(expected_fire_s, abs=1e-9)
    assert admission_sum <= fire_sum  # a send starts only once its Admission is durable


def _admission_outcome(applied: bool, deliver_at_ms: int) -> tuple[PublishAdmission, EntryOutcome]:
    record = PublishAdmission(
        "m", 1, 1, "m.1.a", "o:1", "o", "d" * 64, IMMEDIATE, TrustedInterval(0, 1), GRANTED
    )
    code = Code.ADMITTED if applied else Code.ADMISSION_STALE
    outcome = EntryOutcome(9, "PUBLISH_ADMISSION_V1", applied, code, "m", 1, 2, None, deliver_at_ms)
    return record, outcome


@settings(max_examples=60, deadline=None)
@given(
    applied=st.booleans(),
    recovered=st.booleans(),
    deliver_at_ms=st.integers(0, 10_000),
    persisted_at_ms=st.integers(0, 10_000),
)
def test_the_admission_lag_is_never_negative_and_counts_only_won_admissions_after_recovery(
    applied: bool, recovered: bool, deliver_at_ms: int, persisted_at_ms: int
) -> None:
    metrics = Metrics()
    tally = Tally(Logger("tests.lag_split"), recovered)
    record, outcome = _admission_outcome(applied, deliver_at_ms)
    tally.entry(record, outcome, persisted_at_ms)
    tally.write(metrics)
    text = metrics.render()
    if not (applied and recovered):
        assert "nereus_admission_lag_seconds_count" not in text
        return
    count, total = _histogram(text, "nereus_admission_lag_seconds")
    assert count == 1
    # A delayed-handoff destination admits before deliverAt: that is no lag, never below 0.
    assert total == pytest.approx(max(persisted_at_ms - deliver_at_ms, 0) / 1000)
