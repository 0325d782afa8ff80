"""The simulator's clock: true time known to the simulator alone, and an honest, imperfect
reading of it for the runtime.

The runtime sees `reported = true + offset` and a claimed error bound `error`; its trusted
interval is `[reported - error, reported + error]`. The simulator keeps `|offset| <= error`
at all times (an honest clock: the interval contains true time), because Nereus's promises
are conditional on that. Within honesty the clock misbehaves as real ones do:

* drift: the offset moves by `drift_ppm` of elapsed true time; the bound grows at least as
  fast (the host's maxerror grows while no sync update arrives), so it stays honest;
* steps: the offset jumps anywhere inside the bound, usually backwards, so the reported
  clock (and the log's persistence clock, which clamps) goes back in time;
* loss of sync: the interval is unbounded, so nothing may be admitted or expired;
* resync: a small fresh bound and offset, and a new drift;
* a step back right after a commit (`step_back`), the window between an Admission's commit
  and its send, often to exactly one millisecond before the admitted action time;
* landing an end of the interval exactly on an instant (`land`): the simulator aims the
  earliest end at due work's actionAt and the latest end at a live timer's expireAt, the
  edges where the rules' `>=` and `>` part.

`lie_ms` breaks honesty on purpose (the reported clock runs ahead of its bound) so a test
can prove the checks notice an early delivery.
"""

from __future__ import annotations

import random

from nereus.kernel.timing import UNBOUNDED, TrustedInterval
from nereus.runtime.clock import ClockStatus

MAX_DRIFT_PPM = 800


class SimClock:
    """Satisfies `runtime.clock.ClockSource`. Integer milliseconds throughout; drift is
    accumulated in exact micro-parts so the same seed gives the same readings."""

    def __init__(self, true_ms: int, rng: random.Random, *, lie_ms: int = 0) -> None:
        self.true_ms = true_ms
        self._rng = rng
        self.error_ms = rng.randint(0, 40)
        self.offset_ms = rng.randint(-self.error_ms, self.error_ms)
        self.drift_ppm = rng.randint(-MAX_DRIFT_PPM, MAX_DRIFT_PPM)
        # The bound must outgrow the drift or the interval would stop containing true time.
        self.growth_ppm = abs(self.drift_ppm) + rng.randint(0, 500)
        self.synchronized = True
        self.lie_ms = lie_ms
        self._drift_frac = 0  # sub-millisecond drift carried between advances, ppm*ms
        # How often the reported clock went back: a check that compares two readings taken
        # at different moments holds only while this did not change between them.
        self.back_steps = 0
        self._reported_ms = self.now_ms()

    # The ClockSource the runtime reads ------------------------------------------------------

    def interval(self) -> TrustedInterval:
        if not self.synchronized:
            return UNBOUNDED
        reported = self.now_ms()
        return TrustedInterval(reported - self.error_ms, reported + self.error_ms)

    def now_ms(self) -> int:
        return self.true_ms + self.offset_ms + self.lie_ms

    def monotonic_ms(self) -> float:
        # The simulated process's elapsed time is true time, which only moves forward.
        return float(self.true_ms)

    def describe(self) -> ClockStatus:
        bound = float(self.error_ms) if self.synchronized else None
        return ClockStatus(self.synchronized, bound, False, "simulated")

    # What the simulator does to it ----------------------------------------------------------

    def advance(self, ms: int) -> None:
        assert ms >= 0
        self.true_ms += ms
        self._drift_frac += ms * self.drift_ppm
        # Truncated toward zero, the remainder carried: exact integer arithmetic.
        whole = abs(self._drift_frac) // 1_000_000 * (1 if self._drift_frac >= 0 else -1)
        self._drift_frac -= whole * 1_000_000
        self.offset_ms += whole
        # Rounded up, so over any run the bound grows at least as much as the drift moved.
        self.error_ms += -(-ms * self.growth_ppm // 1_000_000)
        self.error_ms = max(self.error_ms, abs(self.offset_ms))
        self._check_honest()

    def step(self) -> int:
        """Jump the reported clock inside its bound, backwards three times in four (a
        step correction). Returns the jump in ms (negative: backwards)."""
        before = self.offset_ms
        if self._rng.random() < 0.75:
            self.offset_ms = self._rng.randint(-self.error_ms, before)
        else:
            self.offset_ms = self._rng.randint(before, self.error_ms)
        if self._rng.random() < 0.3:  # exactly on the bound: the interval's edge is true time
            self.offset_ms = -self.error_ms if self.offset_ms <= 0 else self.error_ms
        self._check_honest()
        return self.offset_ms - before

    def step_back(self, to_earliest_ms: int | None = None) -> int:
        """Jump the reported clock backwards inside its bound: to put the earliest end at
        `to_earliest_ms` when honesty allows it, anywhere behind otherwise. Returns the jump
        (zero or negative)."""
        before = self.offset_ms
        wanted = None
        if to_earliest_ms is not None:
            wanted = to_earliest_ms + self.error_ms - self.true_ms - self.lie_ms
        if wanted is not None and -self.error_ms <= wanted <= before:
            self.offset_ms = wanted
        else:
            self.offset_ms = self._rng.randint(-self.error_ms, before)
        self._check_honest()
        return self.offset_ms - before

    def land(self, end: str, target_ms: int) -> bool | None:
        """Advance true time so that the interval's `end` ("earliest" or "latest") is
        exactly `target_ms`, with a step correction inside the bound for what drift moved.
        None (nothing done) when the target is behind that end; False when time advanced
        but honesty forbade the last correction; True when the end is on the target."""
        if not self.synchronized:
            return None
        interval = self.interval()
        now_end = interval.earliest_ms if end == "earliest" else interval.latest_ms
        if target_ms < now_end:
            return None
        self.advance(target_ms - now_end)
        sign = -1 if end == "earliest" else 1
        wanted = target_ms - self.true_ms - self.lie_ms - sign * self.error_ms
        if abs(wanted) > self.error_ms:
            return False
        self.offset_ms = wanted
        self._check_honest()
        return True

    def grow_error(self, ms: int) -> None:
        """The bound widens (a missed sync poll, a noisy source)."""
        self.error_ms += ms

    def lose_sync(self) -> None:
        self.synchronized = False

    def resync(self) -> None:
        self.synchronized = True
        self.error_ms = self._rng.randint(0, 50)
        self.offset_ms = self._rng.randint(-self.error_ms, self.error_ms)
        self.drift_ppm = self._rng.randint(-MAX_DRIFT_PPM, MAX_DRIFT_PPM)
        self.growth_ppm = abs(self.drift_ppm) + self._rng.randint(0, 500)
        self._drift_frac = 0
        self._check_honest()

    def settle(self, error_ms: int = 5) -> None:
        """Synchronised, small bound, no drift: the end of the run, so everything resolves."""
        self.synchronized = True
        self.error_ms = error_ms
        self.offset_ms = self._rng.randint(-error_ms, error_ms)
        self.drift_ppm = 0
        self.growth_ppm = 0
        self._drift_frac = 0
        self._note_reported()

    def _check_honest(self) -> None:
        # The simulator's own promise; a failure here is a bug in the simulator.
        assert abs(self.offset_ms) <= self.error_ms, (self.offset_ms, self.error_ms)
        self._note_reported()

    def _note_reported(self) -> None:
        reported = self.now_ms()
        if reported < self._reported_ms:
            self.back_steps += 1
        self._reported_ms = reported
