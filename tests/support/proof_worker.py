"""An embedded service killed with attempts in flight (tests/adapters/local/test_local_proof_kill).

`python -m tests.support.proof_worker DIR N`: opens Nereus on DIR (the host clock, an assumed error
of 5 ms) with a local destination that holds its first send: of that batch of admitted
attempts (every one durably PUBLISHING) it writes the first half, prints one JSON line
`{"written": [...], "unwritten": [...]}` (attempt ids) and never returns, so the test's
SIGKILL lands with both halves in flight: records written whose outcomes were never
committed, and attempts never written at all. N timers spread over `QUEUES`, all due at
one `deliverAt` 1 s after the worker starts scheduling, so one tick admits up to
`max_admissions_per_tick` of them.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Sequence

from nereus.runtime import compiled

compiled.from_environment()  # NEREUS_PURE_PYTHON=1 runs the source here too

from nereus.adapters.local.destination import LocalDestination  # noqa: E402
from nereus.adapters.local.embedded import Nereus  # noqa: E402
from nereus.runtime.destination import Send  # noqa: E402
from nereus.service.arguments import schedule_record  # noqa: E402

# Several lanes: a lane admits at most its permits (256) at a time, a tick 512 in all.
QUEUES = ("proofs-a", "proofs-b", "proofs-c", "proofs-d")
DELAY_MS = 1_000
WAIT_S = 60.0


class HoldingDestination(LocalDestination):
    """Writes half of its first batch, reports which half, then hangs inside the send."""

    def _submit(self, sends: Sequence[Send], now_ms: int) -> None:
        half = len(sends) // 2
        super()._submit(sends[:half], now_ms)
        said = {
            "written": [s.attempt_id for s in sends[:half]],
            "unwritten": [s.attempt_id for s in sends[half:]],
        }
        print(json.dumps(said), flush=True)
        while True:  # until the test kills the process
            time.sleep(1)


def main(argv: Sequence[str]) -> int:
    data, count = argv[0], int(argv[1])
    destination = HoldingDestination(os.path.join(data, "destination"))
    nereus = Nereus.open(data, destination=destination, assume_clock_error_ms=5)
    nereus.start()
    due_ms = int(time.time() * 1000) + DELAY_MS
    items = [
        schedule_record(QUEUES[i % len(QUEUES)], f"k{i}", f"p{i}".encode(), deliver_at_ms=due_ms)
        for i in range(count)
    ]
    for start in range(0, len(items), 200):
        nereus.runtime.submit(nereus.pin(items[start : start + 200])).result(WAIT_S)
    time.sleep(WAIT_S)  # the held send prints; the test kills this process long before
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
