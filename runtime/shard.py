"""The shard runtime: one thread that owns a shard store and turns due timers into sends.

Theory of operation: each `tick(now)` gathers everything that must enter the shard log —
client commands from the intake (`runtime.intake`), outcomes reported by the destination,
what recovery and reconciliation proved (`runtime.recovery`), and the Admissions, claim
results and expiries discovery proposes (`runtime.discovery`) — and commits them with ONE
group commit (append + fold + claims, one sync). Only then does it act on what the fold
returned (`runtime.effects`): replies complete the callers' futures, `RevokeClaim` releases
claims, each `Publish` admits its claim (`runtime.claims`), and a `DeadLetter` owes a copy
(`runtime.dead_letters`). Then it sends: an admitted attempt goes to the destination only
while its claim is still held here, the trusted clock proves its action time
(`claims.send_gate_open`) and the log says this owner still owns the shard; and it collects
the destination's results in the next tick. A broken invariant raises out of `tick()` and
halts the runtime: restarting replays the log rather than guessing.

Time is an argument: `tick(now)` decides with the reading it is given (`runtime.clock`). Two
more readings of the same clock source are taken inside the tick: when the batch is sealed
for its commit, which stamps its persistence time (so no record, a client's command that
arrived while the tick ran included, is stamped before it arrived: `specs/time.md`), and
after the commit for the send, so an attempt admitted under one reading waits if the clock
became less certain meanwhile. Nothing here reads a clock of its own; the loop
(`runtime.loop`) reads the clock source for each tick and sleeps until the next moment the
clock lets discovery do something new, and Admissions go before queued commands
(`runtime.pacing`).

The "append + fold" step goes through a `runtime.shardlog.ShardLog`: the embedded LMDB log
by default, or a Kafka partition (`adapters.kafka.log`), where the tick's records are folded
when they come back from the broker in a later tick. Recovery waits until the log is caught
up, discovery until every record this owner wrote has been folded, and a send until the log
says this owner still owns the shard. A log that lost the shard raises `ShardLost`: the
runtime stops without halting and releases its claims.

The parts are built and connected once (`runtime.parts`). Records that arise while acting on
a fold, for the next commit, wait in the runtime's one `runtime.deferred.Deferred` queue; the
claim rows reach the store through its claims port (`storage.claims`), in the commit's own
transaction.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

from nereus.kernel.effects import EntryOutcome
from nereus.kernel.keys import parse_timeline_key
from nereus.kernel.model import Message, Status
from nereus.kernel.records import Appendable, PublishOutcome
from nereus.runtime.batching import batch_runs
from nereus.runtime.claims import ClaimTable
from nereus.runtime.clock import ClockReading, ClockSource, read_clock
from nereus.runtime.config import RuntimeConfig
from nereus.runtime.deferred import Deferred
from nereus.runtime.destination import Destination, is_dead_letter_attempt
from nereus.runtime.discovery import Found
from nereus.runtime.errors import RuntimeHalted
from nereus.runtime.guard import guarded
from nereus.runtime.intake import CommandFuture, Intake, Waiter
from nereus.runtime.log import Logger, NullLogger
from nereus.runtime.loop import Loop
from nereus.runtime.metrics import Metrics
from nereus.runtime.pacing import AT_ONCE_S, POLL_S, Pacing, Wake
from nereus.runtime.parts import Parts
from nereus.runtime.shardlog import EmbeddedLog, ShardLog, ShardLost
from nereus.runtime.tally import Gauges
from nereus.storage.store import ShardStore

# CommandFuture: what `submit` returns, importable from here as before the intake had a module.
__all__ = ["CommandFuture", "ShardRuntime"]


@dataclass
class _Tick:
    now: ClockReading
    items: list[Appendable] = field(default_factory=list)
    waiters: list[Waiter] = field(default_factory=list)
    sent: bool = False  # something was handed to the destination


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
        stale = self.claims.load(*store.read_claims())
        if stale:
            self.log.info("claims_dropped_on_start", count=stale)
        self._wake = threading.Event()
        self.intake = Intake(self.config.max_queued_commands, self._wake.set)
        destination.open(store.header.store_id)
        # Records for the next commit that arose outside a gather (while acting on a fold).
        self.deferred = Deferred()
        parts = Parts(
            store,
            destination,
            self.claims,
            self.deferred,
            self._wake.set,
            config=self.config,
            metrics=self.metrics,
            log=self.log,
        )
        self.settler = parts.settler
        self.dead_letters = parts.dead_letters
        self.recovery = parts.recovery
        self.discovery = parts.discovery
        self.effects = parts.effects
        self.pacing = Pacing(self.config)
        self.gauges = Gauges(self.metrics)
        self.loop = Loop(self, clock, self.shard_log, self.pacing, self._wake)
        self._recovered = False
        # Whether the latest reading could not bound true time, so discovery admitted and
        # expired nothing (`Discovery.propose`): shown by peek and readiness, never used
        # to decide anything.
        self.waiting_for_clock = not clock.interval().bounded
        self._tick_lock = threading.Lock()
        self.halted: BaseException | None = None
        self.lost: ShardLost | None = None

    # Intake -------------------------------------------------------------------------------

    def submit(self, items: Sequence[Appendable]) -> CommandFuture:
        """Queue records to be appended as one unit; the future completes after commit.
        An item the shard log could not carry raises TypeError/ValueError here, and nothing
        is queued (`runtime.guard`): found inside the commit, it would halt the shard."""
        checked = guarded(items)
        if self.halted is not None:
            raise RuntimeHalted(f"runtime halted: {self.halted}")
        if not self.shard_log.accepts_commands:
            raise RuntimeError("this shard log takes client commands from its topic only")
        return self.intake.put(checked)

    def execute(self, items: Sequence[Appendable], timeout_s: float = 30.0) -> list[EntryOutcome]:
        return self.submit(items).result(timeout_s)

    # The loop (runtime.loop) -------------------------------------------------------------

    def start(self) -> None:
        self.loop.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        self.loop.stop(timeout_s)

    def run(self) -> None:
        """The loop on the caller's thread, until stopped, halted or the shard is lost."""
        self.loop.run()

    def run_once(self) -> Wake:
        """One tick on the caller's thread, with a reading of the clock source taken now
        (the library commits this way when no loop runs)."""
        return self.loop.run_once()

    @property
    def _loop_thread(self) -> threading.Thread | None:
        # Whether a loop runs (the library commits on the caller's thread when none does).
        return self.loop.thread

    def open_log(self) -> None:
        with self._tick_lock:
            self.shard_log.open()

    def halt(self, error: BaseException) -> None:
        """Stop for good on an error the runtime must not guess past."""
        self.halted = error
        self.log.error("runtime_halted", error=repr(error))
        self.intake.fail_all(error)

    def lose(self, error: ShardLost) -> None:
        """This process no longer owns the shard: let go of it without halting."""
        self.lost = error
        self.log.warning("shard_lost", detail=str(error))
        self.release()

    def release(self) -> None:
        """Let go of the shard's work after the loop stopped (revocation, a lost shard):
        claims are released, nothing more is sent, queued commands fail. The open attempts
        stay in the log for whoever owns the shard next."""
        self.intake.fail_all(ShardLost("the shard was let go"))
        self.claims.release_all()
        self.deferred.clear()
        self.dead_letters.clear()
        self.settler.close()

    # The tick -----------------------------------------------------------------------------

    def tick(self, now: ClockReading) -> Wake:
        """One round with the clock reading `now`: gather, commit once, act on effects,
        send. Returns when the next round should run. Serialised: the library calls it from
        callers' threads when no runtime thread runs."""
        with self._tick_lock:
            self.shard_log.open()
            tick = _Tick(now)
            try:
                return self._tick(tick)
            except BaseException as exc:
                # Commands taken into this round must hear about the failure, not time out.
                for future, _start in tick.waiters:
                    if not future.done():
                        future._fail(exc)
                raise

    def _tick(self, tick: _Tick) -> Wake:
        log, now = self.shard_log, tick.now
        self.waiting_for_clock = not now.interval.bounded
        self.effects.put_action_ms = None  # as written by this tick's commits
        for claim in self.claims.expire(now.now_ms):
            self.log.info("claim_deadline_passed", claim_id=claim.claim_id)
        if self._recovered and not log.settled() and log.pending():
            # A log that folds records after writing them (Kafka): fold what came back
            # first, so this tick's discovery already sees this owner's last proposals.
            self._commit(_Tick(now))
        if not self._recovered and log.caught_up():
            self.recovery.recover(now.now_ms)
            self._recovered = True
        settled = self._recovered and log.settled()
        found = Found()
        if settled and self.store.meta.shard_status == "ACTIVE_FOR_COMMANDS":
            with self.store.read() as view:
                found = self.discovery.propose(view, now)
        queued = bool(self.intake)
        ahead_ms = self.claims.earliest_ahead_ms() if queued else None  # only holds commands
        admissions_first, holding = self.pacing.hold(queued, found.oldest_action_ms, ahead_ms, now)
        with_commands = not (admissions_first or holding)
        if with_commands:
            self.intake.take(tick.items, tick.waiters, self.config.max_commands_per_tick)
        if tick.waiters:
            self.pacing.took_commands()
        tick.items.extend(self._collect_results(now))
        if self._recovered:
            tick.items.extend(self.recovery.settle(now.now_ms))
        self.deferred.drain_into(tick.items)
        if with_commands and settled:
            self.recovery.reconcile_if_due(now.now_ms)
        tick.items.extend(found.proposals)
        # Sends waiting for proof that this owner still owns the shard need a write.
        waiting = bool(self.claims.waiting_to_send()) or self.dead_letters.due(now.now_ms)
        needs_proof = waiting and not log.send_allowed()
        if tick.items or log.pending() or needs_proof:
            self._commit(tick)
        after = read_clock(self.clock)  # the send's own reading, after the commit
        self._send(tick, after)
        self.gauges.update(
            self.store,
            now.interval,
            now.now_ms,
            claims=len(self.claims),
            sends_waiting=self.claims.waiting_to_send(),
            recovering=len(self.recovery.recovering),
        )
        after_s, at_earliest_ms = self._next_wake(tick, found, holding, after)
        return Wake(after_s, at_earliest_ms, took_commands=bool(tick.waiters))

    def _collect_results(self, now: ClockReading) -> list[Appendable]:
        items: list[Appendable] = []
        for res in self.destination.poll(0):
            if is_dead_letter_attempt(res.attempt_id):
                items.extend(self.dead_letters.result(res, now.now_ms))
                continue
            items.append(
                (PublishOutcome(res.attempt_id, res.message_id, res.generation, res.result), None)
            )
        return items

    def _commit(self, tick: _Tick) -> None:
        units = [(start, future.count) for future, start in tick.waiters]
        items, where = batch_runs(tick.items, units)
        sealed_ms = self._seal_ms(tick)
        entries, results = self.shard_log.commit(items, sealed_ms, self.claims.flush)
        outcomes = self.effects.run(results, sealed_ms, recovered=self._recovered)
        for future, start in tick.waiters:
            answers: list[EntryOutcome] = []
            for i in range(start, start + future.count):
                at, index = where[i]
                answers.append(outcomes[entries[at].position][index])
            future._set(answers)

    def _seal_ms(self, tick: _Tick) -> int:
        """The persistence time of the batch being sealed: a reading of the clock source
        taken now, after every record of the batch arrived, never the tick's opening
        reading. A command that reached the intake after that reading was taken would
        otherwise be stamped before it was sent (its deliverAt before send + delay), and an
        Admission committed past its expireAt could carry a stamp inside it. The tick's
        reading is the floor, so a clock stepped back meanwhile never stamps earlier than
        what this tick already decided with (the store clamps against the log as well)."""
        return max(tick.now.now_ms, self.clock.now_ms())

    def _send(self, tick: _Tick, after: ClockReading) -> None:
        """Hand the admitted attempts whose send gate the reading opens to the destination,
        then the dead-letter copies that are due; both only once the log proves this owner
        still owns the shard (else they keep waiting)."""
        ready = self.claims.ready_to_send(after.interval)
        if ready and self.shard_log.send_allowed():
            tick.sent = True
            self.destination.submit(self.claims.sending(ready), after.now_ms)
        now_ms = tick.now.now_ms
        if self._recovered and self.dead_letters.due(now_ms) and self.shard_log.send_allowed():
            copies = self.dead_letters.take_due(now_ms)
            if copies:
                self.destination.submit(copies, after.now_ms)

    def _next_wake(
        self, tick: _Tick, found: Found, holding: bool, after: ClockReading
    ) -> tuple[float, int | None]:
        """When the loop should tick again (`Wake`): at once while work is queued (unless
        commands are held for claimed work about to come due), else at the next moment the
        trusted clock lets discovery do something new — a claim coming due, a row to claim
        ahead, a row coming due — but never later than `idle_sleep_max_ms`."""
        if self.deferred or tick.sent or (self.intake and not holding):
            return AT_ONCE_S, None  # after a send, its outcome is committed by the next tick
        if self.claims.waiting_to_send() or self.dead_letters.due(after.now_ms):
            return POLL_S, None
        if self.shard_log.pending():
            return AT_ONCE_S, None
        now = tick.now
        max_s = self.config.idle_sleep_max_ms / 1000
        settle_at_ms = self.settler.wake_at_ms()
        if settle_at_ms is not None:
            # A search waiting to start (a running one wakes the loop when it is done).
            max_s = min(max_s, max(settle_at_ms - now.now_ms, 1) / 1000)
        if not (self._recovered and self.shard_log.settled()) or not now.interval.bounded:
            return (
                max_s,
                None,
            )  # nothing to discover until the log catches up or the clock says something
        if not found.ran:
            with self.store.read() as view:
                head = view.first_timeline_key()
            if head is None:
                return max_s, None
            wait_ms = parse_timeline_key(head)[0] - now.interval.earliest_ms
            return min(max(wait_ms, 0) / 1000, max_s), None
        ahead_ms = self.claims.earliest_ahead_ms()
        if ahead_ms is not None:
            found.note_next(ahead_ms)
        if self.effects.put_action_ms is not None:
            # Rows this tick's commit wrote, which discovery has not seen yet.
            found.note_next(self.effects.put_action_ms - self.config.claim_ahead_ms)
        if found.next_ms is None:
            return max_s, None
        if found.next_ms <= now.interval.earliest_ms:
            return AT_ONCE_S, None
        return max_s, found.next_ms

    # Reads --------------------------------------------------------------------------------

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
