"""Pacing (`runtime.pacing`): when a tick leaves queued commands, and how long the loop sleeps.

The decisions are functions of the readings passed in, whoever drives the ticks (the loop, a
caller's thread, the simulator). The never-rules, over every sequence of ticks: commands
are never held for claimed-ahead work for `command_hold_max_ms` or longer in a row, never
held when nothing is claimed ahead or nothing waits, and never left behind Admissions two
ticks running; a sleep is never negative and never longer than the tick allowed.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from nereus import kernel as k
from nereus.runtime.clock import ClockReading
from nereus.runtime.config import RuntimeConfig
from nereus.runtime.pacing import MIN_WAIT_S, Pacing, Wake, sleep_s
from tests.support.strategies import props

T0_MS = 1_780_000_000_000
HOLD_MAX_MS = 10

TICKS = st.lists(
    st.tuples(
        st.booleans(),  # commands waiting
        st.none() | st.integers(-20, 5),  # oldest Admission of the tick, ms from now
        st.none() | st.integers(-5, 20),  # earliest claim made ahead, ms from now
        st.integers(0, 6),  # monotonic ms since the last tick
        st.floats(0, 30),  # what the loop measured a command tick at
    ),
    max_size=60,
)


def _reading(monotonic_ms: float, earliest_ms: int) -> ClockReading:
    return ClockReading(monotonic_ms, k.TrustedInterval(earliest_ms, earliest_ms + 4), earliest_ms)


@props(300)
@given(TICKS)
def test_commands_are_held_briefly_and_never_twice_behind_admissions(
    ticks: list[tuple[bool, int | None, int | None, int, float]],
) -> None:
    pacing = Pacing(RuntimeConfig(command_hold_max_ms=HOLD_MAX_MS))
    monotonic_ms = 1_000.0
    earliest_ms = T0_MS
    streak_start: float | None = None
    last_first = False
    for waiting, admitted_in, ahead_in, step_ms, measured_ms in ticks:
        monotonic_ms += step_ms
        earliest_ms += step_ms
        now = _reading(monotonic_ms, earliest_ms)
        oldest = None if admitted_in is None else earliest_ms + admitted_in
        ahead = None if ahead_in is None else earliest_ms + ahead_in
        first, holding = pacing.hold(waiting, oldest, ahead, now)
        assert not (first and holding)
        assert not (first and last_first), "commands left behind Admissions twice running"
        if first:
            assert waiting and oldest is not None
        if holding:
            assert waiting and ahead is not None
            streak_start = monotonic_ms if streak_start is None else streak_start
            assert monotonic_ms - streak_start < HOLD_MAX_MS
        else:
            streak_start = None
        if waiting and not (first or holding):
            pacing.took_commands()
            pacing.command_tick_took(measured_ms)
        last_first = first


@props(300)
@given(
    st.floats(0, 0.05),
    st.none() | st.integers(-100, 100),
    st.integers(-10, 10),
    st.floats(0, 50),
)
def test_a_sleep_is_never_negative_nor_longer_than_the_tick_allowed(
    after_s: float, target_in: int | None, earliest_in: int, took_ms: float
) -> None:
    now = _reading(500.0, T0_MS + earliest_in)
    target = None if target_in is None else T0_MS + target_in
    pause_s = sleep_s(Wake(after_s, target), now, 500.0 + took_ms)
    assert 0 <= pause_s <= after_s
    if target is not None and after_s >= MIN_WAIT_S:
        assert pause_s >= MIN_WAIT_S
        # Never past the moment waited for, by the tick's own reading moved on.
        assert pause_s <= max((target - (now.interval.earliest_ms + took_ms)) / 1000, MIN_WAIT_S)


def test_a_caller_driven_tick_holds_commands_as_the_loop_would() -> None:
    """No thread test: the same readings give the same answer on any thread."""
    answers = []
    for _ in range(2):
        pacing = Pacing(RuntimeConfig(command_hold_max_ms=HOLD_MAX_MS))
        now = _reading(0.0, T0_MS)
        answers.append([pacing.hold(True, None, T0_MS + 1, now)])
        later = _reading(HOLD_MAX_MS + 1.0, T0_MS)
        answers[-1].append(pacing.hold(True, None, T0_MS + 1, later))
    assert answers[0] == answers[1] == [(False, True), (False, False)]
