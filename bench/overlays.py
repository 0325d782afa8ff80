"""Why the kernel overlay is not a pyrsistent map: both measured side by side.

The reducer writes a few rows per entry into a persistent overlay that lives for one batch.
This times N writes followed by N reads, at batch sizes 100, 1,000 and 10,000, for
`pyrsistent.pmap` (a HAMT) and `kernel.overlay.Overlay` (a versioned dict), with a plain
mutable `dict` as the raw floor.

    .venv/bin/python -m bench.overlays
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

from pyrsistent import PMap, pmap

from kernel.overlay import Overlay

ROUNDS_KEYS = 200_000


def _time(fn: Callable[[int], None], n: int) -> float:
    rounds = max(1, ROUNDS_KEYS // n)
    t = time.perf_counter()
    for _ in range(rounds):
        fn(n)
    return rounds * n / (time.perf_counter() - t)


def _pmap(n: int) -> None:
    m: PMap[tuple[str, int], int] = pmap()
    for i in range(n):
        m = m.set(("messages", i), i)
    for i in range(n):
        m.get(("messages", i))


def _overlay(n: int) -> None:
    o: Overlay[tuple[str, int], int] = Overlay()
    for i in range(n):
        o = o.set(("messages", i), i)
    for i in range(n):
        o.get(("messages", i))


def _dict(n: int) -> None:
    d: dict[tuple[str, int], int] = {}
    for i in range(n):
        d[("messages", i)] = i
    for i in range(n):
        d.get(("messages", i))


def main() -> int:
    header = ("batch", "dict w+r/s", "pmap w+r/s", "Overlay w+r/s", "Overlay/pmap")
    print("{:>8} {:>12} {:>12} {:>14} {:>13}".format(*header))
    for n in (100, 1_000, 10_000):
        raw, hamt, ours = _time(_dict, n), _time(_pmap, n), _time(_overlay, n)
        print(f"{n:>8,} {raw:>12,.0f} {hamt:>12,.0f} {ours:>14,.0f} {ours / hamt:>13.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
