"""The system clock's trusted interval always contains true time (adapters/clock.py).

The rule (RELIABILITY.md P1, P2; specs/time.md): every decision to admit or expire rests on
the trusted interval's ends, so the interval `SystemClock` gives must hold the true time
whenever its host keeps the two claims the clock relies on: the wall clock is within the
reported (or assumed) error at each sample, and the monotonic clock drifts from true time
by at most `drift_ppm`. Here a `ScriptedHost` (tests/support/host_clock.py) keeps exactly those
claims, pushed to their bounds, while hypothesis drives it: the wall clock at either end of
its error, the monotonic clock fast or slow by the whole drift allowance, true times a
nanosecond either side of a millisecond, samples taken or skipped, synchronisation lost and
regained. Containment is checked at nanosecond resolution: `earliest_ms` (rounded down)
must not pass true time, `latest_ms` (rounded up) must not fall short of it.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import example, given
from hypothesis import strategies as st

from nereus.adapters.clock import SystemClock
from nereus.kernel.timing import UNBOUNDED, TrustedInterval
from tests.support.host_clock import EPOCH_NS, ScriptedHost, drift_bound_ns

MS_NS = 1_000_000
SECOND_NS = 1_000 * MS_NS
PER_MILLE = 1_000

# (monotonic ns elapsed, drift as per mille of its bound (-1000 slow .. +1000 fast true
# time), wall offset as per mille of the claimed error, the new report: µs of error or None)
Step = tuple[int, int, int, int | None]

per_mille = st.one_of(st.sampled_from([-PER_MILLE, 0, PER_MILLE]), st.integers(-1000, 1000))
elapsed_ns = st.one_of(
    st.sampled_from([0, 1, MS_NS - 1, MS_NS, 999 * MS_NS, 1_000 * MS_NS, 3_600_000 * MS_NS]),
    st.integers(0, 5_000 * MS_NS),
)
error_us = st.one_of(st.sampled_from([0, 1, 999, 1_000, 1_001, 16_000]), st.integers(0, 500_000))
report = st.one_of(st.none(), error_us)
sub_ms = st.one_of(st.sampled_from([0, 1, MS_NS // 2, MS_NS - 1]), st.integers(0, MS_NS - 1))


def contains(interval: TrustedInterval, true_ns: int) -> bool:
    return interval.earliest_ms * MS_NS <= true_ns <= interval.latest_ms * MS_NS


def _offset(host: ScriptedHost, fraction: int) -> int:
    bound = host.claimed_error_ns()
    return 0 if bound is None else bound * fraction // PER_MILLE


@dataclass(frozen=True)
class Scenario:
    """A host and what happens to it: the clock's settings, the first report (µs of error
    or None) and where true time and the wall clock start, then the steps."""

    drift_ppm: int
    sample_interval_ms: int
    assumed_error_ms: int | None
    first: int | None
    start_ns: int
    first_offset: int
    steps: tuple[Step, ...]


def run(s: Scenario) -> None:
    host = ScriptedHost(
        s.start_ns, drift_ppm=s.drift_ppm, max_error_us=s.first, assumed_error_ms=s.assumed_error_ms
    )
    host.set_wall_offset(_offset(host, s.first_offset))
    clock = SystemClock(
        assumed_error_ms=s.assumed_error_ms,
        drift_ppm=s.drift_ppm,
        sample_interval_ms=s.sample_interval_ms,
        host=host,
    )
    steps = [(0, 0, s.first_offset, s.first), *s.steps]
    for i, (mono_ns, drift, offset, next_report) in enumerate(steps):
        true_ns = mono_ns + drift_bound_ns(s.drift_ppm, mono_ns) * drift // PER_MILLE
        host.advance(mono_ns, true_ns)
        interval = clock.interval()
        where = f"step {i}: true {host.true_ns} ns, interval {interval}"
        assert contains(interval, host.true_ns), where
        if interval != UNBOUNDED:
            # Whatever it claims, it is an honest reading, never the unbounded one in parts.
            assert interval.bounded, where
        host.set_report(next_report, 0)
        host.set_wall_offset(_offset(host, offset))


scenarios = st.builds(
    Scenario,
    drift_ppm=st.sampled_from([0, 1, 50, 500]),
    sample_interval_ms=st.sampled_from([1, 1_000, 60_000, 7_200_000]),
    assumed_error_ms=st.one_of(st.none(), st.sampled_from([1, 5, 250])),
    first=report,
    start_ns=st.builds(lambda ms, sub: EPOCH_NS + ms * MS_NS + sub, st.integers(0, 10**9), sub_ms),
    first_offset=per_mille,
    steps=st.lists(st.tuples(elapsed_ns, per_mille, per_mille, report), max_size=12).map(tuple),
)


@given(scenarios)
# One second after the sample, the wall clock at the top of its error and the monotonic
# clock fast by the whole drift allowance: true time lies below the unwidened interval.
@example(
    Scenario(500, 60_000, None, 1_000, EPOCH_NS, PER_MILLE, ((SECOND_NS, -PER_MILLE, 0, 1_000),))
)
# The same, mirrored: the wall clock low, the monotonic clock slow.
@example(
    Scenario(500, 60_000, None, 1_000, EPOCH_NS, -PER_MILLE, ((SECOND_NS, PER_MILLE, 0, 1_000),))
)
# Half a millisecond past a whole one, a clock good to a microsecond: the earliest end
# must be the whole millisecond below, the latest the one above.
@example(Scenario(500, 1_000, None, 1, EPOCH_NS + MS_NS // 2, 0, ()))
def test_the_interval_always_contains_true_time(scenario: Scenario) -> None:
    run(scenario)


@given(
    error=st.integers(0, 500_000),
    sub=sub_ms,
    offset=per_mille,
    mono_ns=elapsed_ns,
    drift=per_mille,
)
def test_a_synchronised_host_gets_a_bounded_interval_no_wider_than_its_claims(
    error: int, sub: int, offset: int, mono_ns: int, drift: int
) -> None:
    """The other side of the rule: an honest interval that is also useful. Never wider
    than the error, the drift allowance and a millisecond of rounding at each end."""
    drift_ppm = 500
    host = ScriptedHost(EPOCH_NS + sub, drift_ppm=drift_ppm, max_error_us=error)
    host.set_wall_offset(error * 1_000 * offset // PER_MILLE)
    clock = SystemClock(drift_ppm=drift_ppm, sample_interval_ms=7_200_000, host=host)
    host.advance(mono_ns, mono_ns + drift_bound_ns(drift_ppm, mono_ns) * drift // PER_MILLE)
    interval = clock.interval()
    assert contains(interval, host.true_ns)
    claimed_ns = error * 1_000 + drift_bound_ns(drift_ppm, mono_ns)
    assert interval.width_ms * MS_NS <= 2 * claimed_ns + 2 * MS_NS, interval


@given(sub=sub_ms, mono_ns=elapsed_ns)
def test_an_unsynchronised_host_without_an_assumption_gets_the_unbounded_interval(
    sub: int, mono_ns: int
) -> None:
    host = ScriptedHost(EPOCH_NS + sub, drift_ppm=500, max_error_us=None)
    clock = SystemClock(sample_interval_ms=1, host=host)
    host.advance(mono_ns, mono_ns)
    assert clock.interval() == UNBOUNDED
