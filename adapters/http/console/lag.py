"""The overview's fire-lag chart: p50 and p99 per ten seconds over the last five minutes.

Theory of operation: the runtime already counts every published attempt's lag (deliveredAt
minus deliverAt) in the `nereus_fire_lag_seconds` histogram. A sampler thread reads the
histogram's buckets at every multiple of `SAMPLE_S` seconds of the wall clock; the difference
between two readings is the histogram of that window, named by its end. Windows end on the
wall clock's boundaries, not at some offset from when the sampler started, so the windows of
the processes of one machine (`serve --processes`) end together and are summed bucket by
bucket (`lag_merge`): a quantile of several processes is read from their summed histogram,
never from their quantiles. A quantile is the upper bound of the bucket it falls in (what
Prometheus' `histogram_quantile` would answer, without its interpolation: an upper bound
never makes a lag look smaller than it was). The sampler starts with the first console page
(or the first time a sibling asks for its windows), so a service nobody looks at pays
nothing; what was published before it started is in no window.
"""

from __future__ import annotations

import itertools
import math
import threading
import time
from collections import deque
from collections.abc import Sequence
from typing import Final, NamedTuple

import msgspec
from markupsafe import Markup

from nereus.runtime.metrics import Metrics

FIRE_LAG: Final = "nereus_fire_lag_seconds"
SAMPLE_S: Final = 10.0
WINDOWS: Final = 30  # five minutes of ten-second windows
# The sampler wakes this long after a boundary, so the clock it reads is past it.
_WAKE_LATE_S: Final = 0.005


class Window(NamedTuple):
    end_s: float
    published: int
    p50_s: float | None
    p99_s: float | None


class LagDeltas(msgspec.Struct, frozen=True):
    """A process's fire-lag histogram per window: the bucket bounds (empty before any
    observation) and, oldest first, each window's end (a multiple of `SAMPLE_S`; the open
    window's is the next boundary) with its count per bucket (empty: nothing observed yet),
    the values above every bound last. What a sibling answers for the chart."""

    bounds: list[float]
    windows: list[tuple[float, list[float]]]


def boundary_s(at_s: float) -> float:
    """The latest window boundary at or before `at_s`."""
    return math.floor(at_s / SAMPLE_S) * SAMPLE_S


def quantile(bounds: Sequence[float], counts: Sequence[float], q: float) -> float | None:
    """The upper bound of the bucket holding quantile `q` (inf above the last bound), or
    None for an empty histogram."""
    total = sum(counts)
    if total <= 0:
        return None
    rank = q * total
    seen = 0.0
    for i, c in enumerate(counts):
        seen += c
        if seen >= rank and c > 0:
            return bounds[i] if i < len(bounds) else float("inf")
    return float("inf")


def summarize(deltas: LagDeltas) -> list[Window]:
    """Each window's publications, p50 and p99, oldest first."""
    return [
        Window(
            end,
            int(sum(counts)),
            quantile(deltas.bounds, counts, 0.5),
            quantile(deltas.bounds, counts, 0.99),
        )
        for end, counts in deltas.windows
    ]


class LagSampler:
    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics
        self._lock = threading.Lock()
        # (boundary, counts read there), oldest first; empty counts: no histogram yet.
        self._readings: deque[tuple[float, list[float]]] = deque(maxlen=WINDOWS + 1)
        self._bounds: tuple[float, ...] = ()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def start(self) -> None:
        with self._lock:
            if self._thread is not None:
                return
            self._thread = threading.Thread(
                target=self._run, name="nereus-console-lag", daemon=True
            )
        self.sample()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while True:
            now_s = time.time()
            if self._stop.wait(boundary_s(now_s) + SAMPLE_S + _WAKE_LATE_S - now_s):
                return
            self.sample()

    def _read(self) -> list[float]:
        """The histogram's counts now (empty before any observation); keeps its bounds."""
        found = self._metrics.histogram(FIRE_LAG)
        if found is None:
            return []
        with self._lock:
            self._bounds = found[0]
        return list(found[1])

    def sample(self, now_s: float | None = None) -> None:
        """Record the reading of the latest boundary, unless it is recorded already. Read a
        little after the boundary, it is filed under it: the lags of those milliseconds count
        in the window that just ended, and in no other."""
        at = boundary_s(time.time() if now_s is None else now_s)
        with self._lock:
            if self._readings and self._readings[-1][0] >= at:
                return
        counts = self._read()
        with self._lock:
            if not self._readings or self._readings[-1][0] < at:
                self._readings.append((at, counts))

    def deltas(self, now_s: float | None = None) -> LagDeltas:
        """Each window between two readings, then the one still open (from the last reading
        to now), so a page shows the lag of the seconds just past. A boundary the sampler
        thread has not reached yet (it is late) is read here first, so the open window ends
        at the next boundary, as every process's does."""
        at = time.time() if now_s is None else now_s
        self.sample(at)
        counts_now = self._read()
        with self._lock:
            readings = list(self._readings)
            bounds = list(self._bounds)
        if readings:
            readings.append((readings[-1][0] + SAMPLE_S, counts_now))
        windows: list[tuple[float, list[float]]] = []
        for (_, before), (end, after) in itertools.pairwise(readings):
            windows.append(
                (end, [a - (before[i] if i < len(before) else 0.0) for i, a in enumerate(after)])
            )
        return LagDeltas(bounds, windows)

    def windows(self, now_s: float | None = None) -> list[Window]:
        return summarize(self.deltas(now_s))


def chart(windows: Sequence[Window], width: int = 600, height: int = 140) -> Markup:
    """An inline SVG of p50 and p99 per window (a linear scale up to the largest finite
    p99), drawn with presentation attributes only (no style: the CSP forbids it)."""
    finite = [w.p99_s for w in windows if w.p99_s is not None and w.p99_s != float("inf")]
    top = max(finite, default=0.01) or 0.01
    # Fixed slots, newest at the right edge: a chart of a minute's history is a minute wide.
    slots = max(len(windows), WINDOWS + 1)
    step = (width - 50) / (slots - 1)
    first = slots - len(windows)

    def y(v: float) -> float:
        return height - 20 - min(v, top) / top * (height - 30)

    def line(values: list[tuple[int, float | None]], colour: str) -> str:
        xy = [(40 + (first + i) * step, y(v)) for i, v in values if v is not None]
        points = " ".join(f"{x:.1f},{yy:.1f}" for x, yy in xy)
        dots = "".join(
            f'<circle cx="{x:.1f}" cy="{yy:.1f}" r="2.5" fill="{colour}"/>' for x, yy in xy
        )
        if not xy:
            return ""
        return f'<polyline fill="none" stroke="{colour}" stroke-width="2" points="{points}"/>{dots}'

    p50 = [(i, w.p50_s) for i, w in enumerate(windows)]
    p99 = [(i, w.p99_s) for i, w in enumerate(windows)]
    label = f"{top * 1000:.0f} ms" if top >= 0.001 else f"{top * 1e6:.0f} us"
    svg = (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="fire lag p50 and p99">'
        f'<line x1="40" y1="{height - 20}" x2="{width - 10}" y2="{height - 20}" stroke="#888"/>'
        f'<line x1="40" y1="10" x2="40" y2="{height - 20}" stroke="#888"/>'
        f'<text x="2" y="16" font-size="10" fill="#444">{label}</text>'
        f'<text x="2" y="{height - 22}" font-size="10" fill="#444">0</text>'
        f'<text x="40" y="{height - 4}" font-size="10" fill="#444">-5 min</text>'
        f'<text x="{width - 40}" y="{height - 4}" font-size="10" fill="#444">now</text>'
        f"{line(p99, '#c0392b')}{line(p50, '#2471a3')}</svg>"
    )
    return Markup(svg)
