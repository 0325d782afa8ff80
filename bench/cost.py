"""What one timer costs in CPU: a fired timer and a durable schedule, beside raw baselines.

The embedded shape (the shard log in LMDB, the local destination), measured in process CPU
time (user + system, every thread) rather than wall time, and, with `--instructions`, in
instructions counted by valgrind's callgrind, which a shared VM's speed does not move.

1. fire: N timers, already due and committed beforehand, fired through the whole runtime
   (claim, Admission commit, send, outcome commit) by `run_once` on this thread. Raw: the
   local destination appending the same records durably in batches of the tick's size:
   the floor any scheduler writing there pays.
2. schedule, batches of B: N schedules of distinct payloads submitted to the runtime in
   units of B and committed by `run_once` on this thread (the library's path when no
   runtime thread runs). Raw: the same log entries put into LMDB, one sync per batch.
3. `--instructions`: each measurement again in a child process under callgrind with
   N / 4 items; the instructions of the measured part are those of a child that runs it
   minus those of one that stops just before it.

    .venv/bin/python -m bench.cost [--timers 20000] [--batches 256,1000] [--instructions]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any, TypeVar

import lmdb

from bench.common import PAYLOAD, T0_MS, process_cpu_s, process_system_s, say, write_json
from nereus import kernel as k
from nereus.adapters.clock import SystemClock
from nereus.adapters.local.destination import LocalDestination
from nereus.kernel.records import Appendable
from nereus.runtime.config import RuntimeConfig
from nereus.runtime.destination import PreparedPublish, Send
from nereus.runtime.shard import ShardRuntime
from nereus.service.arguments import schedule_record
from nereus.storage.codec import encode_entry
from nereus.storage.schema import StoreOptions
from nereus.storage.store import ShardStore

T = TypeVar("T")

# Under callgrind no 64 GiB map can be reserved: the children map 1 GiB per environment.
SMALL_MAP_BYTES = 1 << 30


def _items(first: int, count: int, delay_ms: int) -> list[Appendable]:
    return [
        schedule_record("q", f"t{i}", PAYLOAD + str(i).encode(), delay_ms=delay_ms, txn="tx")
        for i in range(first, first + count)
    ]


def _open(root: str, map_bytes: int | None) -> tuple[ShardStore, LocalDestination, ShardRuntime]:
    options = StoreOptions(map_size_bytes=map_bytes) if map_bytes else StoreOptions()
    store = ShardStore.open(os.path.join(root, "shard"), options=options)
    dest = LocalDestination(
        os.path.join(root, "destination"), map_size_bytes=map_bytes or 64 * 1024**3
    )
    runtime = ShardRuntime(store, dest, SystemClock(assumed_error_ms=1.0), config=RuntimeConfig())
    return store, dest, runtime


def fire(
    root: str, n: int, *, run: bool = True, map_bytes: int | None = None
) -> tuple[float, float]:
    """CPU seconds of firing `n` due timers, and the system part of them (0 with run=False:
    only the setup)."""
    store, dest, runtime = _open(root, map_bytes)
    for first in range(0, n, 1000):
        store.commit(_items(first, min(1000, n - first), 0), int(time.time() * 1000))
    time.sleep(0.01)  # every timer is due
    started, started_system = process_cpu_s(), process_system_s()
    while run and store.meta.counters.delivered < n:
        runtime.run_once()
    took, system = process_cpu_s() - started, process_system_s() - started_system
    runtime.stop()
    store.close()
    dest.close()
    return (took, system) if run else (0.0, 0.0)


def raw_fire(root: str, n: int) -> float:
    dest = LocalDestination(os.path.join(root, "raw-destination"))
    per_tick = RuntimeConfig().max_admissions_per_tick
    now = int(time.time() * 1000)
    sends = [
        Send(
            f"{i:032x}.1.1",
            PreparedPublish(
                "local", "q", None, PAYLOAD + str(i).encode(), (), f"{i:032x}", 1, "tx", now,
                None, False,
            ),
        )
        for i in range(n)
    ]  # fmt: skip
    started = process_cpu_s()
    for first in range(0, n, per_tick):
        dest.submit(sends[first : first + per_tick], now)
        dest.poll(0)
    took = process_cpu_s() - started
    dest.close()
    return took


def schedule(
    root: str,
    n: int,
    batch: int,
    *,
    run: bool = True,
    map_bytes: int | None = None,
    sizes: dict[str, int] | None = None,
) -> float:
    """CPU seconds of committing `n` schedules in units of `batch` through the runtime;
    `sizes`, if given, receives the bytes of B-tree pages each sub-database then holds."""
    store, dest, runtime = _open(root, map_bytes)
    units = [_items(first, min(batch, n - first), 3_600_000) for first in range(0, n, batch)]
    started = process_cpu_s()
    for unit in units if run else ():
        future = runtime.submit(unit)
        while not future.done():
            runtime.run_once()
        assert all(o.code is k.Code.SCHEDULED for o in future.result(0))
    took = process_cpu_s() - started
    if sizes is not None:
        sizes.update(page_bytes(store))
    runtime.stop()
    store.close()
    dest.close()
    return took


def page_bytes(store: ShardStore) -> dict[str, int]:
    """Bytes of the branch, leaf and overflow pages of every sub-database but the log's
    and the meta's: what the live timers themselves occupy, their schedules' story marks
    included."""
    env = store.env
    found: dict[str, int] = {}
    with env.env.begin() as txn:
        for name, db in {**env.state_dbs(), "story": env.story}.items():
            stat = txn.stat(db)
            pages = stat["branch_pages"] + stat["leaf_pages"] + stat["overflow_pages"]
            found[name] = pages * stat["psize"]
    return found


def raw_schedule(root: str, n: int, batch: int) -> float:
    blobs = [
        encode_entry(k.LogEntry(i + 1, T0_MS, record))
        for i, (record, _) in enumerate(_items(0, n, 0))
    ]
    env = lmdb.open(os.path.join(root, "raw-log"), map_size=1 << 34, sync=True)
    started = process_cpu_s()
    for first in range(0, n, batch):
        with env.begin(write=True) as txn:
            for i in range(first, min(first + batch, n)):
                txn.put(i.to_bytes(8, "big"), blobs[i])
    took = process_cpu_s() - started
    env.close()
    return took


def _in_scratch(measure: Callable[[str], T]) -> T:
    root = tempfile.mkdtemp(prefix="nereus-cost-", dir=os.environ.get("NEREUS_BENCH_DIR"))
    try:
        return measure(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


# Instructions -----------------------------------------------------------------------------


def _child(kind: str, n: int, batch: int, run: bool) -> None:
    """Run one measurement (or its setup only) in this process, for callgrind to count."""
    if kind == "fire":
        _in_scratch(lambda root: fire(root, n, run=run, map_bytes=SMALL_MAP_BYTES))
    else:
        _in_scratch(lambda root: schedule(root, n, batch, run=run, map_bytes=SMALL_MAP_BYTES))


def _instructions(kind: str, n: int, batch: int, run: bool) -> int:
    command = [
        "valgrind",
        "--tool=callgrind",
        "--callgrind-out-file=/dev/null",
        sys.executable,
        "-m",
        "bench.cost",
        "--child",
        kind,
        "--timers",
        str(n),
        "--batch",
        str(batch),
        *([] if run else ["--setup-only"]),
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    found = re.search(r"Collected : (\d+)", done.stderr)
    if done.returncode != 0 or found is None:
        raise RuntimeError(f"callgrind of {kind} failed: {done.stderr[-1500:]}")
    return int(found.group(1))


def instructions_per_item(kind: str, n: int, batch: int = 0) -> int:
    whole = _instructions(kind, n, batch, run=True)
    setup = _instructions(kind, n, batch, run=False)
    return round((whole - setup) / n)


# The run ----------------------------------------------------------------------------------


def run(timers: int, batches: list[int], instructions: bool) -> dict[str, Any]:
    say(f"cost: firing {timers:,} timers")
    fire_s, fire_system_s = _in_scratch(lambda root: fire(root, timers))
    raw_fire_s = _in_scratch(lambda root: raw_fire(root, timers))
    result: dict[str, Any] = {
        "fire": {
            "timers": timers,
            "cpu_us_per_timer": round(fire_s / timers * 1e6, 1),
            "system_cpu_us_per_timer": round(fire_system_s / timers * 1e6, 1),
            "raw_append_cpu_us_per_record": round(raw_fire_s / timers * 1e6, 1),
        },
        "schedule": [],
    }
    for batch in batches:
        say(f"cost: {timers:,} durable schedules in batches of {batch}")
        sizes: dict[str, int] = {}
        ours = _in_scratch(
            lambda root, b=batch, out=sizes: schedule(root, timers, b, sizes=out)  # type: ignore[misc]
        )
        raw = _in_scratch(lambda root, b=batch: raw_schedule(root, timers, b))  # type: ignore[misc]
        result["schedule"].append(
            {
                "batch": batch,
                "schedules": timers,
                "cpu_us_per_schedule": round(ours / timers * 1e6, 1),
                "raw_put_sync_cpu_us_per_entry": round(raw / timers * 1e6, 1),
                "state_bytes_per_live_timer": round(sum(sizes.values()) / timers),
                "state_bytes_per_live_timer_by_table": {
                    name: round(size / timers) for name, size in sorted(sizes.items()) if size
                },
            }
        )
    if instructions:
        if shutil.which("valgrind") is None:
            raise SystemExit("cost: --instructions needs valgrind")
        small = max(500, timers // 4)
        say(f"cost: counting instructions under callgrind ({small:,} items each)")
        result["fire"]["instructions_per_timer"] = instructions_per_item("fire", small)
        for row in result["schedule"]:
            row["instructions_per_schedule"] = instructions_per_item(
                "schedule", small, row["batch"]
            )
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--timers", type=int, default=20_000)
    parser.add_argument("--batches", default="256,1000")
    parser.add_argument("--instructions", action="store_true", help="count with callgrind too")
    parser.add_argument("--json", help="write results to this file")
    parser.add_argument("--child", choices=("fire", "schedule"), help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--setup-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(args.child, args.timers, args.batch, not args.setup_only)
        return 0
    result = run(args.timers, [int(b) for b in args.batches.split(",")], args.instructions)
    f = result["fire"]
    extra = f"  {f['instructions_per_timer']:,} instructions" if args.instructions else ""
    print(
        f"fired timer: {f['cpu_us_per_timer']} us CPU ({f['system_cpu_us_per_timer']} us system)"
        f"{extra}  "
        f"(raw local append {f['raw_append_cpu_us_per_record']} us)"
    )
    for row in result["schedule"]:
        extra = f"  {row['instructions_per_schedule']:,} instructions" if args.instructions else ""
        print(
            f"durable schedule, batches of {row['batch']}: {row['cpu_us_per_schedule']} us CPU"
            f"{extra}  (raw put+sync {row['raw_put_sync_cpu_us_per_entry']} us)"
        )
        tables = ", ".join(
            f"{t} {b}" for t, b in row["state_bytes_per_live_timer_by_table"].items()
        )
        print(f"  state: {row['state_bytes_per_live_timer']} bytes a live timer ({tables})")
    write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
