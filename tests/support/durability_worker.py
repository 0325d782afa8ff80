"""The embedded library under steady load, for the power-loss test of the whole stack.

Run as `python -m tests.support.durability_worker DIR SEED`: it opens `Nereus` on DIR (shard store
and local destination), starts the runtime thread, prints `ready`, then schedules timers
that come due within a few hundred milliseconds, one call at a time, printing `ack KEY` as
each call returns (durable, by the library's contract), until it is killed (a safety
deadline ends an orphan).
"""

from __future__ import annotations

import random
import sys
import time

from nereus import Nereus

WORKER_DEADLINE_S = 120.0


def main(argv: list[str]) -> int:
    path, seed = argv[1], int(argv[2])
    rng = random.Random(seed)
    deadline = time.monotonic() + WORKER_DEADLINE_S
    with Nereus.open(path, assume_clock_error_ms=5) as nereus:
        nereus.start()
        print("ready", flush=True)
        i = 0
        while time.monotonic() < deadline:
            key = f"k{i}"
            delay_ms = rng.choice((0, 10, 50, 200, 60_000))
            result = nereus.schedule("q", key, b"payload %d" % i, delay_ms=delay_ms)
            assert result.ok, result
            print(f"ack {key}", flush=True)
            i += 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
