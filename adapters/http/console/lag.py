"""The overview's fire-lag chart: p50 and p99 per ten seconds over the last five minutes.

Theory of operation: the runtime already counts every published attempt's lag (deliveredAt
minus deliverAt) in the `nereus_fire_lag_seconds` histogram. A sampler thread reads the
histogram's buckets every `SAMPLE_S` seconds; the difference between two readings is the
histogram of that window, whose quantiles are read as the upper bound of the bucket they fall
in (what Prometheus' `histogram_quantile` would answer, without its interpolation: an upper
bound never makes a lag look smaller than it was). The sampler starts with the first console
page, so a service nobody looks at pays nothing.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from collections.abc import Sequence
from typing import Final, NamedTuple

from markupsafe import Markup

from nereus.runtime.metrics import Metrics

FIRE_LAG: Final = "nereus_fire_lag_seconds"
SAMPLE_S: Final = 10.0
WINDOWS: Final = 30  # five minutes of ten-second windows


class Window(NamedTuple):
    end_s: float
    published: int
    p50_s: float | None
    p99_s: float | None


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


class LagSampler:
    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics
        self._lock = threading.Lock()
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
        while not self._stop.wait(SAMPLE_S):
            self.sample()

    def sample(self, now_s: float | None = None) -> None:
        found = self._metrics.histogram(FIRE_LAG)
        at = time.time() if now_s is None else now_s
        with self._lock:
            if found is None:
                self._readings.append((at, []))
                return
            self._bounds, counts = found[0], list(found[1])
            self._readings.append((at, counts))

    def windows(self, now_s: float | None = None) -> list[Window]:
        """Each window between two readings, oldest first, then the one still open (from the
        last reading to now), so a page shows the lag of the seconds just past."""
        found = self._metrics.histogram(FIRE_LAG)
        at = time.time() if now_s is None else now_s
        with self._lock:
            readings = list(self._readings)
            if found is not None:
                self._bounds = found[0]
            bounds = self._bounds
        if readings:
            readings.append((at, list(found[1]) if found is not None else []))
        out: list[Window] = []
        for (_, before), (end, after) in itertools.pairwise(readings):
            if not after:
                out.append(Window(end, 0, None, None))
                continue
            delta = [a - (before[i] if i < len(before) else 0.0) for i, a in enumerate(after)]
            out.append(
                Window(
                    end,
                    int(sum(delta)),
                    quantile(bounds, delta, 0.5),
                    quantile(bounds, delta, 0.99),
                )
            )
        return out


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
