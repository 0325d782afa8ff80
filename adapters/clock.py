"""Clock sources that yield trusted intervals.

Theory of operation: the host clock is only as good as its synchronisation. Linux reports, via
`adjtimex(2)`, whether the clock is synchronised (`STA_UNSYNC` clear) and a maximum error
bound in microseconds that the kernel itself grows while no update arrives. `SystemClock`
samples that at most every `sample_interval_ms`; between samples it extrapolates the wall
clock with the monotonic clock and widens the error by `drift_ppm` times the monotonic time
since the sample, so the interval stays honest even if sampling stops. The earliest end is
rounded down and the latest up to whole milliseconds, so the interval holds the true time
whenever the host's claims hold (its error bound at each sample, its monotonic clock's drift
within `drift_ppm`). What it reads of the host (the report and both clocks) comes through a
`HostReadings`, the real host by default, so a test can drive it from a host whose true time
it knows.

If the host reports no synchronisation, the interval is unbounded: `decide` then answers
PAUSE for everything, so nothing is admitted or expired (fail closed). An operator who knows
better may configure `assumed_error_ms`; it replaces the missing bound, is logged once, and
is exported as a metric, because every delivery made under it rests on that assumption.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import threading
import time
from dataclasses import dataclass
from typing import Any, Protocol

from nereus.kernel.timing import UNBOUNDED, TrustedInterval
from nereus.runtime.clock import ClockStatus

STA_UNSYNC = 0x0040


class _Timeval(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_usec", ctypes.c_long)]


class _Timex(ctypes.Structure):
    """struct timex from <sys/timex.h> (Linux, 64-bit)."""

    _fields_ = [
        ("modes", ctypes.c_uint),
        ("offset", ctypes.c_long),
        ("freq", ctypes.c_long),
        ("maxerror", ctypes.c_long),
        ("esterror", ctypes.c_long),
        ("status", ctypes.c_int),
        ("constant", ctypes.c_long),
        ("precision", ctypes.c_long),
        ("tolerance", ctypes.c_long),
        ("time", _Timeval),
        ("tick", ctypes.c_long),
        ("ppsfreq", ctypes.c_long),
        ("jitter", ctypes.c_long),
        ("shift", ctypes.c_int),
        ("stabil", ctypes.c_long),
        ("jitcnt", ctypes.c_long),
        ("calcnt", ctypes.c_long),
        ("errcnt", ctypes.c_long),
        ("stbcnt", ctypes.c_long),
        ("tai", ctypes.c_int),
        ("_reserved", ctypes.c_int * 11),
    ]


@dataclass(frozen=True)
class SyncReport:
    synchronized: bool
    max_error_us: int


@functools.cache
def _adjtimex() -> Any:
    """libc's adjtimex, found once per process: `find_library` runs `ldconfig -p` in a
    child process (~2 ms), and the clock is sampled every second under its lock."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        return ctypes.CDLL(name, use_errno=True).adjtimex
    except (OSError, AttributeError):
        return None


def read_adjtimex() -> SyncReport | None:
    """The host's synchronisation report, or None where adjtimex is unavailable."""
    fn = _adjtimex()
    if fn is None:
        return None
    tx = _Timex()
    if fn(ctypes.byref(tx)) < 0:
        return None
    return SyncReport(synchronized=not tx.status & STA_UNSYNC, max_error_us=int(tx.maxerror))


class HostReadings(Protocol):
    """The three readings SystemClock takes of its host."""

    def sync_report(self) -> SyncReport | None:
        """The synchronisation report, or None where there is none (fails closed)."""
        ...

    def monotonic_ns(self) -> int: ...

    def wall_ns(self) -> int: ...


class LinuxHost:
    """The machine this process runs on."""

    def sync_report(self) -> SyncReport | None:
        return read_adjtimex()

    def monotonic_ns(self) -> int:
        return time.monotonic_ns()

    def wall_ns(self) -> int:
        return time.time_ns()


@dataclass(frozen=True)
class _Sample:
    wall_ns: int
    mono_ns: int
    error_ns: int | None  # None: unbounded


class SystemClock:
    """The host clock widened by its reported (or assumed) error and a drift bound."""

    def __init__(
        self,
        *,
        assumed_error_ms: float | None = None,
        drift_ppm: float = 500.0,
        sample_interval_ms: int = 1000,
        host: HostReadings | None = None,
    ) -> None:
        self.host: HostReadings = host or LinuxHost()
        self.assumed_error_ms = assumed_error_ms
        self.drift_ppm = drift_ppm
        self.sample_interval_ns = sample_interval_ms * 1_000_000
        self._lock = threading.Lock()
        self._sample = self._take_sample()
        self._report_source = "adjtimex"

    def _take_sample(self) -> _Sample:
        report = self.host.sync_report()
        mono_ns = self.host.monotonic_ns()
        wall_ns = self.host.wall_ns()
        error_ns: int | None
        if report is not None and report.synchronized:
            error_ns = report.max_error_us * 1000
        elif self.assumed_error_ms is not None:
            error_ns = int(self.assumed_error_ms * 1_000_000)
        else:
            error_ns = None
        return _Sample(wall_ns, mono_ns, error_ns)

    def interval(self) -> TrustedInterval:
        mono_ns = self.host.monotonic_ns()
        with self._lock:
            if mono_ns - self._sample.mono_ns >= self.sample_interval_ns:
                self._sample = self._take_sample()
                mono_ns = self._sample.mono_ns
            sample = self._sample
        if sample.error_ns is None:
            return UNBOUNDED
        elapsed_ns = mono_ns - sample.mono_ns
        now_ns = sample.wall_ns + elapsed_ns
        # Round outward to whole milliseconds: never claim more precision than we have.
        error_ns = sample.error_ns + int(elapsed_ns * self.drift_ppm / 1_000_000)
        return TrustedInterval(
            (now_ns - error_ns) // 1_000_000, -((-(now_ns + error_ns)) // 1_000_000)
        )

    def now_ms(self) -> int:
        return self.host.wall_ns() // 1_000_000

    def monotonic_ms(self) -> float:
        return self.host.monotonic_ns() / 1_000_000

    def describe(self) -> ClockStatus:
        report = self.host.sync_report()
        synced = report is not None and report.synchronized
        if synced:
            assert report is not None
            return ClockStatus(True, report.max_error_us / 1000, False, "adjtimex")
        if self.assumed_error_ms is not None:
            return ClockStatus(False, self.assumed_error_ms, True, "operator assumption")
        if report is None:
            return ClockStatus(False, None, False, "adjtimex gave no reading")
        return ClockStatus(False, None, False, "adjtimex says unsynchronised")


class SimulatedClock:
    """A clock for tests and the simulator. `true_ms` is real time; the clock reports
    `true_ms + offset_ms` and claims `error_ms` of uncertainty. A test can make the claim a
    lie (offset beyond the error) to check what a broken clock can and cannot cause."""

    def __init__(self, true_ms: int, *, error_ms: int = 5, offset_ms: int = 0) -> None:
        self.true_ms = true_ms
        self.error_ms = error_ms
        self.offset_ms = offset_ms
        self.drift_ppm = 0.0
        self.synchronized = True
        self._lock = threading.Lock()

    def advance(self, ms: int) -> None:
        with self._lock:
            self.true_ms += ms
            self.offset_ms += int(ms * self.drift_ppm / 1_000_000)

    def step(self, offset_ms: int) -> None:
        """The reported clock jumps (e.g. backwards) by offset_ms; true time does not."""
        with self._lock:
            self.offset_ms += offset_ms

    def lose_sync(self) -> None:
        self.synchronized = False

    def regain_sync(self) -> None:
        self.synchronized = True

    def interval(self) -> TrustedInterval:
        with self._lock:
            if not self.synchronized:
                return UNBOUNDED
            reported = self.true_ms + self.offset_ms
            return TrustedInterval(reported - self.error_ms, reported + self.error_ms)

    def now_ms(self) -> int:
        """What a naive reader of this clock would take as 'now'."""
        return self.true_ms + self.offset_ms

    def monotonic_ms(self) -> float:
        """The host's monotonic clock: the loop of a runtime on this clock runs in real
        time, whatever the simulated time does (a test that never advances it must not
        stall the loop)."""
        return time.monotonic_ns() / 1_000_000

    def describe(self) -> ClockStatus:
        return ClockStatus(self.synchronized, float(self.error_ms), False, "simulated")
