"""A host whose true time the test knows, for `SystemClock` (adapters/clock.py).

Theory of operation: `SystemClock` rests on two claims of its host. At each sample the wall
clock is within the reported error bound (or the operator's assumed one) of true time; and
between samples the monotonic clock runs away from true time by at most `drift_ppm` of the
monotonic time elapsed. `ScriptedHost` keeps true time beside the three readings and lets a
test move them only in ways that keep both claims (`advance` and `set_wall_offset` refuse
anything else), so an interval that misses true time is the clock's fault, never the
host's.
"""

from __future__ import annotations

from nereus.adapters.clock import SyncReport

# 2026-01-01T00:00:00Z, a whole millisecond.
EPOCH_NS = 1_767_225_600_000 * 1_000_000
MONOTONIC_START_NS = 5_000_000_000  # a boot some seconds ago: unrelated to the wall clock


def drift_bound_ns(drift_ppm: int, mono_elapsed_ns: int) -> int:
    """The most true time may differ from `mono_elapsed_ns` of monotonic time, in whole
    nanoseconds (an integer so that summing steps never exceeds the bound of their sum)."""
    return drift_ppm * mono_elapsed_ns // 1_000_000


class ScriptedHost:
    """True time and the readings a `SystemClock` takes of it (`HostReadings`)."""

    def __init__(
        self,
        true_ns: int,
        *,
        drift_ppm: int,
        max_error_us: int | None,
        assumed_error_ms: int | None = None,
        wall_offset_ns: int = 0,
    ) -> None:
        self.true_ns = true_ns
        self.mono_ns = MONOTONIC_START_NS
        self.drift_ppm = drift_ppm
        self.max_error_us = max_error_us  # None: the host reports no synchronisation
        self.assumed_error_ms = assumed_error_ms
        self.wall_offset_ns = 0
        self.set_wall_offset(wall_offset_ns)

    def claimed_error_ns(self) -> int | None:
        """The bound on |wall - true| that the report (or the assumption) claims now."""
        if self.max_error_us is not None:
            return self.max_error_us * 1_000
        if self.assumed_error_ms is not None:
            return self.assumed_error_ms * 1_000_000
        return None

    def set_wall_offset(self, offset_ns: int) -> None:
        bound = self.claimed_error_ns()
        assert bound is None or abs(offset_ns) <= bound, "the host would break its claim"
        self.wall_offset_ns = offset_ns

    def set_report(self, max_error_us: int | None, offset_ns: int) -> None:
        """A new synchronisation report (None: unsynchronised) and wall clock offset."""
        self.max_error_us = max_error_us
        self.set_wall_offset(offset_ns)

    def advance(self, mono_elapsed_ns: int, true_elapsed_ns: int) -> None:
        assert mono_elapsed_ns >= 0
        bound = drift_bound_ns(self.drift_ppm, mono_elapsed_ns)
        assert abs(true_elapsed_ns - mono_elapsed_ns) <= bound, "drift beyond the claim"
        self.mono_ns += mono_elapsed_ns
        self.true_ns += true_elapsed_ns

    # HostReadings

    def sync_report(self) -> SyncReport | None:
        if self.max_error_us is None:
            return SyncReport(synchronized=False, max_error_us=16_000_000)
        return SyncReport(synchronized=True, max_error_us=self.max_error_us)

    def monotonic_ns(self) -> int:
        return self.mono_ns

    def wall_ns(self) -> int:
        return self.true_ns + self.wall_offset_ns
