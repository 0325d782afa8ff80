"""Properties of the fail-closed time rule and of the V1 timing validation.

`decide` is the one place that turns clock evidence into permission, so its properties are the
sentences of the seed, stated for every interval: never ADMIT unless the whole interval is
past actionAt and before expireAt, never EXPIRE unless the whole interval is past expireAt,
and more uncertainty can only make the answer more cautious.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nereus import kernel as k
from nereus.kernel.timing import MAX_TIME_MS, MIN_TIME_MS, Decision
from tests.support.strategies import (
    props,
    timing_bounds,
    timing_cases,
    trusted_intervals,
    wider_intervals,
)

# What a wider interval may answer, given what the narrower one answered: only a step
# towards PAUSE (uncertain about expireAt) or WAIT (uncertain about actionAt), never a new
# permission to admit or to expire.
WIDENED_MAY_ANSWER: dict[Decision, frozenset[Decision]] = {
    Decision.ADMIT: frozenset({Decision.ADMIT, Decision.WAIT, Decision.PAUSE}),
    Decision.EXPIRE: frozenset({Decision.EXPIRE, Decision.PAUSE}),
    Decision.WAIT: frozenset({Decision.WAIT, Decision.PAUSE}),
    Decision.PAUSE: frozenset({Decision.PAUSE}),
}


@st.composite
def decide_cases(draw: st.DrawFn) -> tuple[k.TrustedInterval, int, int]:
    action_at_ms, expire_at_ms = draw(timing_bounds())
    return draw(trusted_intervals(action_at_ms, expire_at_ms)), action_at_ms, expire_at_ms


@props(200)
@given(decide_cases())
def test_never_admit_when_latest_reaches_expire(case: tuple[k.TrustedInterval, int, int]) -> None:
    interval, action_at_ms, expire_at_ms = case
    if interval.latest_ms >= expire_at_ms:
        assert k.decide(interval, action_at_ms, expire_at_ms) is not Decision.ADMIT


@props(200)
@given(decide_cases())
def test_never_expire_while_earliest_is_before_expire(
    case: tuple[k.TrustedInterval, int, int],
) -> None:
    interval, action_at_ms, expire_at_ms = case
    if interval.earliest_ms < expire_at_ms:
        assert k.decide(interval, action_at_ms, expire_at_ms) is not Decision.EXPIRE


@props(200)
@given(decide_cases())
def test_never_admit_before_action_time(case: tuple[k.TrustedInterval, int, int]) -> None:
    interval, action_at_ms, expire_at_ms = case
    if k.decide(interval, action_at_ms, expire_at_ms) is Decision.ADMIT:
        assert interval.earliest_ms >= action_at_ms
        assert interval.latest_ms < expire_at_ms


# The seed's three sentences, each stated on its own (not as the if-chain `decide` is):
# "allow Publish Admission only when latestUtcNow < expireAt" (and only once the interval
# proves the action time has come), "declare expired only when earliestUtcNow >= expireAt",
# "otherwise pause without Admission or early EXPIRED" (or wait: not due yet).
def seed_may_admit(i: k.TrustedInterval, action_at_ms: int, expire_at_ms: int) -> bool:
    return i.latest_ms < expire_at_ms and i.earliest_ms >= action_at_ms


def seed_may_expire(i: k.TrustedInterval, action_at_ms: int, expire_at_ms: int) -> bool:
    return i.earliest_ms >= expire_at_ms


def seed_must_pause(i: k.TrustedInterval, action_at_ms: int, expire_at_ms: int) -> bool:
    return i.latest_ms >= expire_at_ms and not seed_may_expire(i, action_at_ms, expire_at_ms)


@props(300)
@given(decide_cases())
def test_decide_answers_what_the_seed_sentences_allow(
    case: tuple[k.TrustedInterval, int, int],
) -> None:
    """Each answer holds exactly when its sentence says so; WAIT is what is left."""
    interval, action_at_ms, expire_at_ms = case
    answer = k.decide(interval, action_at_ms, expire_at_ms)
    assert (answer is Decision.ADMIT) == seed_may_admit(interval, action_at_ms, expire_at_ms)
    assert (answer is Decision.EXPIRE) == seed_may_expire(interval, action_at_ms, expire_at_ms)
    assert (answer is Decision.PAUSE) == seed_must_pause(interval, action_at_ms, expire_at_ms)


# Every combination of interval ends one millisecond either side of, or exactly on, actionAt
# and expireAt: the edges where `>=` and `>` differ, checked without relying on hypothesis
# to draw them.
EDGE_ACTION_MS, EDGE_EXPIRE_MS = 10_000, 20_000
EDGE_ENDS_MS = sorted(
    {t + d for t in (EDGE_ACTION_MS, EDGE_EXPIRE_MS) for d in (-1, 0, 1)} | {0, 30_000}
)
EDGE_CASES = [
    (earliest, latest) for earliest in EDGE_ENDS_MS for latest in EDGE_ENDS_MS if earliest <= latest
]


@pytest.mark.parametrize(("earliest_ms", "latest_ms"), EDGE_CASES)
def test_decide_at_the_exact_edges(earliest_ms: int, latest_ms: int) -> None:
    interval = k.TrustedInterval(earliest_ms, latest_ms)
    answer = k.decide(interval, EDGE_ACTION_MS, EDGE_EXPIRE_MS)
    if latest_ms == EDGE_EXPIRE_MS and earliest_ms < EDGE_EXPIRE_MS:
        assert answer is Decision.PAUSE  # latest == expireAt: no Admission, no expiry
    if earliest_ms == EDGE_EXPIRE_MS:
        assert answer is Decision.EXPIRE  # earliest == expireAt: expired
    if earliest_ms == EDGE_ACTION_MS and latest_ms < EDGE_EXPIRE_MS:
        assert answer is Decision.ADMIT  # earliest == actionAt: due
    if earliest_ms == EDGE_ACTION_MS - 1:
        assert answer in (Decision.WAIT, Decision.PAUSE)  # one millisecond short
    assert (answer is Decision.ADMIT) == seed_may_admit(interval, EDGE_ACTION_MS, EDGE_EXPIRE_MS)
    assert (answer is Decision.EXPIRE) == seed_may_expire(interval, EDGE_ACTION_MS, EDGE_EXPIRE_MS)


@props(200)
@given(decide_cases(), st.data())
def test_widening_only_moves_toward_pause_or_wait(
    case: tuple[k.TrustedInterval, int, int], data: st.DataObject
) -> None:
    narrow, action_at_ms, expire_at_ms = case
    wide = data.draw(wider_intervals(narrow), label="wide")
    assert wide.earliest_ms <= narrow.earliest_ms and wide.latest_ms >= narrow.latest_ms
    narrow_answer = k.decide(narrow, action_at_ms, expire_at_ms)
    wide_answer = k.decide(wide, action_at_ms, expire_at_ms)
    if wide_answer in (Decision.ADMIT, Decision.EXPIRE):
        assert narrow_answer is wide_answer
    assert wide_answer in WIDENED_MAY_ANSWER[narrow_answer]


@props(200)
@given(timing_bounds())
def test_unbounded_interval_always_pauses(bounds: tuple[int, int]) -> None:
    action_at_ms, expire_at_ms = bounds
    assert MIN_TIME_MS < expire_at_ms <= MAX_TIME_MS
    assert k.decide(k.UNBOUNDED, action_at_ms, expire_at_ms) is Decision.PAUSE


@props(200)
@given(st.integers(MIN_TIME_MS, MAX_TIME_MS), st.integers(0, 2**63))
def test_an_interval_is_bounded_exactly_when_neither_end_is_a_limit(
    earliest_ms: int, width_ms: int
) -> None:
    """The runtime never treats the unbounded interval (or one that reaches either of its
    limits) as a reading: no discovery, no error bound, no wait computed from it."""
    interval = k.TrustedInterval(earliest_ms, earliest_ms + width_ms)
    inside = earliest_ms > MIN_TIME_MS and earliest_ms + width_ms < MAX_TIME_MS
    assert interval.bounded is inside
    assert not k.UNBOUNDED.bounded


def v1_violations(
    bp_ms: int, deliver_at_ms: int, expire_at_ms: int, limits: k.TimingLimits
) -> list[k.Code]:
    """The three V1 rules from the seed, in the order the codes list gives them."""
    broken: list[k.Code] = []
    if not deliver_at_ms <= bp_ms + limits.max_delay_horizon_ms:
        broken.append(k.Code.HORIZON_EXCEEDED)
    if not expire_at_ms <= bp_ms + limits.max_message_lifetime_ms:
        broken.append(k.Code.LIFETIME_EXCEEDED)
    if not expire_at_ms >= max(deliver_at_ms, bp_ms) + limits.min_delivery_window_ms:
        broken.append(k.Code.EXPIRE_BEFORE_WINDOW)
    return broken


@props(300)
@given(timing_cases())
def test_validate_timing_accepts_exactly_the_v1_region(
    case: tuple[int, int, int, k.TimingLimits],
) -> None:
    bp_ms, deliver_at_ms, expire_at_ms, limits = case
    broken = v1_violations(bp_ms, deliver_at_ms, expire_at_ms, limits)
    code = k.validate_timing(bp_ms, deliver_at_ms, expire_at_ms, limits)
    assert (code is None) == (not broken)
    if broken:
        assert code is broken[0]


@props(200)
@given(timing_cases(), st.data())
def test_accepted_timing_leaves_an_admission_window(
    case: tuple[int, int, int, k.TimingLimits], data: st.DataObject
) -> None:
    """minDeliveryWindow is what guarantees a chance to publish: an accepted timer can be
    admitted at max(deliverAt, bp) by any clock whose whole error is below the window."""
    bp_ms, deliver_at_ms, expire_at_ms, limits = case
    if k.validate_timing(bp_ms, deliver_at_ms, expire_at_ms, limits) is not None:
        return
    window_ms = limits.min_delivery_window_ms
    if window_ms == 0:
        return
    start_ms = max(deliver_at_ms, bp_ms)
    width_ms = data.draw(st.integers(0, window_ms - 1), label="width_ms")
    interval = k.TrustedInterval(start_ms, start_ms + width_ms)
    assert k.decide(interval, deliver_at_ms, expire_at_ms) is Decision.ADMIT
