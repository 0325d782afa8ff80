"""Why the kernel overlay is not a pyrsistent map: both measured side by side.

The reducer writes a few rows per entry into a persistent overlay that lives for one batch.
This times N writes followed by N reads, at batch sizes 100, 1,000 and 10,000, for
`pyrsistent.pmap` (a HAMT) and `kernel.overlay.Overlay` (a versioned dict), with a plain
mutable `dict` as the raw floor.

    .venv/bin/python -m bench.overlays
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import Any

from pyrsistent import PMap, pmap

from bench.common import write_json
from nereus.kernel.overlay import Overlay

ROUNDS_KEYS = 200_000


def _time(fn: Callable[[int], None], n: int, keys: int = ROUNDS_KEYS) -> float:
    rounds = max(1, keys // n)
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


def measure(keys: int = ROUNDS_KEYS) -> list[dict[str, Any]]:
    rows = []
    for n in (100, 1_000, 10_000):
        raw, hamt, ours = _time(_dict, n, keys), _time(_pmap, n, keys), _time(_overlay, n, keys)
        rows.append(
            {
                "batch": n,
                "dict_per_s": round(raw),
                "pmap_per_s": round(hamt),
                "overlay_per_s": round(ours),
                "overlay_vs_pmap": round(ours / hamt, 3),
                "overlay_vs_dict": round(ours / raw, 3),
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--keys", type=int, default=ROUNDS_KEYS, help="writes+reads per size")
    parser.add_argument("--json", help="write results to this file")
    args = parser.parse_args(argv)
    rows = measure(args.keys)
    header = ("batch", "dict w+r/s", "pmap w+r/s", "Overlay w+r/s", "Overlay/pmap")
    print("{:>8} {:>12} {:>12} {:>14} {:>13}".format(*header))
    for r in rows:
        print(
            f"{r['batch']:>8,} {r['dict_per_s']:>12,} {r['pmap_per_s']:>12,} "
            f"{r['overlay_per_s']:>14,} {r['overlay_vs_pmap']:>13.2f}"
        )
    write_json(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
