"""The embedded service under a steady seeded workload: the process the service crash test kills.

Run as `python -m tests.support.service_worker DIR SEED [drain]`. It opens Nereus on DIR (shard
store
in DIR/shard, local destination in DIR/destination) with the host clock and an assumed error
of 2 ms, starts the runtime thread and prints `ready`. Then:

* without `drain`: it sends a steady seeded stream of commands (schedules with delays of
  0 to 800 ms, upserts of live keys, identical retries, cancels), each committed through the
  runtime, and appends every committed command's outcome to DIR/outcomes.jsonl (one JSON
  object per line, written with one `write` and fsynced) until it is killed;
* with `drain`: it sends nothing and waits until no timeline work and no PUBLISHING message
  is left, then closes cleanly, prints `drained` and exits 0.

The local destination's `before_send` hook runs inside every send, before the write. It opens
its own read transaction on the shard store and checks that every attempt being sent is
durably PUBLISHING there, for the message generation and descriptor being sent. A dead-letter
copy is checked against the copy the shard state owes instead. Any violation is written to a marker
file `DIR/violation-*.json` (fsynced) for the test to find; the hook never raises, so the
runtime keeps running and the test sees everything.
"""

from __future__ import annotations

import json
import os
import random
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

from nereus.adapters.clock import SystemClock
from nereus.adapters.local.destination import LocalDestination
from nereus.adapters.local.embedded import Nereus
from nereus.kernel.effects import EntryOutcome
from nereus.kernel.keys import dead_letter_key, str_key
from nereus.kernel.model import Attempt, AttemptStatus, Message, Status, Table
from nereus.kernel.records import Appendable, Cancel
from nereus.runtime.destination import Send
from nereus.service.arguments import schedule_record
from nereus.storage.base import StoreView
from nereus.storage.store import ShardStore

QUEUES = ("alpha", "beta", "gamma")
POOL = tuple(f"pool/{i}" for i in range(40))  # reused across runs: upserts and cancels
CLOCK_ERROR_MS = 2.0
MAX_DELAY_MS = 800
WORKER_DEADLINE_S = 90.0
OUTCOMES = "outcomes.jsonl"
MARKER_PREFIX = "violation-"


class SendChecker:
    """The `before_send` hook: every send must find its attempt durably PUBLISHING."""

    def __init__(self, data_dir: str) -> None:
        self.data_dir = data_dir
        self.store: ShardStore | None = None
        self.checked = 0
        self._markers = 0
        self._lock = threading.Lock()

    def __call__(self, sends: Sequence[Send]) -> None:
        store = self.store
        if store is None:
            self._mark({"problem": "send before the store was attached"})
            return
        with store.read() as view:  # a read transaction of its own, after the commit
            for send in sends:
                problem = send_problem(view, send)
                if problem is not None:
                    self._mark(problem)
                self.checked += 1

    def _mark(self, problem: dict[str, Any]) -> None:
        with self._lock:
            self._markers += 1
            name = f"{MARKER_PREFIX}{os.getpid()}-{self._markers}.json"
        path = os.path.join(self.data_dir, name)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, json.dumps(problem).encode())
            os.fsync(fd)
        finally:
            os.close(fd)


def send_problem(view: StoreView, send: Send) -> dict[str, Any] | None:
    """Why this send must not happen now, judged from a shard store read view; None if the
    attempt is durably PUBLISHING for exactly what is being sent."""
    p = send.prepared
    where = {"attempt_id": send.attempt_id, "message_id": p.message_id, "topic": p.topic}
    message = view.get(Table.MESSAGES, str_key(p.message_id))
    if not isinstance(message, Message):
        return {**where, "problem": "no message row"}
    if p.topic.endswith(".dlq"):
        # A copy is written only while the shard state owes it (its generation was
        # dead-lettered, perhaps since superseded, and the copy is not recorded yet).
        if view.get(Table.DEAD_LETTERS, dead_letter_key(p.message_id, p.generation)) is None:
            return {**where, "problem": f"dead letter not owed ({message.status} message)"}
        return None
    attempt = view.get(Table.ATTEMPTS, str_key(send.attempt_id))
    if not isinstance(attempt, Attempt):
        return {**where, "problem": "attempt not in the shard store at send time"}
    if attempt.status is not AttemptStatus.PUBLISHING:
        return {**where, "problem": f"attempt is {attempt.status} at send time"}
    if (attempt.message_id, attempt.generation) != (p.message_id, p.generation):
        return {**where, "problem": "attempt belongs to another message or generation"}
    if attempt.descriptor_hash != p.descriptor_hash():
        return {**where, "problem": "descriptor differs from the admitted one"}
    if view.get(Table.OBLIGATIONS, str_key(send.attempt_id)) is None:
        return {**where, "problem": "PUBLISHING attempt without an obligation"}
    if message.generation == p.generation and message.status is not Status.PUBLISHING:
        return {**where, "problem": f"message is {message.status} at send time"}
    return None


def open_service(data_dir: str) -> tuple[Nereus, SendChecker]:
    checker = SendChecker(data_dir)
    destination = LocalDestination(os.path.join(data_dir, "destination"), before_send=checker)
    nereus = Nereus.open(
        data_dir,
        destination=destination,
        clock=SystemClock(assumed_error_ms=CLOCK_ERROR_MS),
    )
    checker.store = nereus.store
    return nereus, checker


class OutcomeLog:
    """Append-only JSON Lines, one write and one fsync per committed command."""

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        size = os.fstat(self.fd).st_size
        if size:
            with open(path, "rb") as f:
                f.seek(size - 1)
                if f.read(1) != b"\n":
                    os.write(self.fd, b"\n")  # a predecessor died mid-line: end it

    def write(self, doc: dict[str, Any]) -> None:
        os.write(self.fd, (json.dumps(doc, sort_keys=True) + "\n").encode())
        os.fsync(self.fd)

    def close(self) -> None:
        os.close(self.fd)


def _outcome_doc(op: str, queue: str, key: str, o: EntryOutcome, **extra: Any) -> dict[str, Any]:
    return {
        "op": op,
        "queue": queue,
        "key": key,
        "code": str(o.code),
        "applied": o.applied,
        "message_id": o.message_id,
        "generation": o.generation,
        "version": o.version,
        "txn": o.txn,
        "deliver_at": o.deliver_at_ms,
        "pid": os.getpid(),
        **extra,
    }


def run_workload(nereus: Nereus, data_dir: str, seed: int) -> None:
    rng = random.Random(seed)
    log = OutcomeLog(os.path.join(data_dir, OUTCOMES))
    sent: dict[tuple[str, str], tuple[Appendable, dict[str, Any]]] = {}
    fresh = 0
    deadline = time.monotonic() + WORKER_DEADLINE_S
    while time.monotonic() < deadline:
        roll = rng.random()
        if roll < 0.15 and sent:
            queue, key = rng.choice(sorted(sent))
            record: Appendable = (Cancel("default", queue, key), None)
            outcome = nereus.runtime.execute([record])[0]
            log.write(_outcome_doc("cancel", queue, key, outcome))
        elif roll < 0.22 and sent:
            # An identical retry of an earlier schedule: same txn, same request.
            queue, key = rng.choice(sorted(sent))
            item, meta = sent[(queue, key)]
            outcome = nereus.runtime.execute([item])[0]
            log.write(_outcome_doc("schedule", queue, key, outcome, retry=True, **meta))
        else:
            queue = rng.choice(QUEUES)
            if roll < 0.45:
                key = rng.choice(POOL)  # often an upsert of a live or finished timer
            else:
                fresh += 1
                key = f"s{seed}/{fresh}"
            delay_ms = rng.randint(0, MAX_DELAY_MS)
            tight = rng.random() < 0.2
            payload = f"{key}@{rng.getrandbits(32)}".encode()
            txn = f"{seed}-{rng.getrandbits(48):x}"
            meta = {"delay_ms": delay_ms, "tight": tight, "payload": payload.decode()}
            item = schedule_record(
                queue,
                key,
                payload,
                delay_ms=delay_ms,
                txn=txn,
                partition=key,
                lifetime_ms=delay_ms + 1_000 if tight else None,
            )
            outcome = nereus.runtime.execute([item])[0]
            log.write(_outcome_doc("schedule", queue, key, outcome, retry=False, **meta))
            sent[(queue, key)] = (item, meta)
        time.sleep(rng.uniform(0, 0.006))
    log.close()


def drain(nereus: Nereus) -> None:
    deadline = time.monotonic() + WORKER_DEADLINE_S
    quiet_since: float | None = None
    while time.monotonic() < deadline:
        with nereus.store.read() as view:
            idle = view.first_timeline_key() is None
        idle = idle and nereus.store.meta.counters.publishing == 0
        if idle:
            quiet_since = quiet_since or time.monotonic()
            if time.monotonic() - quiet_since > 0.3:
                return
        else:
            quiet_since = None
        if nereus.runtime.halted is not None:
            raise RuntimeError(f"runtime halted: {nereus.runtime.halted!r}")
        time.sleep(0.02)
    raise TimeoutError("work left after the drain deadline")


def main(argv: list[str]) -> int:
    data_dir, seed = argv[0], int(argv[1])
    draining = len(argv) > 2 and argv[2] == "drain"
    os.makedirs(data_dir, exist_ok=True)
    nereus, checker = open_service(data_dir)
    nereus.start()
    print("ready", flush=True)
    try:
        if draining:
            drain(nereus)
        else:
            run_workload(nereus, data_dir, seed)
        if nereus.runtime.halted is not None:
            raise RuntimeError(f"runtime halted: {nereus.runtime.halted!r}")
    finally:
        nereus.close()
    print(f"drained checked={checker.checked}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
