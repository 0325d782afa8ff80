"""The fire path on the embedded default: timers fired per second, and fire lag.

Three measurements in one run, on fresh stores in a temporary directory:

1. throughput: N timers already due are fired through the full runtime (claim, Admission
   group commit, send to the local destination, outcome group commit) as fast as ticks
   go; beside it the raw local destination append rate of the same records in batches of
   the same size — the floor any scheduler writing there pays;
2. lateness: a producer thread schedules timers (delay 200 ms) at a steady rate R for D
   seconds while the runtime thread fires them; fire lag = deliveredAt - deliverAt, read
   back from the destination, p50/p99/max;
3. early deliveries across all runs (must be 0).

    .venv/bin/python -m bench.fire [--timers 20000] [--rates 1000,5000] [--seconds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from typing import Any

from adapters.clock import SystemClock
from adapters.embedded import schedule_record
from adapters.local_destination import LocalDestination
from runtime.config import RuntimeConfig
from runtime.destination import PreparedPublish, Send
from runtime.shard import ShardRuntime
from storage.store import ShardStore

PAYLOAD = b'{"kind":"bench","pad":"' + b"x" * 64 + b'"}'
CLOCK_ERROR_MS = 1.0


def _open(root: str, name: str) -> tuple[ShardStore, LocalDestination, ShardRuntime]:
    store = ShardStore.open(os.path.join(root, name, "shard"))
    dest = LocalDestination(os.path.join(root, name, "destination"))
    runtime = ShardRuntime(
        store, dest, SystemClock(assumed_error_ms=CLOCK_ERROR_MS), config=RuntimeConfig()
    )
    return store, dest, runtime


def _lags(dest: LocalDestination, queue: str) -> list[int]:
    return sorted(r.delivered_at_ms - r.deliver_at_ms for r in dest.iter_all(queue))


def _pct(values: list[int], q: float) -> int:
    return values[min(len(values) - 1, int(len(values) * q))] if values else 0


def throughput(root: str, timers: int) -> dict[str, Any]:
    store, dest, runtime = _open(root, "throughput")
    batch = 2000
    now = int(time.time() * 1000)
    for start in range(0, timers, batch):
        items = [
            schedule_record("q", f"t{i}", PAYLOAD, delay_ms=0, txn="tx")
            for i in range(start, min(start + batch, timers))
        ]
        store.commit(items, now)
    time.sleep(0.01)
    t = time.perf_counter()
    while store.meta.counters.delivered < timers:
        runtime.tick()
        sys.stderr.write(f"\rfire {store.meta.counters.delivered:,}/{timers:,}")
    fired_s = time.perf_counter() - t
    sys.stderr.write("\n")
    early = sum(1 for lag in _lags(dest, "q") if lag < 0)
    store.close()
    dest.close()

    raw = LocalDestination(os.path.join(root, "raw-destination"))
    per_tick = RuntimeConfig().max_admissions_per_tick
    sends = [
        Send(
            f"{i:032x}.1.1",
            PreparedPublish(
                "local", "q", None, PAYLOAD, (), f"{i:032x}", 1, "tx", now, None, False
            ),
        )
        for i in range(timers)
    ]
    t = time.perf_counter()
    for start in range(0, timers, per_tick):
        raw.submit(sends[start : start + per_tick], now)
        raw.poll(0)
    raw_s = time.perf_counter() - t
    raw.close()
    return {
        "timers": timers,
        "fired_per_s": round(timers / fired_s),
        "raw_append_per_s": round(timers / raw_s),
        "fired_vs_raw": round((timers / fired_s) / (timers / raw_s), 4),
        "early": early,
    }


def lateness(root: str, rate: int, seconds: float) -> dict[str, Any]:
    store, dest, runtime = _open(root, f"lateness-{rate}")
    runtime.start()
    stop = threading.Event()
    sent = 0

    def produce() -> None:
        nonlocal sent
        step_s = 0.01
        per_step = max(1, int(rate * step_s))
        next_t = time.perf_counter()
        while not stop.is_set():
            items = [
                schedule_record("q", f"k{sent + j}", PAYLOAD, delay_ms=200, txn="tx")
                for j in range(per_step)
            ]
            runtime.submit(items)
            sent += per_step
            next_t += step_s
            time.sleep(max(0.0, next_t - time.perf_counter()))

    producer = threading.Thread(target=produce)
    producer.start()
    t0 = time.time()
    while time.time() - t0 < seconds:
        time.sleep(0.5)
        sys.stderr.write(f"\rrate {rate}/s: {store.meta.counters.delivered:,} delivered")
    stop.set()
    producer.join()
    deadline = time.time() + 30
    while store.meta.counters.delivered < sent and time.time() < deadline:
        time.sleep(0.05)
    sys.stderr.write("\n")
    runtime.stop()
    lags = _lags(dest, "q")
    store.close()
    dest.close()
    return {
        "rate_per_s": rate,
        "scheduled": sent,
        "delivered": len(lags),
        "lag_p50_ms": _pct(lags, 0.50),
        "lag_p99_ms": _pct(lags, 0.99),
        "lag_max_ms": lags[-1] if lags else 0,
        "early": sum(1 for lag in lags if lag < 0),
        "clock_error_assumed_ms": CLOCK_ERROR_MS,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timers", type=int, default=20_000)
    parser.add_argument("--rates", default="1000,5000")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--json", help="write results to this file")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="nereus-bench-") as root:
        result: dict[str, Any] = {
            "throughput": throughput(root, args.timers),
            "lateness": [lateness(root, int(r), args.seconds) for r in args.rates.split(",")],
        }
    tp: dict[str, Any] = result["throughput"]
    print(
        f"fired/s {tp['fired_per_s']:,}  raw local append/s {tp['raw_append_per_s']:,}  "
        f"ratio {tp['fired_vs_raw']:.3f}  early {tp['early']}"
    )
    for lat in result["lateness"]:
        print(
            f"steady {lat['rate_per_s']:>5}/s: "
            f"delivered {lat['delivered']:,}/{lat['scheduled']:,}  "
            f"lag p50 {lat['lag_p50_ms']} ms  p99 {lat['lag_p99_ms']} ms  "
            f"max {lat['lag_max_ms']} ms  early {lat['early']}"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
