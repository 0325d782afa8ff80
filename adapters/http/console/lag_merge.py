"""The fire-lag chart of a whole machine under `serve --processes`: every process's windows,
summed.

Theory of operation: each process samples its own histogram at the wall clock's boundaries
(`lag.LagSampler`), so its windows are named by the same ends as its siblings'. The process
that answers a page asks every sibling for its windows (`LagDeltas`, over the private port:
`adapters.kafka.siblings.Siblings.lag`) and adds them to its own, bucket by bucket, window by
window (`merge`); p50 and p99 are then read from the summed histogram, as they would be from
one histogram holding every process's observations. Quantiles cannot be merged from
quantiles, counts can. A sibling that does not answer in time, whose answer does not decode,
or whose buckets differ, is left out, and the page says how many processes the chart covers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import msgspec

from nereus.adapters.http.console.lag import WINDOWS, LagDeltas, LagSampler, Window, summarize

# Each sibling's encoded `LagDeltas`, None for one that did not answer in time.
SiblingLag = Callable[[], list[bytes | None]]


class LagView(NamedTuple):
    """What the overview draws, and how many of the machine's processes it covers
    (`processes` None: one process alone, no siblings)."""

    windows: list[Window]
    covered: int
    processes: int | None


def _add(into: list[float], counts: Sequence[float]) -> None:
    """Add `counts` into `into` bucket by bucket (an empty list holds no observations)."""
    into.extend([0.0] * (len(counts) - len(into)))
    for i, c in enumerate(counts):
        into[i] += c


def merge(parts: Sequence[LagDeltas]) -> tuple[LagDeltas, int]:
    """The windows of every part summed by end, and how many parts are in the sum. The first
    part is the asking process's: windows ending after its open one (a sibling asked just
    past a boundary) are dropped, as are parts whose buckets differ from the first bounds
    seen; the newest `WINDOWS` + 1 ends are kept."""
    if not parts:
        return LagDeltas([], []), 0
    bounds: list[float] = []
    summed: dict[float, list[float]] = {}
    used = 0
    newest = max((end for end, _ in parts[0].windows), default=None)
    for part in parts:
        if part.bounds and bounds and part.bounds != bounds:
            continue
        bounds = bounds or list(part.bounds)
        used += 1
        for end, counts in part.windows:
            if newest is None or end <= newest:
                _add(summed.setdefault(end, []), counts)
    ends = sorted(summed)[-(WINDOWS + 1) :]
    return LagDeltas(bounds, [(end, summed[end]) for end in ends]), used


def decode(answer: bytes | None) -> LagDeltas | None:
    """A sibling's answer, or None when there is none or it does not decode."""
    if answer is None:
        return None
    try:
        return msgspec.msgpack.decode(answer, type=LagDeltas)
    except msgspec.DecodeError:  # ValidationError included
        return None


def machine_view(sampler: LagSampler, siblings: SiblingLag | None) -> LagView:
    """The chart's windows for this process and, under `--processes`, every sibling that
    answers (asked first, so that this process's open window is the newest)."""
    if siblings is None:
        return LagView(sampler.windows(), 1, None)
    answers = siblings()
    found = [d for d in map(decode, answers) if d is not None]
    merged, used = merge([sampler.deltas(), *found])
    return LagView(summarize(merged), used, 1 + len(answers))
