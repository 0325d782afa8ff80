"""Durable apply, replay, and memory at scale — each beside a raw baseline in the same run.

1. durable: schedules committed through `ShardStore.commit` (append + fold + one sync per
   batch) at batch sizes 1, 100 and 1000, beside raw LMDB puts of the same encoded log
   entries with one sync per batch. The two alternate batch by batch, so both see the same
   disk (it is shared and its fsync latency drifts);
2. replay: `replay.fold.replay` over the store's log, beside a raw cursor scan + msgpack
   decode of the same log (alternating, median of 3);
3. memory: for each live-timer count, a store preloaded with that many pending timers (due in
   a day; `bench.preload`, checked against real commits) is opened by a fresh process that
   runs the shard runtime on it (the service as it waits) and pushes a workload through it:
   schedules of new timers and cancels of preloaded ones, in batches of 1000, then idles
   2 s. This process samples the child's /proc status every 10 ms for its peak anonymous RSS
   (RssAnon: Python objects, malloc, LMDB's dirty pages of a write transaction) beside the
   child's own VmHWM (the kernel's peak resident set, which also counts pages of the LMDB
   file mapped in as the B-trees are read: page cache, shared and reclaimable).

    .venv/bin/python -m bench.storage_apply [--entries 20000] [--live 10000,1000000[,10000000]]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import lmdb
import msgspec

from bench import preload
from bench.common import PAYLOAD, T0_MS, Progress, say, status_mb, write_json
from nereus import kernel as k
from nereus.adapters.clock import SystemClock
from nereus.adapters.local.destination import LocalDestination
from nereus.replay.fold import replay
from nereus.runtime.shard import ShardRuntime
from nereus.service.arguments import schedule_record
from nereus.storage.codec import encode_entry
from nereus.storage.schema import StoreOptions
from nereus.storage.store import ShardStore

BATCHES = (1, 100, 1000)


def durable(root: str, entries: int, batch1_entries: int = 2000) -> list[dict[str, Any]]:
    rows = []
    progress = Progress("storage_apply: durable commits", len(BATCHES))
    for done, batch in enumerate(BATCHES):
        n = min(entries, batch1_entries) if batch == 1 else entries
        store = ShardStore.open(os.path.join(root, f"durable-{batch}"))
        items = [
            schedule_record("q", f"k{i}", PAYLOAD, delay_ms=3_600_000, txn="t") for i in range(n)
        ]
        # The log entries the commits will write, byte for byte (checked below).
        blobs = [
            encode_entry(k.LogEntry(i + 1, T0_MS, record)) for i, (record, _) in enumerate(items)
        ]
        env = lmdb.open(os.path.join(root, f"raw-{batch}"), map_size=1 << 34, sync=True)
        ours_s = raw_s = 0.0
        for start in range(0, n, batch):
            t = time.perf_counter()
            store.commit(items[start : start + batch], T0_MS)
            ours_s += time.perf_counter() - t
            t = time.perf_counter()
            with env.begin(write=True) as txn:
                for pos in range(start, min(start + batch, n)):
                    txn.put(pos.to_bytes(8, "big"), blobs[pos])
            raw_s += time.perf_counter() - t
        assert [encode_entry(e) for e in store.iter_log()] == blobs
        store.close()
        env.close()
        rows.append(
            {
                "batch": batch,
                "entries": n,
                "commit_per_s": round(n / ours_s),
                "raw_put_sync_per_s": round(n / raw_s),
                "ratio": round(raw_s / ours_s, 4),
            }
        )
        progress.update(done + 1)
    return rows


def replay_rate(root: str, rounds: int = 3) -> dict[str, Any]:
    store = ShardStore.open(os.path.join(root, "durable-1000"))
    n = store.log_last_position
    decoder = msgspec.msgpack.Decoder(k.LogEntry)
    ours: list[float] = []
    raw: list[float] = []
    for _ in range(rounds):
        t = time.perf_counter()
        _, result = replay(store.iter_log(), store.config)
        ours.append(n / (time.perf_counter() - t))
        assert result.position == n
        t = time.perf_counter()
        count = 0
        with store.env.env.begin() as txn, txn.cursor(db=store.env.log) as cursor:
            for _key, value in cursor:
                decoder.decode(value[4:])
                count += 1
        raw.append(count / (time.perf_counter() - t))
    store.close()
    return {
        "entries": n,
        "rounds": rounds,
        "replay_per_s": round(statistics.median(ours)),
        "raw_scan_decode_per_s": round(statistics.median(raw)),
        "ratio": round(statistics.median(ours) / statistics.median(raw), 4),
    }


# Memory -----------------------------------------------------------------------------------


def measure_child(path: str, entries: int, idle_s: float) -> dict[str, Any]:
    """Runs in a fresh process: the shard runtime on the preloaded store, a workload pushed
    through it, then idle. Prints its figures as JSON."""
    store = ShardStore.open(path, options=StoreOptions(check_invariants_on_open=False))
    after_open = status_mb()
    live = store.meta.counters.scheduled
    dest = LocalDestination(path + "-destination")
    runtime = ShardRuntime(store, dest, SystemClock(assumed_error_ms=1.0))
    runtime.start()
    pairs = entries // 2
    items: list[Any] = []
    for c in range(pairs):
        j = (c * 7919) % live  # distinct preloaded timers while pairs <= live
        items.append(
            schedule_record(
                "w", f"new-{c}", PAYLOAD, tenant=preload.TENANT, delay_ms=3_600_000, txn="t"
            )
        )
        items.append((k.Cancel(preload.TENANT, preload.queue_of(j), preload.key_of(j)), None))
    t = time.perf_counter()
    codes: dict[str, int] = {}
    for start in range(0, len(items), 1000):
        for outcome in runtime.execute(items[start : start + 1000], 120):
            codes[str(outcome.code)] = codes.get(str(outcome.code), 0) + 1
    rate = len(items) / (time.perf_counter() - t)
    time.sleep(idle_s)
    halted = runtime.halted
    at_end = status_mb()
    runtime.stop()
    still_live = store.meta.counters.scheduled
    dest.close()
    store.close()
    return {
        "live_timers": live,
        "live_timers_at_end": still_live,
        "entries": len(items),
        "outcomes": codes,
        "apply_per_s": round(rate),
        "runtime_halted": None if halted is None else str(halted),
        "rss_after_open_mb": after_open["VmRSS"],
        "vmhwm_mb": at_end["VmHWM"],
        "at_end_mb": at_end,
    }


def _sample(proc: subprocess.Popen[str]) -> dict[str, float]:
    """Peak of each /proc status figure of a running child, sampled every 10 ms."""
    peaks: dict[str, float] = {}
    while proc.poll() is None:
        try:
            for name, value in status_mb(proc.pid).items():
                peaks[name] = max(peaks.get(name, 0.0), value)
        except (OSError, ValueError, IndexError):
            pass  # exiting
        time.sleep(0.01)
    return peaks


def memory(root: str, lives: list[int], entries: int, idle_s: float = 2.0) -> list[dict[str, Any]]:
    rows = []
    for live in lives:
        path = os.path.join(root, f"live-{live}")
        say(f"storage_apply: preloading {live:,} pending timers into LMDB")
        t = time.perf_counter()
        # In its own process: sorting ten million message ids takes a gigabyte.
        subprocess.run(
            [sys.executable, "-m", "bench.storage_apply", "--build", path, "--live", str(live)],
            check=True,
        )
        build_s = time.perf_counter() - t
        say(f"storage_apply: {live:,} timers waiting; measuring the runtime's memory")
        with tempfile.TemporaryFile("w+") as errors:
            child = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "bench.storage_apply",
                    "--child",
                    path,
                    "--entries",
                    str(entries),
                    "--idle",
                    str(idle_s),
                ],
                stdout=subprocess.PIPE,
                stderr=errors,
                text=True,
            )
            peaks = _sample(child)
            out, _ = child.communicate()
            errors.seek(0)
            error_text = errors.read()
        sys.stderr.write(error_text)
        if child.returncode != 0:
            last = (error_text.strip().splitlines() or ["?"])[-1]
            raise RuntimeError(f"memory child for {live:,} timers failed: {last[:400]}")
        row: dict[str, Any] = json.loads(out)
        row.update(
            {
                "peak_rssanon_mb": peaks.get("RssAnon"),
                "peak_rssfile_mb": peaks.get("RssFile"),
                "peak_vmrss_mb": peaks.get("VmRSS"),
                "sample_interval_ms": 10,
                "preload_s": round(build_s, 1),
                "store_file_mb": round(os.path.getsize(os.path.join(path, "data.mdb")) / 2**20),
            }
        )
        rows.append(row)
        _remove(path)
    return rows


def _remove(path: str) -> None:
    """Free the disk at once: a 10M store is many gigabytes."""
    for base in (path, path + "-destination"):
        if os.path.isdir(base):
            for name in os.listdir(base):
                os.remove(os.path.join(base, name))
            os.rmdir(base)


def build(path: str, live: int) -> None:
    progress = Progress(f"storage_apply: preload {live:,} (4 passes)", 4 * live)
    # Scheduled now, due in a day: the runtime that opens the store finds nothing due.
    now_ms = int(time.time() * 1000)
    preload.lmdb_store(path, live, t0_ms=now_ms, on_progress=progress.update)
    progress.update(4 * live)


def run(
    entries: int, lives: list[int], batch1_entries: int = 2000, *, keep_going: bool = False
) -> dict[str, Any]:
    """With `keep_going`, a failure of the memory part is reported in the result (as
    `memory_error`) beside the durable and replay figures instead of raised."""
    with tempfile.TemporaryDirectory(
        prefix="nereus-bench-", dir=os.environ.get("NEREUS_BENCH_DIR")
    ) as root:
        result: dict[str, Any] = {
            "durable": durable(root, entries, batch1_entries),
            "replay": replay_rate(root),
        }
        try:
            result["memory"] = memory(root, lives, entries)
        except Exception as exc:
            if not keep_going:
                raise
            result["memory_error"] = f"{type(exc).__name__}: {exc}"
        return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--entries", type=int, default=20_000)
    parser.add_argument("--live", default="10000,1000000")
    parser.add_argument("--json", help="write results to this file")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--idle", type=float, default=2.0, help=argparse.SUPPRESS)
    parser.add_argument("--build", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(measure_child(args.child, args.entries, args.idle)))
        return 0
    if args.build:
        build(args.build, int(args.live))
        return 0
    result = run(args.entries, [int(x) for x in args.live.split(",")])
    for row in result["durable"]:
        print(
            f"durable batch {row['batch']:>5}: {row['commit_per_s']:>8,} entries/s  raw put+sync "
            f"{row['raw_put_sync_per_s']:>9,}/s  ratio {row['ratio']:.3f}"
        )
    r = result["replay"]
    print(
        f"replay: {r['replay_per_s']:,} entries/s  "
        f"raw scan+decode {r['raw_scan_decode_per_s']:,}/s  ratio {r['ratio']:.3f}"
    )
    for row in result["memory"]:
        print(
            f"live {row['live_timers']:>11,}: apply {row['apply_per_s']:>7,}/s  "
            f"peak anonymous RSS {row['peak_rssanon_mb']} MB, VmHWM {row['vmhwm_mb']} MB "
            f"(LMDB file pages at peak {row['peak_rssfile_mb']} MB)"
        )
    write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
