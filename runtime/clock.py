"""What the runtime needs from a clock: trusted intervals, and a wall reading for the log."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from kernel.timing import TrustedInterval


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

    def describe(self) -> ClockStatus: ...
