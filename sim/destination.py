"""A simulated destination: a broker that outlives crashes, and one client per runtime.

`Broker` is the destination's durable side: every record actually written, in write order,
with the TRUE time of the write (which only the simulator knows), the attempt id header and
what the shard store held at that moment. It survives restarts, as a real broker would.

`SimDestination` is what one runtime incarnation talks to (`runtime.destination.Destination`).
Per send (a dead-letter copy's too) it draws one behaviour: success; a definite failure
(retriable, permanent, lane unavailable: the record is certainly absent); a timeout after the
write (UNKNOWN, present, so `find` can prove it later); a timeout before the write (UNKNOWN,
absent); a duplicated delivery report; and any of them acknowledged late. Results wait in
memory until their (true-time) release, so a crash loses them, like a producer's callbacks.
`find` may miss during the chaotic phase (None proves nothing), never in the settled one.

On some seeds the destination also lies, in the ways the audit guards against and the
product must not believe: after a result it reported (UNKNOWN, or PUBLISHED of a record it
holds), a later report says NOT_PUBLISHED for the same attempt; and an unfenced destination's
search calls itself complete although it skipped a record it holds. An honest product
refuses the late reports (the attempt is already UNKNOWN or resolved) and infers nothing
from the search (no fence, no proof); the audit's checks fail the run if it did not. Lies
that no product could see through (a first report that denies a write) are left to the
tests that prove the audit catches them.

Before every send the destination opens a read view of the shard store and records what it
found there (`checks.send_problem`): a send must find its attempt durably PUBLISHING.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from nereus.kernel.keys import DEFAULT_TENANT
from nereus.kernel.records import IMMEDIATE, Capability, Evidence, NotPublished, Published, Unknown
from nereus.runtime.destination import (
    H_ATTEMPT_ID,
    Fence,
    FinishedSearch,
    Lookup,
    PublishResult,
    Search,
    SearchOutcome,
    Send,
    SendResult,
    is_dead_letter_attempt,
)
from nereus.sim.checks import send_problem
from nereus.sim.clock import SimClock
from nereus.sim.crash import Faults
from nereus.storage.store import ShardStore

MAX_RECORD_BYTES = 4096

# Per-send behaviours. A definite failure is reported only when nothing was written.
OK = "ok"
RETRIABLE = "retriable"
PERMANENT = "permanent"
LANE_UNAVAILABLE = "lane_unavailable"
TIMEOUT_AFTER_WRITE = "timeout_after_write"
TIMEOUT_BEFORE_WRITE = "timeout_before_write"
BEHAVIOURS = (
    RETRIABLE,
    PERMANENT,
    LANE_UNAVAILABLE,
    TIMEOUT_AFTER_WRITE,
    TIMEOUT_BEFORE_WRITE,
)
WRITES = frozenset({OK, TIMEOUT_AFTER_WRITE})


@dataclass(frozen=True)
class Write:
    seq: int  # global write order at the broker
    attempt_id: str  # from the record's attempt-id header, not from the Send
    message_id: str
    generation: int
    topic: str
    offset: int
    true_ms: int
    deliver_at_ms: int  # what the descriptor said; checks use their own deliverAt
    dlq: bool
    synchronized: bool  # whether the runtime's clock was synchronised at the write
    earliest_ms: int  # the trusted interval's earliest end, as the runtime could read it then
    headers: tuple[tuple[str, bytes], ...]  # the record's headers, as written
    # The shard store at the moment of the write: its applied position, and the problem
    # (if any) with the attempt's durable state.
    applied_position: int
    problem: str | None


@dataclass
class Broker:
    writes: list[Write] = field(default_factory=list)
    by_attempt: dict[str, list[Write]] = field(default_factory=dict)
    offsets: Counter[str] = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)  # send-time violations

    def write(self, send: Send, clock: SimClock, applied: int, problem: str | None) -> Write:
        p = send.prepared
        attempt_id = dict(send.headers())[H_ATTEMPT_ID].decode()
        w = Write(
            seq=len(self.writes),
            attempt_id=attempt_id,
            message_id=p.message_id,
            generation=p.generation,
            topic=p.topic,
            offset=self.offsets[p.topic],
            true_ms=clock.true_ms,
            deliver_at_ms=p.deliver_at_ms,
            dlq=p.topic.endswith(".dlq"),
            synchronized=clock.synchronized,
            earliest_ms=clock.interval().earliest_ms,
            headers=send.headers(),
            applied_position=applied,
            problem=problem,
        )
        self.offsets[p.topic] += 1
        self.writes.append(w)
        self.by_attempt.setdefault(attempt_id, []).append(w)
        return w

    def evidence(self, attempt_id: str) -> Evidence | None:
        found = self.by_attempt.get(attempt_id)
        if not found:
            return None
        w = found[0]
        return Evidence(w.topic, 0, w.offset, w.true_ms)


@dataclass
class FaultProfile:
    """How hostile this seed's destination is; drawn once per seed."""

    fault_rate: float  # probability that a send does not simply succeed
    slow_rate: float  # probability that a result is acknowledged late
    duplicate_rate: float  # probability that a result is reported twice
    find_miss_rate: float  # probability that an evidence lookup misses a present record
    lie_rate: float  # probability of a lie after a result or in a search (see the module)
    # Whether every incarnation's producer can be fenced: a restarted one then proves the
    # absence of what a complete search does not find (a dead incarnation writes nothing),
    # among the attempts admitted before it started by its clock's reading, as the local
    # destination does (`adapters.local.destination`): later ones stay unproven (UNKNOWN).
    fenced: bool = False
    calm: bool = False  # the settled phase: every send succeeds, find never misses
    # False: this destination never lies and draws nothing for lies (see `World.edge_faults`).
    lies: bool = True

    @classmethod
    def draw(cls, rng: random.Random, *, lies: bool = True) -> FaultProfile:
        return cls(
            fault_rate=rng.choice((0.0, 0.1, 0.25, 0.5)),
            slow_rate=rng.choice((0.0, 0.1, 0.3)),
            duplicate_rate=rng.choice((0.0, 0.05, 0.2)),
            find_miss_rate=rng.choice((0.0, 0.2, 0.5)),
            fenced=rng.random() < 0.5,
            lie_rate=rng.choice((0.0, 0.0, 0.2, 0.5)) if lies else 0.0,
            lies=lies,
        )


class SimDestination:
    """`runtime.destination.Destination` over the shared broker, for one incarnation."""

    name = "sim"
    capability: Capability = IMMEDIATE

    def __init__(
        self,
        broker: Broker,
        clock: SimClock,
        rng: random.Random,
        *,
        store: ShardStore,
        profile: FaultProfile,
        faults: Faults,
        stats: Counter[str],
        trace: Callable[[str], None],
    ) -> None:
        self.broker = broker
        self.clock = clock
        self.rng = rng
        self.store = store
        self.profile = profile
        self.faults = faults
        self.stats = stats
        self.trace = trace
        self._inflight: list[tuple[int, int, SendResult]] = []  # (release ms, order, result)
        self._order = 0
        self.fence_id: str | None = "sim-producer" if profile.fenced else None
        # Made when the incarnation starts: every earlier one is dead, so fenced.
        self._fence = Fence("sim-producer", clock.true_ms) if profile.fenced else None
        # As the local destination's fence: it covers only attempts admitted before it, as
        # the incarnation's clock read then (what was admitted since may be its own).
        self._fenced_reading_ms = clock.now_ms()

    def open(self, store_id: str) -> None:
        pass

    def max_record_bytes(self, topic: str) -> int:
        return MAX_RECORD_BYTES

    def topic_for(self, queue: str, *, tenant: str = DEFAULT_TENANT) -> str:
        # One topic per tenant's queue, named as the local destination names them.
        return queue if tenant == DEFAULT_TENANT else f"{tenant}/{queue}"

    def submit(self, sends: Sequence[Send], now_ms: int) -> None:
        for send in sends:
            # Crash after the commit, before this record reaches the broker.
            self.faults.hit("send_before_write")
            self._one(send)
            # Crash after the write, before any acknowledgement is seen.
            self.faults.hit("send_after_write")

    def _one(self, send: Send) -> None:
        p = send.prepared
        dlq = p.topic.endswith(".dlq")
        # Dead-letter copies meet the same weather as publishes: failures, timeouts before
        # and after the write, duplicate and late reports.
        behaviour = self._behaviour()
        with self.store.read() as view:
            problem = send_problem(view, send)
            applied = self.store.meta.position
        self.stats[f"{'dlq_send' if dlq else 'send'}_{behaviour}"] += 1
        written: Write | None = None
        if behaviour in WRITES:
            written = self.broker.write(send, self.clock, applied, problem)
        self.trace(f"send {send.attempt_id} {behaviour} written={written is not None}")
        result: PublishResult
        if behaviour == OK:
            assert written is not None
            result = Published(Evidence(written.topic, 0, written.offset, written.true_ms))
        elif behaviour == RETRIABLE:
            result = NotPublished("retriable", "sim_retriable")
        elif behaviour == PERMANENT:
            result = NotPublished("permanent", "sim_permanent")
        elif behaviour == LANE_UNAVAILABLE:
            result = NotPublished("lane_unavailable", "sim_lane_unavailable")
        else:
            result = Unknown("sim_timeout", behaviour)
        if problem is not None:
            # Recorded with or without a write: calling the producer was the violation.
            self.broker.problems.append(f"send of {send.attempt_id}: {problem}")
        self._report(SendResult(send.attempt_id, p.message_id, p.generation, result))

    def _behaviour(self) -> str:
        profile = self.profile
        if profile.calm or self.rng.random() >= profile.fault_rate:
            return OK
        return self.rng.choice(BEHAVIOURS)

    def _report(self, result: SendResult) -> None:
        copies = 1
        if not self.profile.calm and self.rng.random() < self.profile.duplicate_rate:
            copies = 2
            self.stats["fault_duplicate_report"] += 1
        last_ms = self.clock.true_ms
        for _ in range(copies):
            delay = 0
            if not self.profile.calm and self.rng.random() < self.profile.slow_rate:
                delay = self.rng.randint(1, 3_000)
                self.stats["fault_slow_ack"] += 1
            self._order += 1
            self._inflight.append((self.clock.true_ms + delay, self._order, result))
            last_ms = max(last_ms, self.clock.true_ms + delay)
        self._maybe_lie(result, last_ms)

    def _maybe_lie(self, result: SendResult, after_ms: int) -> None:
        """A later report denying what was reported: NOT_PUBLISHED after UNKNOWN, or of a
        record the broker holds after it was reported PUBLISHED. Released strictly after the
        true report, so the product has recorded the truth before the lie arrives."""
        if self.profile.calm or not self.profile.lies or self.rng.random() >= self.profile.lie_rate:
            return
        if is_dead_letter_attempt(result.attempt_id):
            return
        r = result.result
        if isinstance(r, Unknown):
            self.stats["lie_not_published_after_unknown"] += 1
        elif isinstance(r, Published):
            self.stats["lie_not_published_of_written"] += 1
        else:
            return
        lie = SendResult(
            result.attempt_id,
            result.message_id,
            result.generation,
            NotPublished("retriable", "sim_lie"),
        )
        self._order += 1
        self._inflight.append((after_ms + self.rng.randint(1, 2_000), self._order, lie))

    def poll(self, timeout_s: float) -> list[SendResult]:
        now = self.clock.true_ms
        ready = sorted(r for r in self._inflight if r[0] <= now)
        self._inflight = [r for r in self._inflight if r[0] > now]
        return [r[2] for r in ready]

    def pending(self) -> int:
        return len(self._inflight)

    def search(self, lookups: Sequence[Lookup], wake: Callable[[], None]) -> Search:
        """In the chaotic phase a search may miss a present record (and is then incomplete,
        as a real one that hit a bound would be); in the settled phase it finds everything."""
        self.stats["search_calls"] += 1
        found: dict[str, Evidence] = {}
        complete = True
        for lookup in lookups:
            self.stats["search_lookups"] += 1
            evidence = self.broker.evidence(lookup.attempt_id)
            if evidence is None:
                continue
            if not self.profile.calm and self.rng.random() < self.profile.find_miss_rate:
                self.stats["fault_find_miss"] += 1
                if (
                    self.profile.lies
                    and self._fence is None
                    and self.rng.random() < self.profile.lie_rate
                ):
                    # Claims to have read everything: without a fence that proves nothing.
                    self.stats["lie_search_complete_but_missed"] += 1
                else:
                    complete = False
                continue
            found[lookup.attempt_id] = evidence
        unfenced: frozenset[str] = frozenset()
        if self._fence is not None:
            unfenced = frozenset(
                lk.attempt_id for lk in lookups if lk.since_ms >= self._fenced_reading_ms
            )
            self.stats["search_unfenced"] += len(unfenced)
        outcome = SearchOutcome(
            found, complete=complete, fence=self._fence, searched="sim broker", unfenced=unfenced
        )
        return FinishedSearch(outcome)

    def close(self) -> None:
        self._inflight = []
