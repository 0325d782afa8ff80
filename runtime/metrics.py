"""A small metrics registry rendered in the Prometheus text exposition format.

Theory of operation: the runtime thread updates plain counters under one lock; `/metrics`
renders a consistent copy. Label sets are bounded by construction (outcome classes, statuses,
tenants from configuration), never by message ids.
"""

from __future__ import annotations

import math
import threading
from bisect import bisect_left
from collections.abc import Sequence

LabelKey = tuple[tuple[str, str], ...]

LAG_BUCKETS_S: Sequence[float] = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.02,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    60.0,
)


def _labels(labels: dict[str, str] | None) -> LabelKey:
    return tuple(sorted((labels or {}).items()))


def _fmt_labels(key: LabelKey, extra: tuple[tuple[str, str], ...] = ()) -> str:
    items = key + extra
    if not items:
        return ""
    body = ",".join(f'{k}="{_escape(v)}"' for k, v in items)
    return "{" + body + "}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _num(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == int(value):
        return str(int(value))
    return repr(value)


class Metrics:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._help: dict[str, tuple[str, str]] = {}
        self._values: dict[str, dict[LabelKey, float]] = {}
        self._hist: dict[str, dict[LabelKey, list[float]]] = {}
        self._buckets: dict[str, Sequence[float]] = {}
        # Counts per bucket of histogram series forgotten by `drop_series`: `histogram` keeps
        # them, so the difference of two readings (the console's lag windows) never goes
        # negative when a shard moves away.
        self._dropped: dict[str, list[float]] = {}

    def describe(self, name: str, kind: str, text: str) -> None:
        self._help[name] = (kind, text)

    def inc(self, name: str, amount: float = 1.0, labels: dict[str, str] | None = None) -> None:
        with self._lock:
            series = self._values.setdefault(name, {})
            key = _labels(labels)
            series[key] = series.get(key, 0.0) + amount

    def set(self, name: str, value: float, labels: dict[str, str] | None = None) -> None:
        with self._lock:
            self._values.setdefault(name, {})[_labels(labels)] = value

    def observe(
        self,
        name: str,
        value: float,
        labels: dict[str, str] | None = None,
        buckets: Sequence[float] = LAG_BUCKETS_S,
    ) -> None:
        self.observe_many(name, (value,), labels, buckets)

    def observe_many(
        self,
        name: str,
        values: Sequence[float],
        labels: dict[str, str] | None = None,
        buckets: Sequence[float] = LAG_BUCKETS_S,
    ) -> None:
        """Observe several values under one lock (a commit's fire lags). Each value counts
        in the first bucket that holds it; `render` makes the buckets cumulative."""
        if not values:
            return
        with self._lock:
            bounds = self._buckets.setdefault(name, buckets)
            series = self._hist.setdefault(name, {})
            key = _labels(labels)
            counts = series.get(key)
            if counts is None:
                # Per bucket, then the values above every bound, then count and sum.
                counts = series[key] = [0.0] * (len(bounds) + 3)
            for value in values:
                counts[bisect_left(bounds, value)] += 1
                counts[-2] += 1
                counts[-1] += value

    def value(self, name: str, labels: dict[str, str] | None = None) -> float:
        with self._lock:
            return self._values.get(name, {}).get(_labels(labels), 0.0)

    def histogram(self, name: str) -> tuple[tuple[float, ...], list[float]] | None:
        """A histogram's bucket bounds and its count per bucket (not cumulative), summed over
        every label set, the values above every bound last; None before any observation.
        Monotonic: the counts of series forgotten by `drop_series` stay in it."""
        with self._lock:
            series = self._hist.get(name)
            if not series and name not in self._dropped:
                return None
            bounds = tuple(self._buckets[name])
            total = list(self._dropped.get(name, [0.0] * (len(bounds) + 1)))
            for counts in (series or {}).values():
                for i in range(len(total)):
                    total[i] += counts[i]
            return bounds, total

    def total(self, name: str) -> float:
        """A counter summed over every label set."""
        with self._lock:
            return sum(self._values.get(name, {}).values())

    def render(self) -> str:
        lines: list[str] = []
        with self._lock:
            names = sorted(set(self._values) | set(self._hist))
            for name in names:
                kind, text = self._help.get(name, ("untyped", ""))
                if text:
                    lines.append(f"# HELP {name} {text}")
                lines.append(f"# TYPE {name} {kind}")
                for key, value in sorted(self._values.get(name, {}).items()):
                    lines.append(f"{name}{_fmt_labels(key)} {_num(value)}")
                for key, counts in sorted(self._hist.get(name, {}).items()):
                    below = 0.0
                    for i, bound in enumerate(self._buckets[name]):
                        below += counts[i]
                        le = (("le", _num(bound)),)
                        lines.append(f"{name}_bucket{_fmt_labels(key, le)} {_num(below)}")
                    inf = (("le", "+Inf"),)
                    lines.append(f"{name}_bucket{_fmt_labels(key, inf)} {_num(counts[-2])}")
                    lines.append(f"{name}_count{_fmt_labels(key)} {_num(counts[-2])}")
                    lines.append(f"{name}_sum{_fmt_labels(key)} {_num(counts[-1])}")
        return "\n".join(lines) + "\n"


class ScopedMetrics(Metrics):
    """A view of a registry that adds fixed labels to every series it touches: one shard's
    runtime among several in one process (`shard="3"`)."""

    def __init__(self, parent: Metrics, labels: dict[str, str]) -> None:
        self._parent = parent
        self._extra = dict(labels)

    def _with(self, labels: dict[str, str] | None) -> dict[str, str]:
        return {**(labels or {}), **self._extra}

    def describe(self, name: str, kind: str, text: str) -> None:
        self._parent.describe(name, kind, text)

    def inc(self, name: str, amount: float = 1.0, labels: dict[str, str] | None = None) -> None:
        self._parent.inc(name, amount, self._with(labels))

    def set(self, name: str, value: float, labels: dict[str, str] | None = None) -> None:
        self._parent.set(name, value, self._with(labels))

    def observe_many(
        self,
        name: str,
        values: Sequence[float],
        labels: dict[str, str] | None = None,
        buckets: Sequence[float] = LAG_BUCKETS_S,
    ) -> None:
        self._parent.observe_many(name, values, self._with(labels), buckets)

    def value(self, name: str, labels: dict[str, str] | None = None) -> float:
        return self._parent.value(name, self._with(labels))

    def render(self) -> str:
        return self._parent.render()

    def histogram(self, name: str) -> tuple[tuple[float, ...], list[float]] | None:
        return self._parent.histogram(name)

    def total(self, name: str) -> float:
        return self._parent.total(name)


def drop_series(metrics: Metrics, labels: dict[str, str]) -> None:
    """Forget every series carrying all of `labels` (a shard that moved away must not keep
    exporting its last gauges from here)."""
    root = metrics
    while isinstance(root, ScopedMetrics):
        root = root._parent
    want = set(labels.items())
    with root._lock:
        for values in root._values.values():
            for key in [k for k in values if want <= set(k)]:
                del values[key]
        for name, hist in root._hist.items():
            for key in [k for k in hist if want <= set(k)]:
                kept = root._dropped.setdefault(name, [0.0] * (len(root._buckets[name]) + 1))
                for i in range(len(kept)):
                    kept[i] += hist[key][i]
                del hist[key]
