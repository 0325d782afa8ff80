"""A shard runtime driven tick by tick on a real LMDB store, for deterministic runtime tests.

`Harness` opens the shard store and the local destination under a directory and builds a
`ShardRuntime` with a `SimulatedClock`; no thread runs, the test calls `tick()` (one
`ShardRuntime.run_once` each: a reading of the clock, then a tick). Every send passes the
local destination's `before_send` hook, which records it (the order of service) and checks,
in a read transaction of its own on the shard store, that the attempt is durably PUBLISHING
(`tests.support.service_worker.send_problem`). `crash()` abandons the runtime the way a killed
process would: nothing more is committed, the in-memory results are lost, and the files are
closed; `reopen()` starts a new runtime on the same files. `run_until` ticks any runtime on
the test's thread, against real time, until a condition holds (the Kafka tests' owners).
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from nereus.adapters.clock import SimulatedClock
from nereus.adapters.local.destination import LocalDestination, LocalRecord
from nereus.kernel.effects import EntryOutcome
from nereus.kernel.keys import attempt_prefix, message_id, str_key
from nereus.kernel.model import Attempt, Message, Table
from nereus.kernel.records import Appendable, LogEntry
from nereus.runtime.config import RuntimeConfig
from nereus.runtime.destination import Send
from nereus.runtime.shard import ShardRuntime
from nereus.runtime.shardlog import ShardLog
from nereus.service.arguments import schedule_record
from nereus.storage.schema import StoreOptions
from nereus.storage.store import ShardStore
from tests.support.service_worker import send_problem

T0_MS = 1_780_000_000_000
TENANT = "default"
# A tick takes every queued command (up to the per-tick bound): far fewer ticks than this
# commit any batch a test submits, so a runtime that stops committing fails instead of
# spinning.
MAX_COMMAND_TICKS = 1_000


class CrashBeforeWrite(SystemExit):
    """Raised inside the destination's submit, before the write: the process 'dies' after
    the Admission is durable and before anything reaches the destination."""


class Harness:
    def __init__(
        self,
        root: Path,
        clock: SimulatedClock,
        *,
        config: RuntimeConfig | None = None,
        store_options: StoreOptions | None = None,
        destination_cls: type[LocalDestination] = LocalDestination,
        shard_log: Callable[[ShardStore], ShardLog] | None = None,
    ) -> None:
        self.root = root
        self.clock = clock
        self.config = config
        self.store_options = store_options
        self.destination_cls = destination_cls
        self.shard_log = shard_log
        self.sends: list[Send] = []
        self.problems: list[dict[str, Any]] = []
        self.crash_before_write = False
        self._open()

    def _open(self) -> None:
        self.store = ShardStore.open(str(self.root / "shard"), options=self.store_options)
        self.destination = self.destination_cls(
            str(self.root / "destination"), before_send=self._before_send
        )
        log = self.shard_log(self.store) if self.shard_log is not None else None
        self.runtime = ShardRuntime(
            self.store, self.destination, self.clock, config=self.config, shard_log=log
        )

    def _before_send(self, sends: Sequence[Send]) -> None:
        with self.store.read() as view:
            for send in sends:
                problem = send_problem(view, send)
                if problem is not None:
                    self.problems.append(problem)
        self.sends.extend(sends)
        if self.crash_before_write:
            raise CrashBeforeWrite("killed before the destination write")

    # Driving --------------------------------------------------------------------------------

    def tick(self, times: int = 1) -> None:
        for _ in range(times):
            self.runtime.run_once()

    def run(self, items: Sequence[Appendable]) -> list[EntryOutcome]:
        """Commit commands on this thread, as `Nereus` does when no loop runs."""
        future = self.runtime.submit(items)
        for _ in range(MAX_COMMAND_TICKS):
            if future.done():
                return future.result(0)
            self.runtime.run_once()
        raise AssertionError(f"commands not committed within {MAX_COMMAND_TICKS} ticks")

    def schedule(self, key: str, payload: bytes = b"payload", **options: Any) -> EntryOutcome:
        queue = options.pop("queue", "q")
        return self.run([schedule_record(queue, key, payload, **options)])[0]

    def crash(self) -> None:
        """Stop like a killed process: commit nothing more, drop what is in memory."""
        self.destination.close()
        self.store.close()

    def reopen(self) -> None:
        self._open()

    def close(self) -> None:
        self.runtime.stop()
        self.destination.close()
        self.store.close()

    # Reading --------------------------------------------------------------------------------

    def message(self, key: str, queue: str = "q", tenant: str = TENANT) -> Message:
        with self.store.read() as view:
            m = view.get(Table.MESSAGES, str_key(message_id(tenant, queue, key)))
        assert isinstance(m, Message), f"no message {tenant}/{queue}/{key}"
        return m

    def attempts(self, mid: str, generation: int | None = None) -> list[Attempt]:
        prefix = (attempt_prefix(mid, generation) if generation is not None else mid).encode()
        with self.store.read() as view:
            rows = list(view.range(Table.ATTEMPTS, prefix, prefix + b"\xff"))
        out = [a for _, a in rows if isinstance(a, Attempt)]
        return sorted(out, key=lambda a: a.admitted_position)

    def obligations(self) -> set[str]:
        with self.store.read() as view:
            return {k.decode() for k, _ in view.items(Table.OBLIGATIONS)}

    def log(self) -> list[LogEntry]:
        return list(self.store.iter_log())

    def delivered(self, queue: str = "q") -> list[LocalRecord]:
        return list(self.destination.iter_all(queue))


def run_until(runtime: ShardRuntime, done: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Tick `runtime` every 10 ms until `done()`; fail naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, f"no {what} within {timeout_s} s"
        runtime.run_once()
        time.sleep(0.01)


def digest(payload: bytes) -> str:
    return hashlib.sha256(payload).hexdigest()


def env_int(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    return int(raw) if raw else default
