"""The shard runtime: one thread that owns a shard store and turns due timers into sends.

Theory of operation: each `tick()` gathers everything that must enter the shard log —
client commands from the intake queue, outcomes reported by the destination, recovery and
reconciliation results, and the Admissions, claim results and expiries proposed by due
discovery — and commits them with ONE group commit (append + fold + claims, one sync). Only
then does it act on the effects: replies complete the callers' futures, revocations drop
claims, and each Publish becomes a send, handed to the destination only while its claim is
still ours and the trusted clock proves its action time has come. Results come back through
the next tick. A broken invariant raises out of `tick()` and halts the runtime: restarting
replays the log rather than guessing.

Dead-letter copies are owed in the shard state (the dead_letters table), not in memory: the
fold that dead-letters a generation records the copy as owed, a `DeadLetter` effect (or, at
recovery, the table itself) has the runtime write it to `<topic>.dlq`, and a PUBLISHED result
goes back into the log as DEAD_LETTER_WRITTEN_V1, which closes it. A failed or UNKNOWN write
is retried after a backoff; after an UNKNOWN one, and after a restart or a takeover, the
runtime first looks for the copy at the destination under its attempt id. Copies are
at-least-once: a write whose fate was unknown and that the lookup misses is written again,
and both copies carry the same attempt id.

Due discovery walks the per-lane timeline index in two-level deficit-round-robin order
(`runtime.drr`), so a lane with a large backlog cannot starve the others. When nothing due is
left waiting, rows due within `claim_ahead_ms` are claimed (and their publish prepared)
ahead; their Admission is proposed by the first tick whose trusted clock reading proves the
action time, exactly as for work found due, and the send still waits for that proof too.
Admissions go first: a tick with fresh Admissions leaves queued commands to the very next
tick, and the loop holds commands briefly when claimed work is about to come due, so the
Admission commit and the send are not queued behind the fold of a batch of commands. The
loop sleeps until the next such moment and watches the clock for the last millisecond.

The "append + fold" step goes through a `runtime.shardlog.ShardLog`: the embedded LMDB log
by default, or a Kafka partition (`adapters.kafka_log`), where the tick's records are folded
when they come back from the broker in a later tick. Recovery waits until the log is caught
up, discovery until every record this owner wrote has been folded, and a send until the log
says this owner still owns the shard. A log that lost the shard raises `ShardLost`: the
runtime stops without halting and drops its claims.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from kernel.effects import (
    DeadLetter,
    Effect,
    EntryOutcome,
    Publish,
    RevokeClaim,
    TimelinePut,
)
from kernel.keys import (
    attempt_prefix,
    dead_letter_key,
    lane_id,
    parse_timeline_key,
    str_key,
    timeline_key,
)
from kernel.model import (
    Attempt,
    AttemptStatus,
    DeadLetterPending,
    Lane,
    Message,
    Obligation,
    Status,
    Table,
    TimelineWork,
)
from kernel.records import (
    Capacity,
    ClaimResult,
    DeadLetterWritten,
    Expire,
    LogEntry,
    NotPublished,
    PublishAdmission,
    Published,
    PublishOutcome,
    Record,
    Unknown,
)
from kernel.timing import Decision, TrustedInterval, decide
from runtime.claims import Claim, ClaimTable
from runtime.clock import ClockSource
from runtime.config import RuntimeConfig
from runtime.destination import (
    DLQ_SUFFIX,
    Destination,
    Lookup,
    PreparedPublish,
    Send,
    SendResult,
    dead_letter_attempt_id,
    is_dead_letter_attempt,
)
from runtime.drr import DeficitRoundRobin
from runtime.errors import Overloaded, RuntimeHalted
from runtime.log import Logger, NullLogger
from runtime.metrics import LabelKey, Metrics
from runtime.prepare import PrepareFailure, dead_letter_message, prepare, prepare_dead_letter
from runtime.settle import Settled, Settler, Want
from runtime.shardlog import EmbeddedLog, ShardLog, ShardLost
from storage.base import StoreView
from storage.store import Appendable, ShardStore

BACKLOG_COUNT_LIMIT = 1_000_000


class CommandFuture:
    """Completes with one EntryOutcome per submitted record, in order, after the batch is
    durably committed."""

    def __init__(self, count: int) -> None:
        self.count = count
        self._done = threading.Event()
        self._outcomes: list[EntryOutcome] = []
        self._error: BaseException | None = None
        # Callbacks and the done flag change under one lock, so a callback added while the
        # runtime completes the future runs exactly once.
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[CommandFuture], None]] = []

    def _set(self, outcomes: list[EntryOutcome]) -> None:
        self._outcomes = outcomes
        self._finish()

    def _fail(self, error: BaseException) -> None:
        self._error = error
        self._finish()

    def _finish(self) -> None:
        with self._lock:
            self._done.set()
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback(self)

    def add_done_callback(self, callback: Callable[[CommandFuture], None]) -> None:
        """Call `callback(self)` once the future is done: on the thread that completes it
        (the runtime's loop, so it must be quick and must not raise), or at once if done.
        An event loop waits on a commit this way without a thread of its own."""
        with self._lock:
            if not self._done.is_set():
                self._callbacks.append(callback)
                return
        callback(self)

    def done(self) -> bool:
        return self._done.is_set()

    def result(self, timeout_s: float | None = None) -> list[EntryOutcome]:
        if not self._done.wait(timeout_s):
            raise TimeoutError("the command was not committed in time")
        if self._error is not None:
            raise RuntimeHalted(str(self._error)) from self._error
        return self._outcomes


@dataclass
class _PendingSend:
    claim: Claim
    publish: Publish


@dataclass
class _DeadLetterCopy:
    """A copy this runtime is writing. `waiting`: to be written at `due_ms` (runtime clock),
    after looking for it at the destination first if `look_first`; `looking`: that look is
    in an evidence search; `sending`: handed to the destination; `recorded`:
    DEAD_LETTER_WRITTEN_V1 is on its way into the log."""

    message_id: str
    generation: int
    state: Literal["waiting", "looking", "sending", "recorded"] = "waiting"
    due_ms: int = 0
    failures: int = 0
    look_first: bool = False


@dataclass
class _Tick:
    interval: TrustedInterval
    now_ms: int
    items: list[Appendable] = field(default_factory=list)
    waiters: list[tuple[CommandFuture, int]] = field(default_factory=list)
    # Messages something was proposed for this tick (claims, expiries, claim results): a
    # lane visited twice in one tick must not propose the same thing twice.
    proposed: set[str] = field(default_factory=set)
    # Per lane, the last timeline key examined this tick: a second visit continues there.
    lane_cursor: dict[tuple[str, str], bytes] = field(default_factory=dict)
    lane_scanned: dict[tuple[str, str], int] = field(default_factory=dict)
    # Lanes whose due work discovery went through to the first row not yet due.
    lane_future: set[tuple[str, str]] = field(default_factory=set)
    admissions: int = 0  # Admissions proposed this tick
    oldest_action_ms: int | None = None  # the earliest action time among them
    discovered: bool = False  # due discovery ran
    # The earliest trusted-clock reading (interval.earliest_ms) at which discovery has
    # something new to do: claim a row ahead, or take a row that becomes due.
    next_ms: int | None = None
    sent: bool = False  # something was handed to the destination
    # Lanes to claim ahead on (`_discover_ahead`), in order.
    ahead_lanes: list[tuple[str, str]] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)

    def admitted(self, action_at_ms: int) -> None:
        self.admissions += 1
        if self.oldest_action_ms is None or action_at_ms < self.oldest_action_ms:
            self.oldest_action_ms = action_at_ms

    def note_next(self, at_ms: int) -> None:
        if self.next_ms is None or at_ms < self.next_ms:
            self.next_ms = at_ms


@dataclass
class _Tally:
    """What one commit's entries add to the metrics, written in one update per series."""

    counts: dict[tuple[str, LabelKey], int] = field(default_factory=dict)
    fire_lags_s: list[float] = field(default_factory=list)

    def count(self, name: str, *labels: tuple[str, str]) -> None:
        series = (name, labels)
        self.counts[series] = self.counts.get(series, 0) + 1

    def write(self, metrics: Metrics) -> None:
        for (name, labels), count in self.counts.items():
            metrics.inc(name, count, dict(labels))
        if self.fire_lags_s:
            metrics.observe_many("nereus_fire_lag_seconds", self.fire_lags_s)


class ShardRuntime:
    def __init__(
        self,
        store: ShardStore,
        destination: Destination,
        clock: ClockSource,
        *,
        config: RuntimeConfig | None = None,
        metrics: Metrics | None = None,
        logger: Logger | None = None,
        shard_log: ShardLog | None = None,
    ) -> None:
        self.store = store
        self.shard_log: ShardLog = shard_log or EmbeddedLog(store)
        self.destination = destination
        self.clock = clock
        self.config = config or RuntimeConfig()
        self.metrics = metrics or Metrics()
        self.log = logger or NullLogger()
        self.claims = ClaimTable(self.config, store.header.store_id, fencing_revision=1)
        with store.env.env.begin() as txn:
            stale = self.claims.load(txn, store.env.claims, store.path)
        if stale:
            self.log.info("claims_dropped_on_start", count=stale)
        self.drr = DeficitRoundRobin(self.config.tenant_quantum, self.config.lane_quantum)
        self._intake: deque[tuple[list[Appendable], CommandFuture]] = deque()
        self._intake_lock = threading.Lock()
        self._queued = 0
        self._wake = threading.Event()
        destination.open(store.header.store_id)
        self.settler = Settler(
            destination,
            self._wake.set,
            retry_ms=self.config.evidence_retry_ms,
            retry_max_ms=self.config.evidence_retry_max_ms,
        )
        self._stop = threading.Event()
        self._loop_thread: threading.Thread | None = None
        self._pending_sends: list[_PendingSend] = []
        self._deferred: list[Appendable] = []
        # Dead-letter copies being written, by their attempt id; the owed ones are in the
        # store's dead_letters table, so a restart loses nothing held here.
        self._dead_letters: dict[str, _DeadLetterCopy] = {}
        self._lane_unready_until: dict[tuple[str, str], int] = {}
        self._recovered = False
        self._last_reconcile_ms = 0
        self._last_backlog_ms = 0
        # Recovery's open attempts not yet settled, and when recovery started (tick time).
        self._recovering: set[str] = set()
        self._recovery_started_ms = 0
        self._recovery_counts: dict[str, int] = {}
        # UNKNOWN attempts a complete search did not find, with the tick time it started
        # at: an uncertain retry is claimed only after such a look (`_retry_checked`).
        self._looked: dict[str, int] = {}
        self._admitted_claims: set[str] = set()
        # Claims made ahead of their action time, by message id: their Admission is
        # proposed by the first tick whose clock reading proves the action time.
        self._ahead: dict[str, Claim] = {}
        # The last tick left commands queued for Admissions: the next one takes them.
        self._owe_commands = False
        # How long ticks that commit commands take (ms, moving average).
        self._command_tick_ms = 0.0
        self._holding_since: float | None = None  # time.monotonic() when holding began
        # The earliest action time of timeline rows written by the last commit.
        self._put_action_ms: int | None = None
        # The trusted-clock reading the loop waits for (set by tick, used by run).
        self._wake_at_ms: int | None = None
        self._tick_lock = threading.Lock()
        self.halted: BaseException | None = None
        self.lost: ShardLost | None = None
        _describe_metrics(self.metrics)

    # Intake -------------------------------------------------------------------------------

    def submit(self, items: Sequence[Appendable]) -> CommandFuture:
        """Queue records to be appended as one unit; the future completes after commit."""
        if self.halted is not None:
            raise RuntimeHalted(f"runtime halted: {self.halted}")
        if not self.shard_log.accepts_commands:
            raise RuntimeError("this shard log takes client commands from its topic only")
        future = CommandFuture(len(items))
        with self._intake_lock:
            if self._queued + len(items) > self.config.max_queued_commands:
                raise Overloaded("intake queue full")
            self._intake.append((list(items), future))
            self._queued += len(items)
        self._wake.set()
        return future

    def execute(self, items: Sequence[Appendable], timeout_s: float = 30.0) -> list[EntryOutcome]:
        return self.submit(items).result(timeout_s)

    # The loop -----------------------------------------------------------------------------

    def start(self) -> None:
        if self._loop_thread is not None:
            return
        self._stop.clear()
        self._loop_thread = threading.Thread(target=self.run, name="nereus-shard", daemon=True)
        self._loop_thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._loop_thread is not None:
            self._loop_thread.join(timeout_s)
            self._loop_thread = None

    def run(self) -> None:
        while not self._stop.is_set():
            try:
                sleep_s = self.tick()
            except ShardLost as exc:
                self._lose(exc)
                return
            except BaseException as exc:
                self._halt(exc)
                return
            if sleep_s > 0:
                self._sleep(sleep_s)
            self._wake.clear()

    def _sleep(self, sleep_s: float) -> None:
        """Sleep up to `sleep_s`; when the next round waits for a clock reading, sleep to
        just before it and then watch the clock, so the round starts as soon as the trusted
        clock proves it (the tick estimates the wait in whole milliseconds)."""
        target = self._wake_at_ms
        if target is None or sleep_s > 0.02:
            self.shard_log.wait(sleep_s, self._wake)
            return
        self.shard_log.wait(max(sleep_s - 0.0015, 0.0), self._wake)
        deadline = time.monotonic() + 0.003
        while (
            not self._wake.is_set()
            and not self._stop.is_set()
            and self.clock.interval().earliest_ms < target
            and time.monotonic() < deadline
        ):
            self._wake.wait(0.0002)

    def _halt(self, exc: BaseException) -> None:
        self.halted = exc
        self.log.error("runtime_halted", error=repr(exc))
        with self._intake_lock:
            pending = list(self._intake)
            self._intake.clear()
        for _items, future in pending:
            future._fail(exc)

    def _lose(self, exc: ShardLost) -> None:
        self.lost = exc
        self.log.warning("shard_lost", detail=str(exc))
        self.release()

    def release(self) -> None:
        """Let go of the shard's work after the loop stopped (revocation, a lost shard):
        claims are dropped, nothing more is sent, queued commands fail. The open attempts
        stay in the log for whoever owns the shard next."""
        with self._intake_lock:
            pending = list(self._intake)
            self._intake.clear()
            self._queued = 0
        for _items, future in pending:
            future._fail(ShardLost("the shard was let go"))
        for claim in self.claims:
            self.claims.drop(claim.message_id)
        self._pending_sends = []
        self._deferred = []
        self._dead_letters = {}
        self._ahead = {}
        self.settler.close()

    def tick(self) -> float:
        """One round: gather, commit once, act on effects, send. Returns how long the
        caller may sleep before the next round. Serialised: the library calls it from
        callers' threads when no runtime thread runs."""
        with self._tick_lock:
            self.shard_log.open()
            tick = _Tick(interval=self.clock.interval(), now_ms=self.clock.now_ms())
            try:
                return self._tick(tick)
            except BaseException as exc:
                # Commands taken into this round must hear about the failure, not time out.
                for future, _start in tick.waiters:
                    if not future.done():
                        future._fail(exc)
                raise

    def _tick(self, tick: _Tick) -> float:
        """Admissions go first (config `command_hold_max_ms`): queued commands wait one
        tick when this one has Admissions to commit, so the Admission commit, and the sends
        after it, are not held up by the fold of the commands; the next tick takes them."""
        log = self.shard_log
        self._put_action_ms = None
        self._expire_claims(tick)
        if self._recovered and not log.settled() and log.pending():
            # A log that folds records after writing them (Kafka): fold what came back
            # first, so this tick's discovery already sees this owner's last proposals.
            self._commit(_Tick(interval=tick.interval, now_ms=tick.now_ms))
        if not self._recovered and log.caught_up():
            self._recover(tick)
            self._recovered = True
        settled = self._recovered and log.settled()
        proposals: list[Appendable] = []
        if settled and self.store.meta.shard_status == "ACTIVE_FOR_COMMANDS":
            proposals = self._discover(tick)
            if tick.admissions == 0:
                # Not in a tick with Admissions: the claims would be written by its commit.
                self._discover_ahead(tick)
            elif tick.ahead_lanes:
                tick.note_next(tick.interval.earliest_ms)  # claim ahead in the next tick
        hold_max_ms = self.config.command_hold_max_ms
        prioritise = hold_max_ms > 0 and not self._owe_commands
        # Work already later than the hold would make it gains nothing from going first,
        # and a second commit per round costs a loop that is falling behind its capacity.
        fresh = (
            tick.oldest_action_ms is not None
            and tick.interval.earliest_ms - tick.oldest_action_ms <= hold_max_ms
        )
        admissions_first = prioritise and fresh and bool(self._intake)
        holding = prioritise and not admissions_first and self._hold_commands(tick)
        self._owe_commands = admissions_first
        with_commands = not (admissions_first or holding)
        if with_commands:
            self._take_commands(tick)
        took_commands = bool(tick.waiters)
        if took_commands:
            self._holding_since = None
        tick.items.extend(self._collect_results(tick))
        if self._recovered:
            tick.items.extend(self._settle(tick))
        tick.items.extend(self._deferred)
        self._deferred = []
        if (
            with_commands
            and settled
            and tick.now_ms - self._last_reconcile_ms >= self.config.reconcile_interval_ms
        ):
            self._last_reconcile_ms = tick.now_ms
            self._reconcile()
        tick.items.extend(proposals)
        # Sends waiting for proof that this owner still owns the shard need a write.
        waiting = bool(self._pending_sends) or self._dead_letters_due(tick.now_ms)
        needs_proof = waiting and not log.send_allowed()
        if tick.items or log.pending() or needs_proof:
            self._commit(tick)
        self._send_ready(tick)
        self._write_dead_letters(tick)
        self._update_gauges(tick)
        if took_commands:
            took_ms = (time.monotonic() - tick.started) * 1000
            self._command_tick_ms = 0.8 * self._command_tick_ms + 0.2 * took_ms
        return self._next_sleep_s(tick, holding)

    def _hold_commands(self, tick: _Tick) -> bool:
        """Whether to leave queued commands for a moment: work claimed ahead comes due
        before a tick committing them would be done. Only the runtime's own loop holds
        commands (a caller driving `tick()` gets them committed by every tick that has no
        Admissions), and never for longer than `command_hold_max_ms` of its time."""
        if (
            not self._intake
            or not self._ahead
            or threading.current_thread() is not self._loop_thread
        ):
            self._holding_since = None
            return False
        window_ms = min(self._command_tick_ms + 1.0, float(self.config.command_hold_max_ms))
        due_ms = min(claim.action_at_ms for claim in self._ahead.values())
        if due_ms - self._earliest_now(tick) > window_ms:
            self._holding_since = None
            return False
        if self._holding_since is None:
            self._holding_since = tick.started
        return (tick.started - self._holding_since) * 1000 < self.config.command_hold_max_ms

    def _earliest_now(self, tick: _Tick) -> float:
        """The tick's reading of the trusted clock's earliest end, moved on by the time the
        tick has taken so far (an estimate for sleeping, never a time decision)."""
        return tick.interval.earliest_ms + (time.monotonic() - tick.started) * 1000

    def _expire_claims(self, tick: _Tick) -> None:
        """A claim whose Admission has not come back by its deadline is revoked: its work
        returns to the timeline for a later claim. A claim whose Admission won is the
        attempt's send gate and is never revoked by time."""
        for claim in self.claims:
            if claim.deadline_ms < tick.now_ms and claim.claim_id not in self._admitted_claims:
                self.claims.drop(claim.message_id, claim.claim_id)
                self.log.info("claim_deadline_passed", claim_id=claim.claim_id)
        live = {claim.claim_id for claim in self.claims}
        self._admitted_claims &= live

    def _take_commands(self, tick: _Tick) -> None:
        with self._intake_lock:
            while self._intake and len(tick.items) < self.config.max_commands_per_tick:
                items, future = self._intake.popleft()
                self._queued -= len(items)
                tick.waiters.append((future, len(tick.items)))
                tick.items.extend(items)

    def _commit(self, tick: _Tick) -> None:
        env = self.store.env
        entries, results = self.shard_log.commit(
            tick.items, tick.now_ms, lambda txn: self.claims.flush(txn, env.claims)
        )
        outcomes: dict[int, EntryOutcome] = {}
        tally = _Tally()
        for entry, effects in results:
            outcome = effects[0]
            assert isinstance(outcome, EntryOutcome)
            outcomes[entry.position] = outcome
            self._observe(entry, outcome, tally)
            for effect in effects[1:]:
                self._act(effect, tick)
        tally.write(self.metrics)
        for future, start in tick.waiters:
            future._set([outcomes[e.position] for e in entries[start : start + future.count]])

    def _observe(self, entry: LogEntry, outcome: EntryOutcome, tally: _Tally) -> None:
        tally.count("nereus_entries_total", ("code", outcome.code), ("type", outcome.record_type))
        if outcome.record_type == "PUBLISH_OUTCOME_V1" and outcome.applied:
            claim = self.claims.get(outcome.message_id or "")
            if claim is not None and claim.attempt_id == outcome.attempt_id:
                self.claims.drop(claim.message_id, claim.claim_id)
            record = entry.record
            assert isinstance(record, PublishOutcome)
            result = record.result
            tally.count("nereus_outcomes_total", ("class", str(type(result).__struct_config__.tag)))
            if (
                isinstance(result, Published)
                and outcome.deliver_at_ms is not None
                and self._recovered  # a former owner's deliveries were observed there
            ):
                lag_ms = result.evidence.timestamp_ms - outcome.deliver_at_ms
                tally.fire_lags_s.append(max(lag_ms, 0) / 1000)
                if lag_ms < 0:
                    tally.count("nereus_early_deliveries_total")
                    self.log.error("early_delivery", attempt_id=outcome.attempt_id, lag_ms=lag_ms)
            if isinstance(result, NotPublished) and result.disposition == "lane_unavailable":
                msg = self._message(outcome.message_id or "")
                if msg is not None:
                    until = self.clock.now_ms() + self.config.lane_unready_ms
                    self._lane_unready_until[(msg.tenant, msg.queue)] = until
        elif outcome.record_type == "PUBLISH_ADMISSION_V1":
            tally.count(
                "nereus_admissions_total", ("result", "won" if outcome.applied else "stale")
            )
        elif isinstance(entry.record, DeadLetterWritten):
            # Folded: the copy is no longer owed (or never was); stop writing it.
            record = entry.record
            self._dead_letters.pop(
                dead_letter_attempt_id(record.message_id, record.generation), None
            )

    def _act(self, effect: Effect, tick: _Tick) -> None:
        match effect:
            case TimelinePut() as put:
                if self._put_action_ms is None or put.action_at_ms < self._put_action_ms:
                    self._put_action_ms = put.action_at_ms
            case Publish() as publish:
                if not self._issued_here(publish.claim_id):
                    # Another owner's Admission, folded while catching up on the log: its
                    # send gate was that owner's. Recovery resolves it by evidence.
                    return
                claim = self.claims.get(publish.message_id)
                if (
                    claim is None
                    or claim.claim_id != publish.claim_id
                    or claim.attempt_id != publish.attempt_id
                ):
                    # We never called the producer for this attempt: that is a fact.
                    self._deferred.append(
                        (
                            PublishOutcome(
                                publish.attempt_id,
                                publish.message_id,
                                publish.generation,
                                NotPublished("retriable", "send_gate_closed"),
                            ),
                            None,
                        )
                    )
                    return
                assert claim.descriptor_hash == publish.descriptor_hash
                self._admitted_claims.add(claim.claim_id)
                self._pending_sends.append(_PendingSend(claim, publish))
            case RevokeClaim() as revoke:
                claim = self.claims.get(revoke.message_id)
                if claim is not None and claim.generation == revoke.generation:
                    self.claims.drop(revoke.message_id, revoke.claim_id)
            case DeadLetter() as dead:
                # Before recovery this is history: recovery takes every copy still owed
                # from the dead_letters table.
                if self._recovered:
                    self._owe_copy(dead.message_id, dead.generation, look_first=False)
            case _:
                pass

    def _issued_here(self, claim_id: str) -> bool:
        """Whether this runtime made the claim. An embedded log has one writer, this store,
        so every Admission in it is ours; a Kafka shard owner names its claims with the
        tenure's namespace."""
        namespace = self.config.claim_namespace
        return not namespace or claim_id.startswith(f"{self.config.owner}:{namespace}-")

    def _send_ready(self, tick: _Tick) -> None:
        """Hand admitted attempts to the destination once the clock proves their action time
        has come. An attempt admitted under one clock reading waits here if a later reading
        is less certain: late, never early."""
        interval = self.clock.interval()
        ready: list[Send] = []
        waiting: list[_PendingSend] = []
        for pending in self._pending_sends:
            if interval.earliest_ms >= pending.publish.action_at_ms:
                ready.append(Send(pending.publish.attempt_id, pending.claim.prepared))
            else:
                waiting.append(pending)
        if ready and not self.shard_log.send_allowed():
            return  # kept waiting until the log proves this owner still owns the shard
        self._pending_sends = waiting
        if ready:
            tick.sent = True
            self.destination.submit(ready, self.clock.now_ms())

    def _collect_results(self, tick: _Tick) -> list[Appendable]:
        items: list[Appendable] = []
        for res in self.destination.poll(0):
            if is_dead_letter_attempt(res.attempt_id):
                items.extend(self._dead_letter_result(res, tick))
                continue
            items.append(
                (PublishOutcome(res.attempt_id, res.message_id, res.generation, res.result), None)
            )
        return items

    # Due discovery and claims -------------------------------------------------------------

    def _discover(self, tick: _Tick) -> list[Appendable]:
        """Proposals for due work: the Admissions of work claimed ahead whose action time
        the clock now proves, then due rows in deficit-round-robin order. When no due work
        is left waiting, notes the lanes on which `_discover_ahead` may claim rows due
        within `claim_ahead_ms`."""
        proposals: list[Appendable] = []
        earliest = tick.interval.earliest_ms
        if earliest <= -(2**61):
            return proposals  # no trusted time: nothing is due, nothing expires
        tick.discovered = True
        ahead_ms = self.config.claim_ahead_ms
        with self.store.read() as view:
            budget = self.config.max_admissions_per_tick - self._admit_ahead(view, tick, proposals)
            due: list[tuple[str, str]] = []
            soon: list[tuple[str, str]] = []
            for tenant, queue, head in view.lanes():
                action_at_ms = parse_timeline_key(head)[0]
                if action_at_ms <= earliest:
                    due.append((tenant, queue))
                elif action_at_ms <= earliest + ahead_ms:
                    soon.append((tenant, queue))
                else:
                    tick.note_next(action_at_ms - ahead_ms)
            self.drr.sync(due)
            served = 0
            if budget > 0:
                served = self.drr.run(
                    budget, lambda lane, n: self._take(view, lane, n, tick, proposals)
                )
            if served >= budget:
                tick.note_next(earliest)  # more due work may be waiting: come back at once
            else:
                tick.ahead_lanes = [lane for lane in due if lane in tick.lane_future] + soon
        return proposals

    def _discover_ahead(self, tick: _Tick) -> None:
        """Claim ahead on the lanes due discovery went through (see `_discover`)."""
        if not tick.ahead_lanes:
            return
        with self.store.read() as view:
            for lane in tick.ahead_lanes:
                if not self._claim_ahead(view, lane, tick):
                    break

    def _admit_ahead(self, view: StoreView, tick: _Tick, proposals: list[Appendable]) -> int:
        """Admissions for claims made ahead whose action time the clock now proves. A claim
        whose work changed, closed or is no longer certainly admissible is dropped; due
        discovery then treats its row like any other. Returns how many were proposed."""
        earliest = tick.interval.earliest_ms
        ready = sorted(
            (c for c in self._ahead.values() if c.action_at_ms <= earliest),
            key=lambda c: c.action_at_ms,
        )
        budget = self.config.max_admissions_per_tick
        gates: dict[tuple[str, str], bool] = {}
        proposed = 0
        for claim in ready:
            if proposed >= budget:
                tick.note_next(earliest)
                break
            mid = claim.message_id
            del self._ahead[mid]
            if self.claims.get(mid) is not claim:
                continue  # revoked or dropped since
            lane = (claim.tenant, claim.queue)
            if lane not in gates:
                gates[lane] = self._lane_open(view, lane, tick)
            message = view.get(Table.MESSAGES, str_key(mid))
            if not (
                gates[lane]
                and isinstance(message, Message)
                and message.status is Status.SCHEDULED
                and message.has_work
                and message.generation == claim.generation
                and message.version == claim.version
                and message.action_at_ms == claim.action_at_ms
                and decide(tick.interval, message.action_at_ms, message.expire_at_ms)
                is Decision.ADMIT
            ):
                self.claims.drop(mid, claim.claim_id)
                continue
            tick.proposed.add(mid)
            proposals.append((self._admission(claim, message, tick), None))
            tick.admitted(claim.action_at_ms)
            proposed += 1
        return proposed

    def _lane_open(self, view: StoreView, lane: tuple[str, str], tick: _Tick) -> bool:
        """The lane's gate is open and the lane is READY."""
        gate = view.get(Table.LANES, str_key(lane_id(*lane)))
        if isinstance(gate, Lane) and gate.gate == "CLOSED":
            return False
        return tick.now_ms >= self._lane_unready_until.get(lane, 0)

    def _claim_ahead(self, view: StoreView, lane: tuple[str, str], tick: _Tick) -> bool:
        """Claim the lane's rows that are due within `claim_ahead_ms` but not yet, after
        what due discovery examined. Only plain SCHEDULED work is claimed ahead; anything
        else is left for due discovery. False when no more claims may be made ahead."""
        earliest = tick.interval.earliest_ms
        ahead_ms = self.config.claim_ahead_ms
        lane_open: bool | None = None
        scanned = tick.lane_scanned.get(lane, 0)
        for key in view.lane_keys(*lane, after=tick.lane_cursor.get(lane)):
            action_at_ms, mid, generation = parse_timeline_key(key)
            if action_at_ms > earliest + ahead_ms:
                tick.note_next(action_at_ms - ahead_ms)
                return True
            if action_at_ms <= earliest:
                tick.note_next(earliest)  # due after all: due discovery takes it
                continue
            if scanned >= self.config.lane_scan_limit:
                tick.note_next(action_at_ms)
                return True
            scanned += 1
            if mid in self.claims or mid in tick.proposed:
                continue
            if len(self._ahead) >= self.config.max_claims_ahead:
                tick.note_next(action_at_ms)
                return False
            if lane_open is None:
                lane_open = self._lane_open(view, lane, tick)
            if not lane_open:
                tick.note_next(action_at_ms)
                return True
            tick.note_next(action_at_ms)  # when it is due (if it is not claimed now)
            work = view.get(Table.TIMELINE, key)
            assert isinstance(work, TimelineWork)
            if decide(tick.interval, action_at_ms, work.expire_at_ms) is not Decision.WAIT:
                continue
            message = view.get(Table.MESSAGES, str_key(mid))
            if not (
                isinstance(message, Message)
                and message.status is Status.SCHEDULED
                and message.generation == generation
                and message.version == work.version
                and message.action_at_ms == action_at_ms
                and self.destination.capability == message.capability
            ):
                continue
            if not self.claims.permits.available(lane, message.payload_size):
                return True
            prepared = prepare(
                message, view.payload(message.payload_digest), self.destination, self.config.owner
            )
            if isinstance(prepared, PrepareFailure):
                continue  # due discovery records the failure when the row is due
            self._ahead[mid] = self._new_claim(message, prepared, tick)
        return True

    def _take(
        self,
        view: StoreView,
        lane: tuple[str, str],
        want: int,
        tick: _Tick,
        proposals: list[Appendable],
    ) -> int:
        tenant, queue = lane
        gate = view.get(Table.LANES, str_key(lane_id(tenant, queue)))
        open_gate = not (isinstance(gate, Lane) and gate.gate == "CLOSED")
        ready = tick.now_ms >= self._lane_unready_until.get(lane, 0)
        served = 0
        if not (open_gate and ready):
            tick.note_next(tick.interval.earliest_ms)  # as before: due work stays due
        for key in view.lane_keys(tenant, queue, after=tick.lane_cursor.get(lane)):
            scanned = tick.lane_scanned.get(lane, 0)
            if served >= want or scanned >= self.config.lane_scan_limit:
                tick.note_next(tick.interval.earliest_ms)  # due work may be left
                break
            action_at_ms, mid, generation = parse_timeline_key(key)
            if action_at_ms > tick.interval.earliest_ms:
                tick.lane_future.add(lane)
                break  # this and everything after it is not due yet
            if mid in self.claims or mid in tick.proposed:
                tick.lane_cursor[lane] = key
                tick.lane_scanned[lane] = scanned + 1
                continue
            work = view.get(Table.TIMELINE, key)
            assert isinstance(work, TimelineWork)
            decision = decide(tick.interval, action_at_ms, work.expire_at_ms)
            message: Message | None = None
            if decision is Decision.ADMIT and open_gate and ready and mid not in self.claims:
                found = view.get(Table.MESSAGES, str_key(mid))
                assert isinstance(found, Message)
                message = found
                if not self.claims.permits.available(lane, message.payload_size):
                    tick.note_next(tick.interval.earliest_ms)
                    break  # not examined: the next visit (or tick) starts here
            tick.lane_cursor[lane] = key
            tick.lane_scanned[lane] = scanned + 1
            if mid in self.claims or mid in tick.proposed:
                continue
            if decision is Decision.EXPIRE:
                tick.proposed.add(mid)
                proposals.append((Expire(mid, generation, work.version, tick.interval), None))
                served += 1
            elif decision is Decision.ADMIT and open_gate and ready:
                assert message is not None  # read above: the same snapshot, not read twice
                if message.generation != generation or message.version != work.version:
                    continue  # the index and the row disagree only inside a stale view
                proposal = self._claim(view, message, tick)
                if proposal is None:
                    continue  # the search for its UNKNOWN attempts wakes the loop
                tick.proposed.add(mid)
                proposals.append((proposal, None))
                if isinstance(proposal, PublishAdmission):
                    tick.admitted(action_at_ms)
                served += 1
            else:
                tick.note_next(tick.interval.earliest_ms)  # due and left: as before
        else:
            tick.lane_future.add(lane)  # no rows left in the lane
        return served

    def _claim(self, view: StoreView, message: Message, tick: _Tick) -> Record | None:
        """The proposal for a due message: its Admission, or a claim result proving a
        permanent pre-send error. None while an uncertain retry waits for its look."""
        if message.status is Status.UNCERTAIN and not self._retry_checked(view, message):
            return None
        if self.destination.capability != message.capability:
            return ClaimResult(
                message.message_id,
                message.generation,
                message.version,
                self._claim_id(self.claims.next_sequence()),
                "capability_mismatch",
                f"destination offers {self.destination.capability}",
            )
        prepared = prepare(
            message, view.payload(message.payload_digest), self.destination, self.config.owner
        )
        if isinstance(prepared, PrepareFailure):
            claim_id = self._claim_id(self.claims.next_sequence())
            self.log.warning(
                "claim_failed",
                message_id=message.message_id,
                error=prepared.error_code,
                detail=prepared.detail,
            )
            return ClaimResult(
                message.message_id,
                message.generation,
                message.version,
                claim_id,
                prepared.error_code,
                prepared.detail,
            )
        return self._admission(self._new_claim(message, prepared, tick), message, tick)

    def _claim_tag(self, sequence: int) -> str:
        # A claim namespace keeps attempt ids unique across owners that each keep their own
        # claim sequence (a Kafka-partitioned shard moves between processes).
        namespace = self.config.claim_namespace
        return f"{namespace}-{sequence}" if namespace else str(sequence)

    def _claim_id(self, sequence: int) -> str:
        return f"{self.config.owner}:{self._claim_tag(sequence)}"

    def _new_claim(self, message: Message, prepared: PreparedPublish, tick: _Tick) -> Claim:
        """Claim the message's current generation (with its publish prepared)."""
        sequence = self.claims.next_sequence()
        tag = self._claim_tag(sequence)
        claim = Claim(
            claim_id=f"{self.config.owner}:{tag}",
            claim_sequence=sequence,
            message_id=message.message_id,
            generation=message.generation,
            version=message.version,
            attempt_id=f"{attempt_prefix(message.message_id, message.generation)}{tag}",
            tenant=message.tenant,
            queue=message.queue,
            owner=self.config.owner,
            store_id=self.claims.store_id,
            fencing_revision=self.claims.fencing_revision,
            deadline_ms=tick.now_ms + self.config.claim_deadline_ms,
            action_at_ms=message.action_at_ms,
            size_bytes=prepared.size_bytes(),
            prepared=prepared,
            descriptor_hash=prepared.descriptor_hash(),
        )
        self.claims.add(claim)
        return claim

    def _admission(self, claim: Claim, message: Message, tick: _Tick) -> PublishAdmission:
        """The Admission of a claim, carrying this tick's clock reading as its evidence."""
        return PublishAdmission(
            message_id=message.message_id,
            generation=message.generation,
            version=message.version,
            attempt_id=claim.attempt_id,
            claim_id=claim.claim_id,
            owner=self.config.owner,
            descriptor_hash=claim.descriptor_hash,
            capability=message.capability,
            interval=tick.interval,
            capacity=Capacity(True, lane_permits=1, bytes_reserved=claim.size_bytes),
            fence_id=self.destination.fence_id,
        )

    def _retry_checked(self, view: StoreView, message: Message) -> bool:
        """Before an uncertain retry, look for the generation's UNKNOWN attempts: a retry
        while one of them sits at the destination is a duplicate. True once a complete
        search that started after the retry came due missed every one of them; False while
        that look is still to be done (it is asked for here). A search that finds one
        records it PUBLISHED (`_settle`), which ends the retry."""
        topic = self.destination.topic_for(message.queue)
        prefix = attempt_prefix(message.message_id, message.generation).encode()
        unchecked: list[Want] = []
        for _key, value in view.range(Table.ATTEMPTS, prefix, prefix + b"\xff"):
            assert isinstance(value, Attempt)
            if value.status is not AttemptStatus.UNKNOWN:
                continue
            if self._looked.get(value.attempt_id, -1) < message.action_at_ms:
                lookup = Lookup(value.attempt_id, topic, value.admitted_at_ms)
                unchecked.append(Want(lookup, "attempt", value.fence_id))
        if unchecked:
            self.settler.want(unchecked)
            return False
        return True

    # Recovery -----------------------------------------------------------------------------

    def _recover(self, tick: _Tick) -> None:
        """After a restart no send gate of a PUBLISHING attempt survives: each is settled by
        evidence, in one background search for all of them (`_settle` records what it
        finds). Never re-send blindly; never infer absence without a fence. Every dead-letter
        copy still owed is looked for too (the process that owed it may have written it and
        died before recording it), then written if it is not there."""
        with self.store.read() as view:
            for _key, pending in view.items(Table.DEAD_LETTERS):
                assert isinstance(pending, DeadLetterPending)
                self._owe_copy(pending.message_id, pending.generation, look_first=True)
                message = view.get(Table.MESSAGES, str_key(pending.message_id))
                assert isinstance(message, Message)
                aid = dead_letter_attempt_id(pending.message_id, pending.generation)
                self._look_for_copy(self._dead_letters[aid], aid, message, pending)
            # UNKNOWN ones are the reconciler's.
            wants = self._open_attempts(view, AttemptStatus.PUBLISHING)
        self._recovering = {w.lookup.attempt_id for w in wants}
        self._recovery_started_ms = tick.now_ms
        self._recovery_counts = {}
        self.settler.want(wants)
        self.log.info(
            "recovery_started",
            open_attempts=len(wants),
            dead_letters_owed=len(self._dead_letters),
            fence_id=self.destination.fence_id,
        )
        self._last_reconcile_ms = tick.now_ms  # the reconciler's first pass comes later

    def _reconcile(self) -> None:
        """Look for positive evidence of UNKNOWN attempts, all in one search."""
        if self.settler.busy():
            return  # whatever is being looked for now is looked for in full first
        with self.store.read() as view:
            wants = self._open_attempts(view, AttemptStatus.UNKNOWN)
        # Looks at attempts no longer UNKNOWN are of no use to a later retry.
        unknown = {w.lookup.attempt_id for w in wants}
        self._looked = {aid: at for aid, at in self._looked.items() if aid in unknown}
        self.settler.want(wants)

    def _open_attempts(self, view: StoreView, status: AttemptStatus) -> list[Want]:
        """A lookup for every open attempt in `status`."""
        wants: list[Want] = []
        for key, ob in view.items(Table.OBLIGATIONS):
            assert isinstance(ob, Obligation)
            attempt = view.get(Table.ATTEMPTS, key)
            assert isinstance(attempt, Attempt)
            if attempt.status is not status:
                continue
            message = view.get(Table.MESSAGES, str_key(ob.message_id))
            assert isinstance(message, Message)
            topic = self.destination.topic_for(message.queue)
            lookup = Lookup(attempt.attempt_id, topic, ob.admitted_at_ms)
            wants.append(Want(lookup, "attempt", attempt.fence_id))
        return wants

    def _settle(self, tick: _Tick) -> list[Appendable]:
        """What finished searches prove, as records: PUBLISHED where the attempt was found;
        NOT_PUBLISHED with its proof where its fence proves it absent; for a PUBLISHING
        attempt of recovery that nothing proves either way, UNKNOWN (or, if its fence can
        still prove it, another search). Attempts no longer open are left alone."""
        items: list[Appendable] = []
        results = self.settler.step(tick.now_ms)
        if not results:
            return items
        again: list[Want] = []
        with self.store.read() as view:
            for settled in results:
                want = settled.want
                if want.kind == "dead_letter":
                    self._dead_letter_looked(settled)
                    continue
                aid = want.lookup.attempt_id
                attempt = view.get(Table.ATTEMPTS, str_key(aid))
                if not isinstance(attempt, Attempt) or attempt.status not in (
                    AttemptStatus.PUBLISHING,
                    AttemptStatus.UNKNOWN,
                ):
                    self._recovered_one(aid, "resolved", tick)
                    continue
                result = self._settled_result(settled, attempt, again)
                if result is None:
                    continue
                name = str(type(result).__struct_config__.tag)
                self.log.info(
                    "settled_attempt",
                    attempt_id=aid,
                    result=name,
                    recovery=aid in self._recovering,
                )
                self._recovered_one(aid, name, tick)
                record = PublishOutcome(aid, attempt.message_id, attempt.generation, result)
                items.append((record, None))
        self.settler.want(again)
        return items

    def _settled_result(
        self, settled: Settled, attempt: Attempt, again: list[Want]
    ) -> Published | NotPublished | Unknown | None:
        if settled.evidence is not None:
            return Published(settled.evidence)
        aid = attempt.attempt_id
        if attempt.status is AttemptStatus.UNKNOWN:
            # Only positive evidence resolves UNKNOWN; a complete miss lets a retry go.
            if settled.complete:
                self._looked[aid] = settled.started_ms
            return None
        if settled.proof is not None:
            return NotPublished(
                "retriable",
                "absent_after_fence",
                f"not in the committed records after the fence of {settled.proof.fence_id}",
                proof=settled.proof,
            )
        if aid not in self._recovering:
            return None  # a live attempt looked for by someone else: its send reports it
        fenced = attempt.fence_id is not None and attempt.fence_id == self.destination.fence_id
        if fenced:
            # Its fence can still prove it absent once a search completes: never guess.
            again.append(settled.want)
            return None
        return Unknown("send_gate_lost", "the owner restarted before this attempt's outcome")

    def _recovered_one(self, attempt_id: str, result: str, tick: _Tick) -> None:
        if attempt_id not in self._recovering:
            return
        self._recovering.discard(attempt_id)
        self._recovery_counts[result] = self._recovery_counts.get(result, 0) + 1
        if not self._recovering:
            self.log.info(
                "recovery_settled",
                took_ms=tick.now_ms - self._recovery_started_ms,
                **{k.lower(): v for k, v in sorted(self._recovery_counts.items())},
            )

    # Dead letters -------------------------------------------------------------------------

    def _owe_copy(self, message_id: str, generation: int, *, look_first: bool) -> None:
        aid = dead_letter_attempt_id(message_id, generation)
        if aid not in self._dead_letters:
            self._dead_letters[aid] = _DeadLetterCopy(message_id, generation, look_first=look_first)

    def _dead_letters_due(self, now_ms: int) -> bool:
        return any(c.state == "waiting" and c.due_ms <= now_ms for c in self._dead_letters.values())

    def _dead_letter_result(self, res: SendResult, tick: _Tick) -> list[Appendable]:
        """A PUBLISHED copy goes into the log (whichever of its writes it was: the evidence
        is true of any); a failed or UNKNOWN write is written again after a backoff."""
        copy = self._dead_letters.get(res.attempt_id)
        result = res.result
        if copy is None or copy.state == "recorded":
            return []  # already recorded (a duplicate report) or no longer owed
        if isinstance(result, Published):
            copy.state = "recorded"
            self.metrics.inc("nereus_dead_letters_total", labels={"result": "written"})
            self.log.info("dead_letter_written", attempt_id=res.attempt_id)
            record = DeadLetterWritten(copy.message_id, copy.generation, result.evidence)
            return [(record, None)]
        if copy.state != "sending":
            return []  # a late report of an earlier write: the retry is already planned
        copy.failures += 1
        copy.state = "waiting"
        # Once a write's fate was unknown, every later write looks first: that one may have
        # landed, and a lookup that missed it once proves nothing.
        copy.look_first = copy.look_first or isinstance(result, Unknown)
        copy.due_ms = tick.now_ms + self.config.dead_letter_backoff_ms(copy.failures)
        self.metrics.inc("nereus_dead_letters_total", labels={"result": "failed"})
        self.log.warning(
            "dead_letter_write_failed",
            attempt_id=res.attempt_id,
            result=type(result).__name__,
            error=result.error_code if isinstance(result, NotPublished) else result.reason,
            failures=copy.failures,
            retry_at_ms=copy.due_ms,
        )
        return []

    def _look_for_copy(
        self, copy: _DeadLetterCopy, aid: str, message: Message, pending: DeadLetterPending
    ) -> None:
        copy.state = "looking"
        topic = self.destination.topic_for(message.queue) + DLQ_SUFFIX
        lookup = Lookup(aid, topic, pending.dead_lettered_at_ms)
        self.settler.want([Want(lookup, "dead_letter")])

    def _dead_letter_looked(self, settled: Settled) -> None:
        """A copy found at the destination goes into the log; one not found is written
        (copies are at-least-once: a miss, even by an incomplete search, only risks a second
        copy under the same attempt id)."""
        aid = settled.want.lookup.attempt_id
        copy = self._dead_letters.get(aid)
        if copy is None or copy.state != "looking":
            return
        found = settled.evidence
        if found is None:
            copy.state = "waiting"
            copy.look_first = False
            return
        copy.state = "recorded"
        self.metrics.inc("nereus_dead_letters_total", labels={"result": "found"})
        self.log.info("dead_letter_found", attempt_id=aid, topic=found.destination)
        record = DeadLetterWritten(copy.message_id, copy.generation, found)
        self._deferred.append((record, None))

    def _write_dead_letters(self, tick: _Tick) -> None:
        """Write the copies that are due; look first where a write's fate is unknown."""
        if not self._recovered or not self._dead_letters_due(tick.now_ms):
            return
        if not self.shard_log.send_allowed():
            return  # as for publishes: only an owner that proved it still owns the shard
        due: list[tuple[str, _DeadLetterCopy, Message, DeadLetterPending, bytes | None]] = []
        with self.store.read() as view:
            for aid, copy in list(self._dead_letters.items()):
                if copy.state != "waiting" or copy.due_ms > tick.now_ms:
                    continue
                key = dead_letter_key(copy.message_id, copy.generation)
                pending = view.get(Table.DEAD_LETTERS, key)
                if not isinstance(pending, DeadLetterPending):
                    del self._dead_letters[aid]  # recorded since (folded from the log)
                    continue
                message = view.get(Table.MESSAGES, str_key(copy.message_id))
                assert isinstance(message, Message)
                due.append((aid, copy, message, pending, view.payload(pending.payload_digest)))
        sends: list[Send] = []
        for aid, copy, message, pending, payload in due:
            if copy.look_first:
                self._look_for_copy(copy, aid, message, pending)
                continue
            prepared = prepare_dead_letter(
                dead_letter_message(message, pending),
                payload,
                self.destination,
                attempts_spent=pending.attempts_spent,
                failures=pending.failures,
                last_error=pending.last_error,
            )
            copy.state = "sending"
            sends.append(Send(aid, prepared))
            self.log.warning(
                "dead_lettered",
                message_id=copy.message_id,
                generation=copy.generation,
                topic=prepared.topic,
                last_error=pending.last_error,
                attempt=copy.failures + 1,
            )
        if sends:
            self.destination.submit(sends, self.clock.now_ms())

    # Reads --------------------------------------------------------------------------------

    def _message(self, mid: str) -> Message | None:
        with self.store.read() as view:
            value = view.get(Table.MESSAGES, str_key(mid))
        return value if isinstance(value, Message) else None

    def is_recovered(self) -> bool:
        """The log was caught up and the open attempts found at start were resolved or
        recorded: the store is this shard's current state (up to the latest records)."""
        return self._recovered

    def is_claimed(self, message: Message) -> bool:
        """In somebody's hands: claimed here, or admitted and not yet resolved."""
        claim = self.claims.get(message.message_id)
        if claim is not None and claim.generation == message.generation:
            return True
        return message.status is Status.PUBLISHING

    # Housekeeping -------------------------------------------------------------------------

    def _update_gauges(self, tick: _Tick) -> None:
        m = self.metrics
        m.set("nereus_claims_inflight", len(self.claims))
        m.set("nereus_pending_sends", len(self._pending_sends))
        c = self.store.meta.counters
        m.set("nereus_messages", c.scheduled, {"status": "scheduled"})
        m.set("nereus_messages", c.publishing, {"status": "publishing"})
        m.set("nereus_messages", c.uncertain, {"status": "uncertain"})
        m.set("nereus_open_obligations", c.attempts_publishing + c.attempts_unknown)
        m.set("nereus_recovery_pending_attempts", len(self._recovering))
        m.set("nereus_dead_letters_pending", c.dead_letters_pending)
        m.set("nereus_applied_position", self.store.meta.position)
        width = tick.interval.width_ms
        m.set("nereus_clock_error_bound_seconds", width / 2000 if width < 2**61 else -1)
        if tick.now_ms - self._last_backlog_ms >= 1000 and width < 2**61:
            # Counted at most once a second and at most BACKLOG_COUNT_LIMIT rows: a scan.
            self._last_backlog_ms = tick.now_ms
            stop = timeline_key(tick.interval.earliest_ms + 1, "00" * 16, 0)
            with self.store.read() as view:
                backlog = view.count_timeline_before(stop, BACKLOG_COUNT_LIMIT)
            m.set("nereus_due_backlog", backlog)

    def _next_sleep_s(self, tick: _Tick, holding: bool = False) -> float:
        """How long the loop may sleep: not at all while work is queued (unless commands
        are held for claimed work about to come due), else until the next moment the
        trusted clock lets discovery do something new — a claim coming due, a row to claim
        ahead, a row coming due — but never longer than `idle_sleep_max_ms`."""
        self._wake_at_ms = None
        if self._deferred or tick.sent or (self._intake and not holding):
            return 0.0  # after a send, its outcome is committed by the very next tick
        if self._pending_sends:
            return 0.001
        if self._dead_letters_due(self.clock.now_ms()):
            return 0.001
        if self.shard_log.pending():
            return 0.0
        max_s = self.config.idle_sleep_max_ms / 1000
        settle_at_ms = self.settler.wake_at_ms()
        if settle_at_ms is not None:
            # A search waiting to start (a running one wakes the loop when it is done).
            max_s = min(max_s, max(settle_at_ms - tick.now_ms, 1) / 1000)
        if not (self._recovered and self.shard_log.settled()):
            return max_s  # nothing to discover until the log catches up; wait() wakes early
        if tick.interval.earliest_ms <= -(2**61):
            return max_s
        if not tick.discovered:
            with self.store.read() as view:
                head = view.first_timeline_key()
            if head is None:
                return max_s
            wait_ms = parse_timeline_key(head)[0] - tick.interval.earliest_ms
            return min(max(wait_ms, 0) / 1000, max_s)
        next_ms = tick.next_ms
        for claim in self._ahead.values():
            if next_ms is None or claim.action_at_ms < next_ms:
                next_ms = claim.action_at_ms
        if self._put_action_ms is not None:
            # Rows this tick's commit wrote, which discovery has not seen yet.
            put_ms = self._put_action_ms - self.config.claim_ahead_ms
            if next_ms is None or put_ms < next_ms:
                next_ms = put_ms
        if next_ms is None:
            return max_s
        if next_ms <= tick.interval.earliest_ms:
            return 0.0
        self._wake_at_ms = next_ms
        # The reading is whole milliseconds, rounded down: this may be up to 1 ms long,
        # which is why the loop watches the clock for the last stretch (`_sleep`).
        wait_s = (next_ms - self._earliest_now(tick)) / 1000
        return min(max(wait_s, 0.0002), max_s)


def _describe_metrics(m: Metrics) -> None:
    m.describe(
        "nereus_entries_total",
        "counter",
        "Shard log entries applied, by record type and outcome code.",
    )
    m.describe("nereus_outcomes_total", "counter", "Publish outcomes recorded, by class.")
    m.describe("nereus_admissions_total", "counter", "Publish Admissions applied, won or stale.")
    m.describe(
        "nereus_fire_lag_seconds", "histogram", "deliveredAt minus deliverAt of published attempts."
    )
    m.describe(
        "nereus_early_deliveries_total", "counter", "Deliveries before deliverAt (must stay 0)."
    )
    m.describe("nereus_claims_inflight", "gauge", "Local claims held.")
    m.describe("nereus_pending_sends", "gauge", "Admitted attempts waiting for their send.")
    m.describe("nereus_messages", "gauge", "Messages by status.")
    m.describe("nereus_open_obligations", "gauge", "Attempts PUBLISHING or UNKNOWN.")
    m.describe(
        "nereus_recovery_pending_attempts",
        "gauge",
        "Attempts open at the last restart or takeover whose evidence search has not settled.",
    )
    m.describe(
        "nereus_dead_letters_pending", "gauge", "Dead-letter copies owed and not yet recorded."
    )
    m.describe(
        "nereus_dead_letters_total",
        "counter",
        "Dead-letter copy writes: written, failed (retried after a backoff), found by lookup.",
    )
    m.describe("nereus_applied_position", "gauge", "appliedShardLogPosition.")
    m.describe(
        "nereus_clock_error_bound_seconds",
        "gauge",
        "Half-width of the trusted interval; -1 when unbounded.",
    )
    m.describe("nereus_http_requests_total", "counter", "HTTP requests by route and status.")
    m.describe(
        "nereus_due_backlog", "gauge", "Timeline work already due (counted up to 1,000,000)."
    )
