"""Crash injection: where a simulated process death can happen, and the log seam it uses.

A crash is `SimCrash` raised at an armed point inside a tick; the simulator then throws the
runtime, its destination client and the open store away and reopens the same directory, so
nothing in memory survives. The points, in the order a tick passes them:

* `before_commit`: the tick's batch is abandoned before the write transaction starts;
* `in_commit`: raised inside the LMDB write transaction (from the claims writer the runtime
  passes to the log), so the transaction aborts: appended records, folded rows and claims
  are all lost together;
* `after_commit`: the batch is durable, but no effect was acted on: no reply, no send;
* `send_before_write` / `send_after_write` (in `sim.destination`): inside the destination
  call, before or after the record reached the broker;
* between ticks (in `sim.world`): with acknowledgements still in flight, or idle.

`SimCrash` is a BaseException so that no `except Exception` on the way can swallow it.

`SimLog` is the runtime's `ShardLog` port over the embedded log, with those three seams, and
it records the TRUE time at which each position became durable (and whether the clock was
synchronised then) and the effects the live fold produced, for the end-of-run checks, and
notes a commit whose persistence time is earlier than the clock's reading when it began. Its
`after_commit` callback lets the simulator move the clock in the window between a commit and
the sends it allows.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from nereus.kernel.effects import Effect
from nereus.kernel.records import Appendable, LogEntry
from nereus.runtime.shardlog import EmbeddedLog
from nereus.storage.store import Applied, ShardStore

CRASH_POINTS = (
    "before_commit",
    "in_commit",
    "after_commit",
    "send_before_write",
    "send_after_write",
)


class SimCrash(BaseException):
    def __init__(self, point: str) -> None:
        super().__init__(point)
        self.point = point


class Faults:
    """The crash armed for the current tick, if any: it fires at the first seam it names."""

    def __init__(self, stats: Counter[str]) -> None:
        self.armed: str | None = None
        self.stats = stats

    def hit(self, point: str) -> None:
        if self.armed == point:
            self.armed = None
            self.stats[f"crash_{point}"] += 1
            raise SimCrash(point)


class SimLog(EmbeddedLog):
    def __init__(
        self,
        store: ShardStore,
        faults: Faults,
        *,
        true_ms: Callable[[], int],
        synchronized: Callable[[], bool],
        committed_at: dict[int, int],
        committed_unsynced: set[int],
        live_effects: dict[int, tuple[Effect, ...]],
        reported_ms: Callable[[], int],
        stamp_problems: list[str],
        after_commit: Callable[[list[Applied]], None] | None = None,
    ) -> None:
        super().__init__(store)
        self.reported_ms = reported_ms
        self.stamp_problems = stamp_problems
        self.after_commit = after_commit
        self.faults = faults
        self.true_ms = true_ms
        self.synchronized = synchronized
        self.committed_at = committed_at
        self.committed_unsynced = committed_unsynced
        self.live_effects = live_effects

    def commit(
        self,
        items: Sequence[Appendable],
        now_ms: int,
        also: Callable[[Any], None],
    ) -> tuple[list[LogEntry], list[Applied]]:
        self.faults.hit("before_commit")
        if now_ms < self.reported_ms():
            # The batch would be stamped before its commit began, and before commands that
            # arrived after the stamp's reading (specs/time.md, the seal reading).
            self.stamp_problems.append(
                f"a commit stamped {self.reported_ms() - now_ms} ms before the clock when it began"
            )

        def also_then_maybe_die(txn: Any) -> None:
            also(txn)
            self.faults.hit("in_commit")  # inside the transaction: it aborts

        entries, results = super().commit(items, now_ms, also_then_maybe_die)
        # Durable now. True time stands still during a tick, so this is when it happened.
        for entry, effects in results:
            self.committed_at[entry.position] = self.true_ms()
            if not self.synchronized():
                self.committed_unsynced.add(entry.position)
            self.live_effects[entry.position] = effects
        if self.after_commit is not None:
            self.after_commit(results)
        self.faults.hit("after_commit")
        return entries, results
