"""One seeded simulation of a whole shard: the loop, restarts, the settling phase.

Everything is single-threaded and drawn from one `random.Random(seed)`, so a seed replays
exactly: the runtime's `tick(now)` is called from this loop with a reading of the simulated
clock (its thread is never started), the clock moves between ticks (and inside one only right
after a commit, never in true time: the send takes a reading of its own), and the destination
acknowledges by true time. On some steps the tick's reading is taken before a client's
commands arrive and time passes before the tick runs, as on a busy service: the batch must
be stamped with the later seal reading (`specs/time.md`). The runtime reads no clock of its
own, so nothing it does depends on wall time; its monotonic clock is the simulation's true
time.

A step: maybe disturb the clock; maybe submit a client batch (maybe after the tick's reading);
maybe arm a crash for this tick;
tick (after a commit that admitted attempts the clock may step back, inside its bound, before
the sends); maybe crash between ticks; collect replies; check the kernel invariants and the
sends; advance true time (sometimes exactly to an edge: the interval's earliest end on due
work's actionAt, or its latest or earliest end on a live timer's expireAt). How the clock
moves is `sim.weather`; the checks made at each step are `sim.checks`.

After the steps the run settles: the clock is synchronised with a small bound, the
destination stops failing, gates open and the shard is active, and time runs on until
nothing is pending, so the audit (`sim.audit`) sees every message's end.
"""

from __future__ import annotations

import hashlib
import os
import random
import traceback
from collections import Counter, deque
from collections.abc import Sequence

from nereus.kernel.config import KernelConfig
from nereus.kernel.effects import Effect, EntryOutcome
from nereus.kernel.model import Table
from nereus.kernel.records import (
    Appendable,
    LaneGate,
    ShardState,
    encode_entry,
)
from nereus.kernel.timing import TimingLimits
from nereus.runtime.clock import ClockReading, read_clock
from nereus.runtime.config import RuntimeConfig
from nereus.runtime.errors import RuntimeHalted
from nereus.runtime.intake import CommandFuture
from nereus.runtime.shard import ShardRuntime
from nereus.sim.audit import Observed, audit
from nereus.sim.checks import arrival_problems, step_problems
from nereus.sim.client import Client
from nereus.sim.clock import SimClock
from nereus.sim.crash import CRASH_POINTS, Faults, SimCrash, SimLog
from nereus.sim.destination import Broker, FaultProfile, SimDestination
from nereus.sim.weather import Weather
from nereus.storage.schema import StoreOptions
from nereus.storage.store import ShardStore

T0_MS = 1_780_000_000_000
# Short horizons and a small budget, so expiry, backoff and dead-lettering happen within a
# run of a few hundred steps.
KERNEL = KernelConfig(
    limits=TimingLimits(
        min_delivery_window_ms=1_000,
        max_delay_horizon_ms=20_000,
        max_message_lifetime_ms=40_000,
    ),
    default_expiry_grace_ms=15_000,
    max_attempts=3,
    backoff_base_ms=100,
    backoff_max_ms=1_600,
)
SETTLE_TICKS = 2_000
TRACE_LINES = 80


class SimFailure(AssertionError):
    def __init__(self, seed: int, steps: int, reason: str, trace: Sequence[str] = ()) -> None:
        self.seed = seed
        self.steps = steps
        self.reason = reason
        self.reproduce = f"python -m nereus.sim --seed {seed} --steps {steps}"
        tail = "\n".join(trace)
        super().__init__(
            f"seed {seed}: {reason}\n"
            + (f"last events:\n{tail}\n" if tail else "")
            + f"reproduce: {self.reproduce}"
        )


def _runtime_config(rng: random.Random) -> RuntimeConfig:
    """This seed's runtime limits, drawn after its weather."""
    return RuntimeConfig(
        owner="sim",
        # Small per-tick budgets on some seeds, so a backlog builds up behind them.
        max_admissions_per_tick=rng.choice((2, 8, 512)),
        max_commands_per_tick=rng.choice((1, 4, 4096)),
        lane_scan_limit=rng.choice((4, 256)),
        # Few permits: claims queue behind sends waiting for acks or for the clock.
        max_inflight_claims=rng.choice((1, 3, 4096)),
        max_inflight_per_lane=rng.choice((1, 2, 1024)),
        # Short deadlines expire claims while their sends wait (an admitted one must not).
        claim_deadline_ms=rng.choice((20, 5_000)),
        reconcile_interval_ms=2_000,
        lane_unready_ms=500,
        # Dead-letter copies whose write failed are written again soon, or much later.
        dead_letter_backoff_base_ms=rng.choice((50, 500)),
        dead_letter_backoff_max_ms=4_000,
    )


class World:
    def __init__(
        self,
        seed: int,
        steps: int,
        root: str,
        *,
        lie_ms: int = 0,
        sync: bool = False,
        verbose: bool = False,
        edge_faults: bool = True,
    ) -> None:
        self.seed = seed
        # False: none of the faults added for the send gate, the rules' edges and the lying
        # destination (issue 22) is drawn, nor anything drawn for them, so a seed makes the
        # same draws as the simulator before them: its figures from a run of an earlier
        # commit must come out the same, which shows the runtime behaves as it did.
        self.edge_faults = edge_faults
        self.steps = steps
        self.sync = sync
        self.verbose = verbose
        self.rng = rng = random.Random(seed)
        self.stats: Counter[str] = Counter()
        self.trace_lines: deque[str] = deque(maxlen=TRACE_LINES)
        self.clock = SimClock(T0_MS + rng.randint(0, 10**6), rng, lie_ms=lie_ms)
        # This seed's weather: how often each kind of trouble strikes.
        self.profile = FaultProfile.draw(rng, lies=edge_faults)
        self.crash_rate = rng.choice((0.0, 0.01, 0.03, 0.08))
        clock_rate = rng.choice((0.01, 0.05, 0.15))
        self.command_rate = rng.choice((0.1, 0.3, 0.6))
        self.weather = Weather(
            rng,
            self.clock,
            self.stats,
            self.trace,
            edge_faults=edge_faults,
            clock_rate=clock_rate,
            step_back_rate=rng.choice((0.0, 0.3, 0.8)) if edge_faults else 0.0,
            edge_rate=rng.choice((0.0, 0.15, 0.4)) if edge_faults else 0.0,
        )
        # How often a client's commands arrive after the tick took its reading, and time
        # passes before the batch is sealed (as on a busy service).
        self.late_arrival_rate = rng.choice((0.0, 0.3, 0.8)) if edge_faults else 0.0
        self.runtime_config = _runtime_config(rng)
        self.broker = Broker()
        self.faults = Faults(self.stats)
        self.committed_at: dict[int, int] = {}
        self.committed_unsynced: set[int] = set()
        self.live_effects: dict[int, tuple[Effect, ...]] = {}
        self.replies: dict[tuple[int, int], EntryOutcome] = {}
        self.client = Client(rng, KERNEL, self.stats)
        self.outstanding: list[tuple[list[Appendable], CommandFuture]] = []
        # A submission's reported clock, and the clock's back steps then (`arrival_problems`).
        self.submitted: dict[CommandFuture, tuple[int, int]] = {}
        self.stamp_problems: list[str] = []
        self.path = os.path.join(root, "shard")
        self.step_no = 0
        self._writes_checked = 0
        self._open()

    # Processes ----------------------------------------------------------------------------

    def _open(self) -> None:
        # sync=False by default: the simulated crash is a process death, after which the
        # OS still holds every committed page; power loss is tests/storage/test_storage_crash.py's.
        options = StoreOptions(map_size_bytes=1 << 28, sync=self.sync)
        self.store = ShardStore.open(self.path, shard_id="sim", config=KERNEL, options=options)
        self.destination = SimDestination(
            self.broker,
            self.clock,
            self.rng,
            store=self.store,
            profile=self.profile,
            faults=self.faults,
            stats=self.stats,
            trace=self.trace,
        )
        log = SimLog(
            self.store,
            self.faults,
            true_ms=lambda: self.clock.true_ms,
            synchronized=lambda: self.clock.synchronized,
            committed_at=self.committed_at,
            committed_unsynced=self.committed_unsynced,
            live_effects=self.live_effects,
            reported_ms=self.clock.now_ms,
            stamp_problems=self.stamp_problems,
            after_commit=self.weather.after_commit,
        )
        self.runtime = ShardRuntime(
            self.store, self.destination, self.clock, config=self.runtime_config, shard_log=log
        )

    def _restart(self, point: str) -> None:
        """The process died at `point`: everything in memory is gone (runtime, claims,
        acknowledgements in flight, replies not yet given); the files stay."""
        self.stats["crashes"] += 1
        # Copies owed when the process died: only the store remembers them now.
        self.stats["dlq_owed_at_crash"] += self.store.meta.counters.dead_letters_pending
        self.trace(f"CRASH at {point}")
        self.destination.close()
        self.store.close()
        lost, self.outstanding = self.outstanding, []
        for _items, future in lost:
            self.submitted.pop(future, None)
        try:
            self._open()  # ShardStore.open re-checks the invariants of what it restores
        except Exception as exc:
            raise self.fail(f"the restart after a crash at {point} failed: {exc!r}") from exc
        for items, _future in lost:
            if self.rng.random() < 0.5:  # the client retries the very same request
                self.stats["cmd_client_retry"] += 1
                self._submit(items)

    def _submit(self, items: list[Appendable]) -> None:
        future = self.runtime.submit(items)
        self.submitted[future] = (self.clock.now_ms(), self.clock.back_steps)
        self.outstanding.append((items, future))

    def trace(self, line: str) -> None:
        line = f"[{self.step_no} t={self.clock.true_ms}] {line}"
        self.trace_lines.append(line)
        if self.verbose:
            print(line)

    def fail(self, reason: str) -> SimFailure:
        return SimFailure(self.seed, self.steps, reason, list(self.trace_lines))

    # The loop -----------------------------------------------------------------------------

    def run(self) -> Counter[str]:
        for i in range(self.steps):
            self.step_no = i
            self._step()
        self._settle()
        return self._audit()

    def _step(self) -> None:
        rng = self.rng
        self.weather.disturb()
        reading: ClockReading | None = None
        if rng.random() < self.command_rate:
            if self.late_arrival_rate and rng.random() < self.late_arrival_rate:
                # The tick's reading is taken first; the commands arrive while it gathers.
                reading = read_clock(self.clock)
            batch = self.client.batch(self.clock.now_ms())
            self.trace(f"submit {[type(r).__name__ for r, _ in batch]}")
            self._submit(batch)
            if reading is not None:
                self.stats["commands_after_the_ticks_reading"] += 1
                self.clock.advance(rng.randint(1, 40))
        if rng.random() < self.crash_rate:
            self.faults.armed = rng.choice(CRASH_POINTS)
        if self._tick(reading) and rng.random() < self.crash_rate / 3:
            # After a send, before its outcome is seen, when acknowledgements are in flight.
            point = "between_ticks_" + ("acks_pending" if self.destination.pending() else "idle")
            self.stats[f"crash_{point}"] += 1
            self._restart(point)
        self._collect()
        self._check()
        self.weather.advance(self.store)

    def _tick(self, reading: ClockReading | None = None) -> bool:
        """One runtime tick, with `reading` if one was taken before (else one taken now);
        False if the process crashed in it (and was restarted)."""
        self.stats["ticks"] += 1
        try:
            self.runtime.tick(reading or read_clock(self.clock))
        except SimCrash as crash:
            self._restart(crash.point)
            return False
        except Exception as exc:
            detail = "".join(traceback.format_exception(exc))
            raise self.fail(f"the runtime raised {exc!r}\n{detail}") from exc
        finally:
            self.faults.armed = None  # an armed point the tick never reached is disarmed
        return True

    def _collect(self) -> None:
        """Replies that came back; a reply is a durable fact the audit holds replay to."""
        waiting: list[tuple[list[Appendable], CommandFuture]] = []
        for items, future in self.outstanding:
            if not future.done():
                waiting.append((items, future))
                continue
            submitted = self.submitted.pop(future)
            try:
                outcomes = future.result(0)
            except RuntimeHalted:
                continue  # the process died in that tick: the client heard nothing
            for outcome in outcomes:
                self.replies[(outcome.position, outcome.index)] = outcome
            submitted_ms, back_steps = submitted
            # Judged only while the reported clock has not gone back since the submission (a
            # stepped-back host clock moves every stamp, the rule's premise).
            if self.clock.back_steps == back_steps:
                self.stamp_problems.extend(
                    arrival_problems(items, outcomes, submitted_ms, self.stats)
                )
        self.outstanding = waiting

    def _check(self) -> None:
        problems = step_problems(self.store) + self.broker.problems + self.stamp_problems
        # The descriptor's own deliverAt, at once (the audit restates it from the log).
        for w in self.broker.writes[self._writes_checked :]:
            if not w.dlq and w.true_ms < w.deliver_at_ms:
                problems.append(f"{w.attempt_id} written {w.deliver_at_ms - w.true_ms} ms early")
            if not w.dlq and not w.synchronized:
                problems.append(f"{w.attempt_id} written while the clock was unsynchronised")
        self._writes_checked = len(self.broker.writes)
        if problems:
            raise self.fail("; ".join(problems[:5]))

    # Settling and the audit ---------------------------------------------------------------

    def _settle(self) -> None:
        self.step_no = self.steps
        self.trace("settling: clock synchronised, destination calm")
        self.clock.settle()
        self.profile.calm = True
        opening: list[Appendable] = [
            (LaneGate(t, q, "OPEN", "settle"), None) for t, q in self.client.lanes
        ]
        opening.append((ShardState("ACTIVE_FOR_COMMANDS", "settle"), None))
        self._submit(opening)
        for n in range(SETTLE_TICKS):
            self.step_no = self.steps + n
            if not self._tick():
                raise self.fail("a crash while settling (none is armed)")
            self._collect()
            self._check()
            if self._settled():
                self.stats["settle_ticks"] += n + 1
                return
            self.clock.advance(self.rng.randint(100, 1_500))
        raise self.fail(f"the shard did not settle within {SETTLE_TICKS} ticks")

    def _settled(self) -> bool:
        if self.outstanding or self.destination.pending():
            return False
        c = self.store.meta.counters
        if c.scheduled or c.publishing or c.attempts_publishing or c.dead_letters_pending:
            return False
        with self.store.read() as view:
            if view.first_timeline_key() is not None:
                return False
            # An UNKNOWN attempt the broker holds must be found by a reconcile pass first.
            for key, _ in view.items(Table.OBLIGATIONS):
                if self.broker.evidence(key.decode()) is not None:
                    return False
        return True

    def _audit(self) -> Counter[str]:
        seen = Observed(
            committed_at=self.committed_at,
            committed_unsynced=self.committed_unsynced,
            live_effects=self.live_effects,
            replies=self.replies,
            writes=self.broker.writes,
            send_problems=self.broker.problems,
        )
        result = audit(self.store, seen)
        if result.problems:
            more = f" (+{len(result.problems) - 5} more)" if len(result.problems) > 5 else ""
            raise self.fail("; ".join(result.problems[:5]) + more)
        figures = self.stats + result.figures
        figures["seeds"] = 1
        figures["steps"] = self.steps
        return figures

    def fingerprint(self) -> str:
        """A digest of the whole shard log and every broker write: equal for equal runs."""
        h = hashlib.sha256()
        for entry in self.store.iter_log():
            h.update(encode_entry(entry))
        for w in self.broker.writes:
            h.update(repr(w).encode())
        return h.hexdigest()

    def close(self) -> None:
        self.destination.close()
        self.store.close()
