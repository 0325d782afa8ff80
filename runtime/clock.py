"""What the runtime needs from a clock, and the reading a tick is given.

Theory of operation: the runtime never reads a clock of its own. A `ClockSource` (the host's,
`adapters.clock.SystemClock`, or a simulated one) is its only time, and a tick is handed one
`ClockReading` of it: the trusted interval every time decision is made against, the wall
clock that stamps the embedded log and times deadlines and backoffs, and a monotonic reading
that only paces the loop (how long commands have been held, how long a tick took; never a
decision about a message). Whoever drives the runtime takes the reading: the runtime's own
loop, a caller ticking on its own thread, or the simulator, whose clock moves only between
ticks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from nereus.kernel.timing import TrustedInterval


@dataclass(frozen=True)
class ClockStatus:
    synchronized: bool
    error_bound_ms: float | None  # None: unbounded
    assumed: bool  # the bound is the operator's assumption, not the host's report
    source: str


class ClockSource(Protocol):
    def interval(self) -> TrustedInterval:
        """An interval that certainly contains true UTC now."""
        ...

    def now_ms(self) -> int:
        """The wall clock, for stamping the embedded log's persistence time."""
        ...

    def monotonic_ms(self) -> float:
        """Elapsed time of the process that drives the runtime, in ms from any origin; it
        never goes back. For pacing only."""
        ...

    def describe(self) -> ClockStatus: ...


@dataclass(frozen=True, slots=True)
class ClockReading:
    """One reading of a clock source, as a tick receives it."""

    monotonic_ms: float
    interval: TrustedInterval
    now_ms: int


def read_clock(clock: ClockSource) -> ClockReading:
    return ClockReading(clock.monotonic_ms(), clock.interval(), clock.now_ms())
