"""The embedded service writing payloads of every size, until SIGTERM (a clean stop) or SIGKILL.

Run as `python -m tests.support.restart_worker DIR SEED`. It opens Nereus on DIR (shard store in
DIR/shard, local destination in DIR/destination) with every pre-open check, the host clock
and an assumed error of 2 ms, starts the runtime thread and prints `ready`; if a store is
refused it prints `refused: <message>` and exits 3. Then it sends a seeded stream of command
batches through the runtime, each one group commit: schedules with payloads from 10 B to
400 KB, half of them due within 300 ms (so fires, and the deletion of delivered payloads,
interleave with commands) and half in 2-30 s; upserts of live keys; cancels; and, for half
the schedules, a cancel or a replacement of that same key in the same batch, as when a
client corrects what it just sent. A payload stored and dropped again within one commit is
an overflow run LMDB allocates and frees before writing it, so the newest meta page often
counts pages past the end of the file: the state storage/lmdbcheck.py used to refuse.
SIGTERM closes everything cleanly, prints `stopped` and exits 0; a safety deadline ends an
orphaned worker.
"""

from __future__ import annotations

import random
import signal
import sys
import time
from types import FrameType

from nereus.adapters.clock import SystemClock
from nereus.adapters.local.embedded import Nereus
from nereus.kernel.records import Appendable, Cancel
from nereus.service.arguments import schedule_record
from nereus.storage.errors import StoreError

QUEUES = ("alpha", "beta")
POOL = tuple(f"pool/{i}" for i in range(24))
SIZES = (10, 100, 1_000, 3_000, 9_000, 40_000, 150_000, 400_000)
SOON_MS = 300
LATER_MS = (2_000, 30_000)
WORKER_DEADLINE_S = 60.0
REFUSED_EXIT = 3


def payload(rng: random.Random) -> bytes:
    size = rng.choice(SIZES)
    size = rng.randint(size // 2 + 1, size)
    return rng.randbytes(size)


def batch(rng: random.Random, live: list[tuple[str, str]], fresh: int) -> list[Appendable]:
    """One commit's worth of commands: mostly schedules, with upserts and cancels of keys
    scheduled earlier or earlier in this very batch."""
    items: list[Appendable] = []
    for n in range(rng.randint(1, 6)):
        queue = rng.choice(QUEUES)
        roll = rng.random()
        if roll < 0.2 and live:
            queue, key = rng.choice(live)
            items.append((Cancel("default", queue, key), None))
            continue
        key = rng.choice(POOL) if roll < 0.6 else f"fresh/{fresh}/{n}"
        delay_ms = rng.randint(0, SOON_MS) if rng.random() < 0.5 else rng.randint(*LATER_MS)
        items.append(schedule_record(queue, key, payload(rng), delay_ms=delay_ms, partition=key))
        live.append((queue, key))
        if rng.random() < 0.5:  # canceled or replaced within the same commit
            if rng.random() < 0.5:
                items.append((Cancel("default", queue, key), None))
            else:
                items.append(schedule_record(queue, key, payload(rng), delay_ms=delay_ms))
    del live[:-64]
    return items


def main(argv: list[str]) -> int:
    data_dir, seed = argv[0], int(argv[1])
    rng = random.Random(seed)
    stopping = False

    def stop(_signum: int, _frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    try:
        nereus = Nereus.open(data_dir, clock=SystemClock(assumed_error_ms=2.0))
    except StoreError as exc:
        print(f"refused: {exc}", flush=True)
        return REFUSED_EXIT
    try:
        nereus.start()
        print("ready", flush=True)
        live: list[tuple[str, str]] = []
        deadline = time.monotonic() + WORKER_DEADLINE_S
        fresh = 0
        while not stopping and time.monotonic() < deadline:
            fresh += 1
            nereus.runtime.execute(batch(rng, live, fresh))
            if nereus.runtime.halted is not None:
                raise RuntimeError(f"runtime halted: {nereus.runtime.halted!r}")
    finally:
        nereus.close()
    print("stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
