"""A process firing timers to Pulsar until it is killed (tests/adapters/pulsar/test_pulsar_faults).

    python -m tests.support.pulsar_worker DATA_DIR SERVICE_URL TOPIC COUNT SPREAD_MS

Schedules COUNT timers on the queue `q` (due from now over SPREAD_MS) unless the store
already has them, then runs the shard loop until SIGKILL.
"""

from __future__ import annotations

import sys
import time

from nereus import Nereus
from nereus.adapters.pulsar.config import PulsarTargetConfig
from nereus.adapters.pulsar.destination import PulsarDestination


def main() -> None:
    data, url, topic, count, spread_ms = sys.argv[1:6]
    dest = PulsarDestination(PulsarTargetConfig(service_url=url, topics={"q": topic}))
    n = Nereus.open(data, destination=dest, assume_clock_error_ms=5)
    base = int(time.time() * 1000) + 3_000
    for i in range(int(count)):
        n.schedule(
            "q",
            f"k{i}",
            b"p%d" % i,
            deliver_at_ms=base + i * int(spread_ms) // int(count),
            txn=f"t{i}",
        )
    n.start()
    print(f"scheduled {base}", flush=True)
    while True:
        time.sleep(1)


if __name__ == "__main__":
    main()
