"""Durable apply, replay, and memory at scale — each beside a raw baseline in the same run.

1. durable: schedules committed through `ShardStore.commit` (append + fold + one sync per
   batch) at batch sizes 1, 100 and 1000, beside raw LMDB puts of the same encoded log
   entries with one sync per batch;
2. replay: `replay.fold.replay` over the store's log, beside a raw cursor scan + msgpack
   decode of the same log;
3. memory: for each live-timer count, a fresh process opens a store preloaded with that many
   pending timers and applies a mixed workload; its peak RSS (VmHWM) and apply rate are
   reported. Pending timers live in LMDB, so the RSS should stay flat.

The preload for (3) writes message, timeline, lane-index and payload rows directly (the same
rows the reducer would write for delayed schedules, checked by invariants at 10k), because
folding ten million schedules through the reducer would take the whole benchmark budget.

    .venv/bin/python -m bench.storage_apply [--entries 20000] [--live 10000,1000000[,10000000]]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

import lmdb
import msgspec

import kernel as k
from adapters.embedded import schedule_record
from kernel.invariants import assert_invariants
from kernel.keys import message_id, str_key, timeline_key
from kernel.model import Counters, Message, PayloadRef, ShardMeta, Table, TimelineWork
from replay.fold import replay
from storage.codec import encode_entry, encode_value, lane_index_key
from storage.schema import SHARD_META_KEY, StoreOptions
from storage.store import ShardStore

PAYLOAD = b'{"kind":"bench","pad":"' + b"x" * 64 + b'"}'
T0_MS = 1_780_000_000_000


def _progress(label: str, done: int, total: int) -> None:
    sys.stderr.write(f"\r{label}: {done:,}/{total:,}")
    if done >= total:
        sys.stderr.write("\n")
    sys.stderr.flush()


def durable(root: str, entries: int) -> list[dict[str, Any]]:
    rows = []
    for batch in (1, 100, 1000):
        n = min(entries, 2000) if batch == 1 else entries
        store = ShardStore.open(os.path.join(root, f"durable-{batch}"))
        items = [
            schedule_record("q", f"k{i}", PAYLOAD, delay_ms=3_600_000, txn="t") for i in range(n)
        ]
        t = time.perf_counter()
        for start in range(0, n, batch):
            store.commit(items[start : start + batch], T0_MS)
        ours = n / (time.perf_counter() - t)
        blobs = [encode_entry(e) for e in store.iter_log()]
        store.close()
        env = lmdb.open(os.path.join(root, f"raw-{batch}"), map_size=1 << 34, sync=True)
        t = time.perf_counter()
        for start in range(0, n, batch):
            with env.begin(write=True) as txn:
                for pos in range(start, min(start + batch, n)):
                    txn.put(pos.to_bytes(8, "big"), blobs[pos])
        raw = n / (time.perf_counter() - t)
        env.close()
        rows.append(
            {
                "batch": batch,
                "entries": n,
                "commit_per_s": round(ours),
                "raw_put_sync_per_s": round(raw),
                "ratio": round(ours / raw, 4),
            }
        )
        _progress("durable", batch, 1000)
    return rows


def replay_rate(root: str) -> dict[str, Any]:
    store = ShardStore.open(os.path.join(root, "durable-1000"))
    n = store.log_last_position
    t = time.perf_counter()
    _, result = replay(store.iter_log(), store.config)
    ours = n / (time.perf_counter() - t)
    assert result.position == n
    decoder = msgspec.msgpack.Decoder(k.LogEntry)
    t = time.perf_counter()
    count = 0
    with store.env.env.begin() as txn, txn.cursor(db=store.env.log) as cursor:
        for _key, value in cursor:
            decoder.decode(value[4:])
            count += 1
    raw = count / (time.perf_counter() - t)
    store.close()
    return {
        "entries": n,
        "replay_per_s": round(ours),
        "raw_scan_decode_per_s": round(raw),
        "ratio": round(ours / raw, 4),
    }


def preload(path: str, live: int) -> None:
    """Write `live` pending timers as the reducer would, directly into a fresh store."""
    store = ShardStore.open(path)
    env = store.env
    digest = hashlib.sha256(PAYLOAD).hexdigest()
    deliver_ms = T0_MS + 86_400_000
    batch = 50_000
    for start in range(0, live, batch):
        with env.env.begin(write=True) as txn:
            for i in range(start, min(start + batch, live)):
                queue = f"q{i % 16}"
                mid = message_id("t", queue, f"live-{i}")
                msg = Message(
                    message_id=mid,
                    tenant="t",
                    queue=queue,
                    timer_key=f"live-{i}",
                    generation=1,
                    version=1,
                    status=k.Status.SCHEDULED,
                    txn="x",
                    payload_digest=digest,
                    payload_size=len(PAYLOAD),
                    partition_key=None,
                    headers=(),
                    destination="default",
                    capability=k.Capability(),
                    producer_sub=None,
                    encrypted=False,
                    deliver_at_ms=deliver_ms,
                    expire_at_ms=deliver_ms + 7 * 86_400_000,
                    action_at_ms=deliver_ms,
                    has_work=True,
                    request_digest="0" * 32,
                    attempts_admitted=0,
                    attempts_spent=0,
                    failures=0,
                    open_attempts=0,
                    uncertain_retries=0,
                    last_error=None,
                    last_attempt_id=None,
                    delivered_attempt_id=None,
                    evidence=None,
                    created_at_ms=T0_MS,
                    updated_at_ms=T0_MS,
                    created_position=0,
                    updated_position=0,
                )
                tkey = timeline_key(deliver_ms, mid, 1)
                work = TimelineWork(
                    "deliver", "t", queue, mid, 1, 1, deliver_ms, msg.expire_at_ms, len(PAYLOAD)
                )
                txn.put(str_key(mid), encode_value(msg), db=env.tables[Table.MESSAGES])
                txn.put(tkey, encode_value(work), db=env.tables[Table.TIMELINE])
                txn.put(lane_index_key("t", queue, tkey), b"", db=env.lane_timeline)
            if start + batch >= live:
                txn.put(
                    str_key(digest),
                    encode_value(PayloadRef(live, len(PAYLOAD))),
                    db=env.tables[Table.PAYLOADS],
                )
                txn.put(
                    SHARD_META_KEY,
                    encode_value(ShardMeta(counters=Counters(scheduled=live))),
                    db=env.meta,
                )
        _progress(f"preload {live:,}", min(start + batch, live), live)
    if live <= 10_000:
        with store.state_view() as state:
            assert_invariants(state)
    store.close()


def _status_mb() -> dict[str, float]:
    """Memory figures of this process from /proc: the peak (VmHWM, which, unlike
    ru_maxrss, starts afresh at exec) and the current resident set split into anonymous
    memory (Python objects) and file-backed pages (LMDB's map, reclaimable page cache)."""
    fields: dict[str, float] = {}
    with open("/proc/self/status") as f:
        for line in f:
            name, _, value = line.partition(":")
            if name in ("VmHWM", "VmRSS", "RssAnon", "RssFile"):
                fields[name] = round(int(value.split()[0]) / 1024, 1)
    return fields


def measure_child(path: str, entries: int) -> dict[str, Any]:
    """Runs in a fresh process: open the preloaded store and apply a mixed workload."""
    store = ShardStore.open(path, options=StoreOptions(check_invariants_on_open=False))
    after_open = _status_mb()
    live = store.meta.counters.scheduled
    items = []
    for i in range(entries):
        if i % 2 == 0:
            items.append(schedule_record("w", f"new-{i}", PAYLOAD, delay_ms=3_600_000, txn="t"))
        else:
            items.append((k.Cancel("t", f"q{i % 16}", f"live-{(i * 7919) % live}"), None))
    t = time.perf_counter()
    for start in range(0, entries, 1000):
        store.commit(items[start : start + 1000], T0_MS + 1000)
    rate = entries / (time.perf_counter() - t)
    store.close()
    return {
        "live_timers": live,
        "entries": entries,
        "apply_per_s": round(rate),
        "rss_after_open_mb": after_open["VmRSS"],
        **{f"{k.lower()}_mb": v for k, v in _status_mb().items()},
    }


def memory(root: str, lives: list[int], entries: int) -> list[dict[str, Any]]:
    rows = []
    for live in lives:
        path = os.path.join(root, f"live-{live}")
        preload(path, live)
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "bench.storage_apply",
                "--child",
                path,
                "--entries",
                str(entries),
            ],
            check=True,
            capture_output=True,
            text=True,
        )
        rows.append(json.loads(out.stdout))
        _progress("memory", len(rows), len(lives))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=20_000)
    parser.add_argument("--live", default="10000,1000000")
    parser.add_argument("--json", help="write results to this file")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(measure_child(args.child, args.entries)))
        return 0
    with tempfile.TemporaryDirectory(
        prefix="nereus-bench-", dir=os.environ.get("NEREUS_BENCH_DIR")
    ) as root:
        result: dict[str, Any] = {
            "durable": durable(root, args.entries),
            "replay": replay_rate(root),
            "memory": memory(root, [int(x) for x in args.live.split(",")], args.entries),
        }
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
            f"peak RSS {row['vmhwm_mb']} MB (anonymous {row['rssanon_mb']} MB, "
            f"LMDB map pages {row['rssfile_mb']} MB)"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
