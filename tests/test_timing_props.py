"""Properties of the fail-closed time rule and of the V1 timing validation.

`decide` is the one place that turns clock evidence into permission, so its properties are the
sentences of the seed, stated for every interval: never ADMIT unless the whole interval is
past actionAt and before expireAt, never EXPIRE unless the whole interval is past expireAt,
and more uncertainty can only make the answer more cautious.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

import kernel as k
from kernel.timing import MAX_TIME_MS, MIN_TIME_MS, Decision
from tests.strategies import (
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


@props(200)
@given(decide_cases())
def test_decide_is_the_seed_rule(case: tuple[k.TrustedInterval, int, int]) -> None:
    """An independent restatement: admit only when latest < expireAt (and earliest has
    reached actionAt), expire only when earliest >= expireAt, otherwise pause or wait."""
    interval, action_at_ms, expire_at_ms = case
    if interval.earliest_ms >= expire_at_ms:
        want = Decision.EXPIRE
    elif interval.latest_ms >= expire_at_ms:
        want = Decision.PAUSE
    elif interval.earliest_ms >= action_at_ms:
        want = Decision.ADMIT
    else:
        want = Decision.WAIT
    assert k.decide(interval, action_at_ms, expire_at_ms) is want


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


def v1_violations(
    bp_ms: int, deliver_at_ms: int, expire_at_ms: int, limits: k.TimingLimits
) -> list[k.Code]:
    """The three V1 rules from the seed, in the order the codes list gives them."""
    broken: list[k.Code] = []
    if not deliver_at_ms <= bp_ms + limits.max_delay_horizon_ms:
        broken.append(k.Code.DELIVER_BEYOND_HORIZON)
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
