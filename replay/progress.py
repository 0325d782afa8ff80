"""A progress line on stderr for long folds and benchmarks."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    """Rewrites one stderr line at most every `interval_s`; silent unless enabled."""

    def __init__(
        self, label: str, total: int | None, *, enabled: bool, out: TextIO | None = None
    ) -> None:
        self.label = label
        self.total = total
        self.enabled = enabled
        self.out = out or sys.stderr
        self.started = time.monotonic()
        self._last = 0.0
        self.done = 0

    def update(self, done: int) -> None:
        self.done = done
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self._last < 0.5:
            return
        self._last = now
        self._draw(now)

    def _draw(self, now: float) -> None:
        elapsed = max(now - self.started, 1e-9)
        rate = self.done / elapsed
        if self.total:
            pct = 100.0 * self.done / self.total
            width = 30
            filled = int(width * self.done / self.total)
            bar = "#" * filled + "-" * (width - filled)
            text = f"{self.label} [{bar}] {self.done:,}/{self.total:,} {pct:5.1f}% {rate:,.0f}/s"
        else:
            text = f"{self.label} {self.done:,} {rate:,.0f}/s"
        self.out.write("\r" + text)
        self.out.flush()

    def finish(self) -> None:
        if self.enabled:
            self._draw(time.monotonic())
            self.out.write("\n")
            self.out.flush()
