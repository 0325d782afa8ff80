"""Reducer apply (replay) rate over an in-memory base, beside the raw msgspec decode rate.

For each live-timer count N: a `MemoryStore` holding N pending timers (`bench.preload`: the
rows N delayed schedules leave, checked against a real fold), then a mixed workload of
encoded log entries is timed two ways in the same run: (a) raw `msgspec` decode of the
entries, (b) decode + `kernel.reduce` + a flush of the overlay into the base every `--batch`
changed rows, which is what `replay.fold.replay` does. The ratio b/a is the kernel's cost
over the floor any Python consumer of the log pays. Both are timed in rounds (a slice
decoded, then the same slice applied); the best round is reported, the medians beside it.

The workload repeats a cycle of five entries: a schedule due now, its identical retry, its
Admission, its Published outcome, and a reschedule of a random preloaded timer (so the base
is read and written at random, and the live count stays N at every size).

With `--cpu C` the process is pinned to that one core (the suite runs each size in its own
pinned process, so a 10M base is freed before the next size).

    .venv/bin/python -m bench.kernel_apply --live 10000,1000000 [--cpu 0]
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
from collections.abc import Iterator
from typing import Any

from bench import preload
from bench.common import PAYLOAD, Progress, status_mb, write_json
from nereus import kernel as k
from nereus.kernel.records import decode_entry, encode_entry


def workload(start: int, count: int, live: int, now_ms: int) -> Iterator[k.LogEntry]:
    """Mixed entries from position start + 1, each valid against the preloaded state."""
    position = start
    cycle = 0
    digest = preload.DIGEST
    size = len(PAYLOAD)
    while position - start < count:
        cycle += 1
        key = f"w-{cycle}"
        mid = k.message_id(preload.TENANT, "hot", key)
        target = (cycle * 7919) % live
        steps: list[k.Record] = [
            k.Schedule(preload.TENANT, "hot", key, "tx", digest, size, delay_ms=0),
            k.Schedule(preload.TENANT, "hot", key, "tx", digest, size, delay_ms=0),  # retry
            k.PublishAdmission(
                mid,
                1,
                1,
                f"{mid}.1.1",
                "c",
                "bench",
                "d",
                k.Capability(),
                k.TrustedInterval(now_ms, now_ms + 10),  # earliest >= due: ADMIT
                k.Capacity(True),
            ),
            k.PublishOutcome(
                f"{mid}.1.1", mid, 1, k.Published(k.Evidence("hot", 0, cycle, now_ms))
            ),
            k.Reschedule(
                preload.TENANT,
                preload.queue_of(target),
                preload.key_of(target),
                f"r-{cycle}",
                delay_ms=7_200_000 + cycle,
            ),
        ]
        for record in steps:
            position += 1
            if position - start > count:
                return
            yield k.LogEntry(position, now_ms, record)


class GcTimer:
    """Wall time spent in the cyclic garbage collector while installed: with millions of
    rows in the heap, each full collection walks all of them."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.collections = 0
        self.active = True
        self._t = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if not self.active:
            return
        if phase == "start":
            self._t = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._t
            self.collections += 1

    def __enter__(self) -> GcTimer:
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self)


def measure(live: int, entries: int, batch: int, rounds: int = 5) -> dict[str, Any]:
    progress = Progress(f"kernel_apply: preload {live:,} timers", live)
    t = time.perf_counter()
    store = preload.memory_store(live, batch_entries=batch, on_progress=progress.update)
    build_s = time.perf_counter() - t
    position = store.meta.position
    now_ms = store.meta.last_persisted_at_ms + 1_000
    encoded = [encode_entry(e) for e in workload(position, entries, live, now_ms)]
    n = len(encoded)
    gc.collect()  # the preload's garbage, not the workload's

    # Rounds, each a decode of a slice then the apply of the same slice, so both see the
    # same load on a shared machine.
    decode_rates: list[float] = []
    apply_rates: list[float] = []
    ratios: list[float] = []
    per_round = -(-n // rounds)
    with GcTimer() as apply_gc:
        for start in range(0, n, per_round):
            chunk = encoded[start : start + per_round]
            apply_gc.active = False  # the collector's time during the apply only
            t = time.perf_counter()
            for blob in chunk:
                decode_entry(blob)
            decode_s = time.perf_counter() - t
            apply_gc.active = True
            t = time.perf_counter()
            store.feed(decode_entry(blob) for blob in chunk)
            apply_s = time.perf_counter() - t
            decode_rates.append(len(chunk) / decode_s)
            apply_rates.append(len(chunk) / apply_s)
            ratios.append(decode_s / apply_s)
    counters = store.meta.counters
    assert store.meta.position == position + n
    assert counters.scheduled == live, counters  # every reschedule found its timer
    assert counters.delivered == n // 5, counters  # every admission and outcome folded
    return {
        "live_timers": live,
        "entries": n,
        "batch": batch,
        "rounds": len(apply_rates),
        # The best round: the least disturbed by other work on a shared machine (as timeit
        # takes the minimum); the medians show what a typical round got.
        "decode_per_s": round(max(decode_rates)),
        "apply_per_s": round(max(apply_rates)),
        "apply_vs_decode": round(max(apply_rates) / max(decode_rates), 4),
        "decode_per_s_median": round(statistics.median(decode_rates)),
        "apply_per_s_median": round(statistics.median(apply_rates)),
        "apply_vs_decode_median": round(statistics.median(ratios), 4),
        "apply_per_s_rounds": [round(r) for r in apply_rates],
        "decode_per_s_rounds": [round(r) for r in decode_rates],
        "apply_gc_s": round(apply_gc.seconds, 3),
        "apply_gc_collections": apply_gc.collections,
        "preload_s": round(build_s, 1),
        "cpu_affinity": sorted(os.sched_getaffinity(0)),
        "rss_mb": status_mb()["VmRSS"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--live", default="10000,1000000", help="comma-separated live counts")
    parser.add_argument("--entries", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5, help="report the best of these")
    parser.add_argument("--cpu", type=int, help="pin this process to one core")
    parser.add_argument("--json", help="write results to this file")
    args = parser.parse_args(argv)
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    results = []
    for n in args.live.split(","):
        results.append(measure(int(n), args.entries, args.batch, args.rounds))
    print(f"{'live timers':>12} {'decode/s':>10} {'apply/s':>10} {'apply/decode':>12}")
    for r in results:
        print(
            f"{r['live_timers']:>12,} {r['decode_per_s']:>10,} {r['apply_per_s']:>10,} "
            f"{r['apply_vs_decode']:>12.3f}"
        )
    write_json(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
