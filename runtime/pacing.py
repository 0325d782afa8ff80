"""Pacing: when the loop runs the next tick, and when a tick leaves queued commands for a moment.

Theory of operation: Admissions go first (config `command_hold_max_ms`). A tick that has
fresh Admissions to commit leaves queued commands to the very next tick, and a tick does not
start committing commands when work claimed ahead comes due within the time such a tick has
been taking (a moving average the loop measures): the Admission commit and the send after it
are then not queued behind the fold of a batch of commands. Commands are never held for
longer than `command_hold_max_ms` of monotonic time in a row.

A tick ends with a `Wake`: how long the loop may sleep, and the trusted-clock reading it is
waiting for, if any. The tick cannot know how long it took itself (it reads no clock), so
the loop turns the wake into a sleep with a monotonic reading taken after the tick
(`sleep_s`), and watches the clock for the last stretch, because the reading is whole
milliseconds, rounded down.
"""

from __future__ import annotations

from dataclasses import dataclass

from nereus.runtime.clock import ClockReading
from nereus.runtime.config import RuntimeConfig

AT_ONCE_S = 0.0
POLL_S = 0.001  # sends or copies are waiting for the clock or the log's proof of ownership
MIN_WAIT_S = 0.0002


@dataclass(frozen=True)
class Wake:
    """When to run the next tick: after at most `after_s`, or, with `at_earliest_ms`, as
    soon as the trusted clock's earliest end reaches it (and still at most `after_s`)."""

    after_s: float
    at_earliest_ms: int | None = None
    took_commands: bool = False


def sleep_s(wake: Wake, now: ClockReading, monotonic_ms: float) -> float:
    """How long to sleep after a tick that started at `now` and ended at `monotonic_ms`."""
    if wake.at_earliest_ms is None:
        return wake.after_s
    # The tick's reading of the earliest end, moved on by the time the tick took (an
    # estimate for sleeping, never a time decision).
    earliest_now = now.interval.earliest_ms + (monotonic_ms - now.monotonic_ms)
    wait_s = (wake.at_earliest_ms - earliest_now) / 1000
    return min(max(wait_s, MIN_WAIT_S), wake.after_s)


class Pacing:
    def __init__(self, config: RuntimeConfig) -> None:
        self.config = config
        # How long ticks that commit commands take (ms, moving average).
        self.command_tick_ms = 0.0
        self._holding_since_ms: float | None = None  # monotonic ms when holding began
        # The last tick left commands queued for Admissions: the next one takes them.
        self._owe_commands = False

    def hold(
        self,
        commands_waiting: bool,
        oldest_admitted_ms: int | None,
        ahead_due_ms: int | None,
        now: ClockReading,
    ) -> tuple[bool, bool]:
        """Whether this tick leaves the queued commands: (for its fresh Admissions, for work
        claimed ahead about to come due). Work already later than the hold would make it
        gains nothing from going first, and a second commit per round costs a loop that is
        falling behind its capacity."""
        hold_max_ms = self.config.command_hold_max_ms
        prioritise = hold_max_ms > 0 and not self._owe_commands
        fresh = (
            oldest_admitted_ms is not None
            and now.interval.earliest_ms - oldest_admitted_ms <= hold_max_ms
        )
        first = prioritise and fresh and commands_waiting
        holding = (
            prioritise and not first and self._hold_for_ahead(commands_waiting, ahead_due_ms, now)
        )
        self._owe_commands = first
        return first, holding

    def _hold_for_ahead(
        self, commands_waiting: bool, ahead_due_ms: int | None, now: ClockReading
    ) -> bool:
        """Work claimed ahead comes due before a tick committing the commands would be done.
        Whoever drives the ticks (the loop, a caller on its own thread, the simulator) is
        held alike, by the readings it passes, and never for longer than
        `command_hold_max_ms` in a row."""
        if not commands_waiting or ahead_due_ms is None:
            self._holding_since_ms = None
            return False
        window_ms = min(self.command_tick_ms + 1.0, float(self.config.command_hold_max_ms))
        if ahead_due_ms - now.interval.earliest_ms > window_ms:
            self._holding_since_ms = None
            return False
        if self._holding_since_ms is None:
            self._holding_since_ms = now.monotonic_ms
        return now.monotonic_ms - self._holding_since_ms < self.config.command_hold_max_ms

    def took_commands(self) -> None:
        self._holding_since_ms = None

    def command_tick_took(self, took_ms: float) -> None:
        """The loop measured a tick that committed commands."""
        self.command_tick_ms = 0.8 * self.command_tick_ms + 0.2 * took_ms
