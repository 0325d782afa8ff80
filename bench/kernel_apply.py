"""Reducer apply rate over an in-memory base, beside the raw msgspec decode rate.

For each live-timer count N: preload N pending timers (through the reducer itself, flushed
into a dict base in batches, as storage would), then time a mixed workload of encoded log
entries — new schedules, upserts, cancels, admissions and their outcomes — two ways in the
same run: (a) raw `msgspec` decode of the entries, (b) decode + `kernel.reduce` + a flush of
the overlay into the base every `--batch` changed rows (`storage.memory.MemoryStore`). The
ratio b/a is the kernel's cost over the floor any Python consumer of the log pays.

    .venv/bin/python -m bench.kernel_apply --live 10000,1000000
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from collections.abc import Iterator
from typing import Any

import kernel as k
from kernel.records import decode_entry, encode_entry
from storage.memory import MemoryStore

T0_MS = 1_780_000_000_000
DIGEST = hashlib.sha256(b"bench").hexdigest()


def _progress(label: str, done: int, total: int) -> None:
    if sys.stderr.isatty() or done == total:
        sys.stderr.write(f"\r{label}: {done:,}/{total:,}")
        if done == total:
            sys.stderr.write("\n")
        sys.stderr.flush()


def preload(live: int, batch: int) -> MemoryStore:
    store = MemoryStore(batch_entries=batch)

    def schedules() -> Iterator[k.LogEntry]:
        for i in range(live):
            record = k.Schedule("t", f"q{i % 8}", f"live-{i}", "tx", DIGEST, 64, delay_ms=3_600_000)
            if (i + 1) % (batch * 100) == 0:
                _progress(f"preload {live:,}", i + 1, live)
            yield k.LogEntry(i + 1, T0_MS, record)

    store.feed(schedules())
    _progress(f"preload {live:,}", live, live)
    return store


def workload(start: int, count: int, live: int) -> Iterator[k.LogEntry]:
    """Mixed entries, each valid against the preloaded state. Admissions target fresh keys
    scheduled with delay 0 a few entries earlier."""
    position = start
    now_ms = T0_MS + 1_000
    cycle = 0
    while position - start < count:
        cycle += 1
        key = f"w-{cycle}"
        mid = k.message_id("t", "hot", key)
        steps: list[k.Record] = [
            k.Schedule("t", "hot", key, "tx", DIGEST, 64, delay_ms=0),
            k.Schedule("t", "hot", key, "tx", DIGEST, 64, delay_ms=0),  # identical retry
            k.PublishAdmission(
                mid,
                1,
                1,
                f"{mid}.1.1",
                "c",
                "bench",
                "d",
                k.Capability(),
                k.TrustedInterval(now_ms - 5, now_ms + 5),
                k.Capacity(True),
            ),
            k.PublishOutcome(
                f"{mid}.1.1", mid, 1, k.Published(k.Evidence("hot", 0, cycle, now_ms))
            ),
            k.Cancel("t", f"q{cycle % 8}", f"live-{cycle % live}"),
        ]
        for record in steps:
            position += 1
            yield k.LogEntry(position, now_ms, record)


def measure(live: int, entries: int, batch: int) -> dict[str, Any]:
    store = preload(live, batch)
    position = store.meta.position
    encoded = [encode_entry(e) for e in workload(position, entries, live)]
    n = len(encoded)

    t = time.perf_counter()
    for blob in encoded:
        decode_entry(blob)
    decode_s = time.perf_counter() - t

    t = time.perf_counter()
    store.feed(decode_entry(blob) for blob in encoded)
    apply_s = time.perf_counter() - t
    assert store.meta.position == position + n
    return {
        "live_timers": live,
        "entries": n,
        "batch": batch,
        "decode_per_s": round(n / decode_s),
        "apply_per_s": round(n / apply_s),
        "apply_vs_decode": round((n / apply_s) / (n / decode_s), 4),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--live", default="10000,1000000", help="comma-separated live counts")
    parser.add_argument("--entries", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--json", help="write results to this file")
    args = parser.parse_args(argv)
    results = [measure(int(n), args.entries, args.batch) for n in args.live.split(",")]
    print(f"{'live timers':>12} {'decode/s':>10} {'apply/s':>10} {'apply/decode':>12}")
    for r in results:
        print(
            f"{r['live_timers']:>12,} {r['decode_per_s']:>10,} {r['apply_per_s']:>10,} "
            f"{r['apply_vs_decode']:>12.3f}"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
