"""The runtime's loop: the thread that reads the clock source, ticks, and sleeps as told.

Theory of operation: the loop is the only part of the runtime that takes clock readings for
ticks. Each round it reads the clock source (after the log is open: opening a Kafka log
fences the former owner, which may take a while), hands the reading to `tick(now)`, and
sleeps as the tick's `Wake` says (`runtime.pacing`): until the next moment the trusted clock
lets discovery do something new, and for the last stretch of a short wait it watches the
clock itself, so the next tick starts as soon as the clock proves the moment. It wakes at
once when a command arrives or a search finishes (`wake`). A `ShardLost` ends the loop
without a halt; any other exception halts the runtime. `run_once` is one such round on the
caller's thread, without the sleep.
"""

from __future__ import annotations

import threading
from typing import Protocol

from nereus.runtime.clock import ClockReading, ClockSource, read_clock
from nereus.runtime.pacing import Pacing, Wake, sleep_s
from nereus.runtime.shardlog import ShardLog, ShardLost

# The loop watches the clock itself for the last stretch of a sleep this short or shorter:
# it sleeps to just before the moment, then checks the clock every step for a short span.
_WATCH_BELOW_S = 0.02
_WATCH_EARLY_S = 0.0015
_WATCH_SPAN_MS = 3.0
_WATCH_STEP_S = 0.0002


class Driven(Protocol):
    """What the loop drives (`runtime.shard.ShardRuntime`)."""

    def open_log(self) -> None: ...

    def tick(self, now: ClockReading) -> Wake: ...

    def halt(self, error: BaseException) -> None: ...

    def lose(self, error: ShardLost) -> None: ...


class Loop:
    def __init__(
        self,
        driven: Driven,
        clock: ClockSource,
        shard_log: ShardLog,
        pacing: Pacing,
        wake: threading.Event,
    ) -> None:
        self.driven = driven
        self.clock = clock
        self.shard_log = shard_log
        self.pacing = pacing
        self.wake = wake  # set by whoever has something for the next tick
        self._stop = threading.Event()
        self.thread: threading.Thread | None = None

    def start(self) -> None:
        if self.thread is not None:
            return
        self._stop.clear()
        self.thread = threading.Thread(target=self.run, name="nereus-shard", daemon=True)
        self.thread.start()

    def stop(self, timeout_s: float) -> None:
        self._stop.set()
        self.wake.set()
        if self.thread is not None:
            self.thread.join(timeout_s)
            self.thread = None

    def run(self) -> None:
        while not self._stop.is_set():
            try:
                now = self._reading()
                wake = self.driven.tick(now)
            except ShardLost as exc:
                self.driven.lose(exc)
                return
            except BaseException as exc:
                self.driven.halt(exc)
                return
            self._rest(wake, now)
            self.wake.clear()

    def run_once(self) -> Wake:
        now = self._reading()
        wake = self.driven.tick(now)
        self._learn(wake, now)
        return wake

    def _reading(self) -> ClockReading:
        self.driven.open_log()
        return read_clock(self.clock)

    def _learn(self, wake: Wake, now: ClockReading) -> float:
        """The monotonic time after a tick, which the tick itself cannot know: how long a
        tick that commits commands takes is what holding commands is measured against."""
        after_ms = self.clock.monotonic_ms()
        if wake.took_commands:
            self.pacing.command_tick_took(after_ms - now.monotonic_ms)
        return after_ms

    def _rest(self, wake: Wake, now: ClockReading) -> None:
        pause_s = sleep_s(wake, now, self._learn(wake, now))
        if pause_s <= 0:
            return
        target = wake.at_earliest_ms
        if target is None or pause_s > _WATCH_BELOW_S:
            self.shard_log.wait(pause_s, self.wake)
            return
        self.shard_log.wait(max(pause_s - _WATCH_EARLY_S, 0.0), self.wake)
        deadline_ms = self.clock.monotonic_ms() + _WATCH_SPAN_MS
        while (
            not self.wake.is_set()
            and not self._stop.is_set()
            and self.clock.interval().earliest_ms < target
            and self.clock.monotonic_ms() < deadline_ms
        ):
            self.wake.wait(_WATCH_STEP_S)
