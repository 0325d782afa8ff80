"""A process that owns, or tries to own, a Nereus data directory (tests/storage/test_store_lock.py).

`python -m tests.support.lock_worker MODE DIR ...`, MODE one of:

* `hold DIR N`: `Nereus.open(DIR)`, start, schedule N timers due at once, wait until they
  are delivered, print `{"ready": pid}`, then wait to be killed;
* `open DIR`: try `Nereus.open(DIR)` and print what happened as one JSON line; exit 0 when
  it opened, 3 when it was refused;
* `lock DIR`: hold DIR's lock as a Kafka-mode process or a supervisor does; print
  `{"ready": pid}`, then wait to be killed;
* `consume DIR QUEUE GROUP N`: a consumer of DIR's local destination in a process of its
  own; print the N offsets it read.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Sequence

from nereus.runtime import compiled

compiled.from_environment()  # NEREUS_PURE_PYTHON=1 runs the source here too

from nereus.adapters.local.consumer import LocalConsumer  # noqa: E402
from nereus.adapters.local.destination import LocalDestination  # noqa: E402
from nereus.adapters.local.embedded import Nereus  # noqa: E402
from nereus.service.arguments import schedule_record  # noqa: E402
from nereus.storage.lock import StoreLocked, lock_directory  # noqa: E402

QUEUE = "reminders"
REFUSED_EXIT = 3
WAIT_S = 60.0


def _hold(data: str, timers: int) -> int:
    nereus = Nereus.open(data, assume_clock_error_ms=5)
    nereus.start()
    items = [schedule_record(QUEUE, f"k{i}", b"held", delay_ms=0) for i in range(timers)]
    for start in range(0, len(items), 100):
        nereus.runtime.submit(nereus.pin(items[start : start + 100])).result(WAIT_S)
    destination = nereus.destination
    assert isinstance(destination, LocalDestination)
    deadline = time.monotonic() + WAIT_S
    while destination.end_offset(QUEUE) < timers:
        assert time.monotonic() < deadline, "the held service did not deliver its timers"
        time.sleep(0.05)
    print(json.dumps({"ready": os.getpid()}), flush=True)
    while True:  # until the test kills it: the lock must go with the process
        time.sleep(1)


def _open(data: str) -> int:
    try:
        nereus = Nereus.open(data, assume_clock_error_ms=5)
    except StoreLocked as exc:
        said = {"refused": str(exc), "holder_pid": exc.holder_pid, "path": exc.path}
        print(json.dumps(said), flush=True)
        return REFUSED_EXIT
    nereus.close()
    print(json.dumps({"opened": os.getpid()}), flush=True)
    return 0


def _lock(data: str) -> int:
    os.makedirs(data, exist_ok=True)
    with lock_directory(data):
        print(json.dumps({"ready": os.getpid()}), flush=True)
        while True:
            time.sleep(1)


def _consume(data: str, queue: str, group: str, count: int) -> int:
    destination = LocalDestination(os.path.join(data, "destination"))
    offsets: list[int] = []
    with LocalConsumer(destination, queue, group=group) as consumer:
        for record in consumer.records(limit=count, idle_timeout_s=WAIT_S):
            offsets.append(record.offset)
    destination.close()
    print(json.dumps({"offsets": offsets}), flush=True)
    return 0


def main(argv: Sequence[str]) -> int:
    mode, data, *rest = argv
    if mode == "hold":
        return _hold(data, int(rest[0]))
    if mode == "open":
        return _open(data)
    if mode == "lock":
        return _lock(data)
    if mode == "consume":
        return _consume(data, rest[0], rest[1], int(rest[2]))
    raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
