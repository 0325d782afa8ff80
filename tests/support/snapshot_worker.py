"""Snapshots taken while a store keeps writing, for the power-loss test of snapshot files.

Run as `python -m tests.support.snapshot_worker DIR SEED TIMERS`: it opens (or creates) the store in
DIR; a new store first gets TIMERS schedules with payloads (so that a snapshot is hundreds of
writes, not one); it prints `ready`, then forever runs a few steps of the seeded crash
workload (tests/support/crash_worker.py) and takes a snapshot, printing `ack PATH POSITION DIGEST`
once `write_snapshot` has returned (what `nereus snapshot` tells its operator). Now and then
it takes two in a row, so that the second replaces a file of the same name. A safety
deadline ends an orphan.
"""

from __future__ import annotations

import random
import sys
import time

from nereus import kernel as k
from nereus.storage.snapshot import write_snapshot
from nereus.storage.store import ShardStore
from tests.support.builders import T0_MS, TENANT
from tests.support.crash_worker import CONFIG, WORKER_DEADLINE_S, Workload, digest_of

PRELOAD_BATCH = 500


def preload(store: ShardStore, rng: random.Random, timers: int) -> None:
    for start in range(0, timers, PRELOAD_BATCH):
        items = []
        for i in range(start, min(timers, start + PRELOAD_BATCH)):
            payload = rng.randbytes(rng.choice((20, 200, 2_000)))
            record = k.Schedule(
                TENANT, "bulk", f"bulk-{i}", "t", digest_of(payload), len(payload), delay_ms=15_000
            )
            items.append((record, payload))
        store.commit(items, T0_MS)


def main(argv: list[str]) -> int:
    path, seed, timers = argv[1], int(argv[2]), int(argv[3])
    rng = random.Random(seed)
    deadline = time.monotonic() + WORKER_DEADLINE_S
    with ShardStore.open(path, config=CONFIG) as store:
        if store.log_last_position == 0:
            preload(store, rng, timers)
        workload = Workload(
            rng, max(T0_MS, store.log_last_persisted_at_ms), store.log_last_position
        )
        print("ready", flush=True)
        while time.monotonic() < deadline:
            for _ in range(rng.randint(0, 3)):
                workload.step(store)
            for _ in range(2 if rng.random() < 0.2 else 1):
                file, header = write_snapshot(store)
                print(f"ack {file} {header.position} {header.digest}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
