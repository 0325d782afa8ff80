"""The real kernel against a naive model of the lifecycle, driven by hypothesis.stateful.

Theory of operation: `Model` is written from `specs/README.md`, `specs/time.md` and the
seeds, not from the kernel: a dict per identity holding the status, generation, version,
txn, deliverAt, expireAt, retry work, attempts spent and open attempts, plus an attempt
ledger. Every rule builds one record, predicts its outcome code from the model, applies it to
both, and checks that the kernel answered the same; the `@invariant`s then compare every
identity's row and every attempt, and run `kernel.assert_invariants`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from nereus import kernel as k
from nereus.kernel.effects import EntryOutcome, Publish
from nereus.kernel.model import OPEN_ATTEMPT_STATUSES, AttemptStatus, Status
from nereus.kernel.records import ShardStatus
from tests.support.builders import DIGEST, OTHER_DIGEST, T0_MS
from tests.support.strategies import CONFIG, IDENTITIES, LANES, MESSAGE_IDS, props

S, P, U, D = Status.SCHEDULED, Status.PUBLISHING, Status.UNCERTAIN, Status.DELIVERED
C, E, X = Status.CANCELED, Status.EXPIRED, Status.DEAD_LETTERED
LIMITS = CONFIG.limits

# Model ------------------------------------------------------------------------------------


@dataclass
class Timer:
    status: Status
    generation: int
    version: int
    txn: str
    deliver_at_ms: int
    expire_at_ms: int
    action_at_ms: int
    has_work: bool
    destination: str
    request: tuple[str, k.Schedule | k.Reschedule]  # for identical-retry detection
    attempts_spent: int = 0
    failures: int = 0
    uncertain_retries: int = 0
    open: set[str] = field(default_factory=set)  # this generation's open attempts
    last_attempt: str | None = None
    delivered_by: str | None = None  # the first attempt of the generation proven PUBLISHED
    # Generations (this one or superseded ones) whose dead-letter copy is owed, and where
    # this generation's copy was written.
    copies_owed: set[int] = field(default_factory=set)
    copy_evidence: k.Evidence | None = None

    def too_late_names(self) -> str | None:
        return self.delivered_by or self.last_attempt

    def crossed(self) -> bool:
        """An attempt of this generation is open or proven published (ARCHITECTURE
        decision 1): for a dead letter, the difference between too_late and absent."""
        return bool(self.open) or self.delivered_by is not None


@dataclass
class Attempt:
    ident: int
    generation: int
    status: AttemptStatus


def armed(t: Timer) -> bool:
    """Admissible and expirable: pending, or UNCERTAIN with a retry still armed."""
    return t.status is S or (t.status is U and t.has_work)


def backoff_ms(failures: int) -> int:
    return min(CONFIG.backoff_base_ms << (failures - 1), CONFIG.backoff_max_ms)


def v1_timing(bp_ms: int, deliver_ms: int, expire_ms: int) -> k.Code | None:
    if deliver_ms > bp_ms + LIMITS.max_delay_horizon_ms:
        return k.Code.HORIZON_EXCEEDED
    if expire_ms > bp_ms + LIMITS.max_message_lifetime_ms:
        return k.Code.LIFETIME_EXCEEDED
    if expire_ms < max(deliver_ms, bp_ms) + LIMITS.min_delivery_window_ms:
        return k.Code.EXPIRE_BEFORE_WINDOW
    return None


def resolve(bp_ms: int, r: k.Schedule | k.Reschedule) -> tuple[int, int]:
    """(deliverAt, expireAt) of a command persisted at bp (specs/time.md)."""
    deliver = r.deliver_at_ms if r.deliver_at_ms is not None else bp_ms + (r.delay_ms or 0)
    if r.expire_at_ms is not None:
        return deliver, r.expire_at_ms
    if r.lifetime_ms is not None:
        return deliver, bp_ms + r.lifetime_ms
    grace = CONFIG.default_expiry_grace_ms
    return deliver, min(max(deliver, bp_ms) + grace, bp_ms + LIMITS.max_message_lifetime_ms)


@dataclass
class Model:
    now_ms: int = T0_MS
    shard: ShardStatus = "ACTIVE_FOR_COMMANDS"
    closed_lanes: set[tuple[str, str]] = field(default_factory=set)
    timers: dict[int, Timer] = field(default_factory=dict)
    attempts: dict[str, Attempt] = field(default_factory=dict)

    def new_generation(
        self, ident: int, old: Timer | None, record: k.Schedule | k.Reschedule, kind: str
    ) -> None:
        deliver, expire = resolve(self.now_ms, record)
        destination = record.destination if isinstance(record, k.Schedule) else ""
        self.timers[ident] = Timer(
            status=S,
            generation=old.generation + 1 if old else 1,
            version=old.version + 1 if old else 1,
            txn=record.txn,
            deliver_at_ms=deliver,
            expire_at_ms=expire,
            action_at_ms=deliver,
            has_work=True,
            destination=destination or (old.destination if old else "default"),
            request=(kind, record),
            # A superseding schedule does not cancel a copy the old generation owes.
            copies_owed=set(old.copies_owed) if old else set(),
        )

    def after_failure(self, t: Timer, op: str, *, spends: bool) -> None:
        """specs/README.md decision 4 and the UNCERTAIN paragraph."""
        t.attempts_spent += 1 if spends else 0
        t.failures += 1
        if op == "unknown":
            t.status = U
        elif t.attempts_spent >= CONFIG.max_attempts:
            t.status = X
            t.copies_owed.add(t.generation)
        else:
            t.status = U if t.open else S
        retry_ms = max(self.now_ms + backoff_ms(t.failures), t.deliver_at_ms)
        t.has_work = False
        if t.status is S:
            t.has_work, t.action_at_ms = True, min(retry_ms, t.expire_at_ms)
        elif (
            t.status is U
            and t.uncertain_retries < CONFIG.max_uncertain_retries
            and retry_ms < t.expire_at_ms
        ):
            t.has_work, t.action_at_ms = True, retry_ms


# The machine ------------------------------------------------------------------------------

# Skewed towards the first identities so that one run keeps coming back to the same timers.
idents = st.sampled_from([0] * 6 + [1] * 3 + [2] * 2 + list(range(3, len(IDENTITIES))))
delays_ms = st.sampled_from((0, 1, 1_000, LIMITS.max_delay_horizon_ms)) | st.integers(0, 25_000)
lifetimes_ms = st.sampled_from(
    (None, None, None, None, LIMITS.min_delivery_window_ms, LIMITS.max_message_lifetime_ms, 45_000)
)
mostly = st.sampled_from((True, True, False))
rarely = st.sampled_from((False, False, False, True))
RESULTS = ("published", "retriable", "permanent", "lane", "unknown")
errors_ms = st.sampled_from((0, 0, 1, 5)) | st.integers(0, 3_000)
shifts_ms = st.sampled_from((0, 0, 0, -1, 1, -1_000, 1_000))


class KernelAgainstModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.state = k.State.initial(CONFIG)
        self.model = Model()
        self.last_schedule: dict[int, k.Schedule] = {}
        self.last_admission: k.PublishAdmission | None = None
        self.claims: dict[int, tuple[int, int]] = {}
        self.seq = 0
        self.spread = len(IDENTITIES)

    def apply(self, record: k.Record, want: k.Code) -> EntryOutcome:
        entry = k.LogEntry(self.state.meta.position + 1, self.model.now_ms, record)
        self.state, effects = k.reduce(self.state, entry)
        outcome = effects[0]
        assert isinstance(outcome, EntryOutcome)
        assert outcome.code is want, f"kernel {outcome.code}, model {want}: {record}"
        publishes = [e for e in effects if isinstance(e, Publish)]
        assert len(publishes) == (1 if want is k.Code.ADMITTED else 0)
        return outcome

    @initialize(
        spread=st.sampled_from((len(IDENTITIES), 1, 2)),
        count=st.integers(1, 3),
        delay_ms=st.integers(0, 3_000),
    )
    def open_with_schedules(self, spread: int, count: int, delay_ms: int) -> None:
        """Every run starts with a few live timers (stateful runs switch whole rules off,
        and a run whose schedule rule is off would otherwise test only rejections). Some
        runs fold all identities into one or two, so single timers live long enough to
        reach the deep states: uncertain retries, late evidence, dead letters."""
        self.spread = spread
        for ident in range(min(count, spread)):
            self.schedule(
                ident=ident,
                delay_ms=delay_ms,
                lifetime_ms=None,
                txn=0,
                content=0,
                other_destination=False,
            )

    # Commands ------------------------------------------------------------------------------

    def _schedule(self, ident: int, record: k.Schedule) -> None:
        m, t = self.model, self.model.timers.get(ident)
        deliver, expire = resolve(m.now_ms, record)
        # An identical retry is answered before its timing is checked against the later
        # persistence time (specs/README.md decision 2).
        want: k.Code | None = None
        if m.shard == "FROZEN":
            want = k.Code.SHARD_NOT_ACTIVE
        elif t is not None and t.request == ("schedule", record):
            want = k.Code.UNCHANGED
        else:
            want = v1_timing(m.now_ms, deliver, expire)
        if want is None:
            if t is None:
                want = k.Code.SCHEDULED
            elif t.status in (P, U):
                want = k.Code.TOO_LATE
            elif t.txn == record.txn:  # a new generation needs a new txn
                want = k.Code.TXN_REUSED
            elif t.status in (D, C, E, X):
                want = k.Code.SCHEDULED
            elif t.destination != record.destination:
                want = k.Code.DESTINATION_CHANGED
            else:
                want = k.Code.RESCHEDULED
        self.apply(record, want)
        if want in (k.Code.SCHEDULED, k.Code.RESCHEDULED):
            m.new_generation(ident, t, record, "schedule")

    @rule(
        ident=idents,
        delay_ms=delays_ms,
        lifetime_ms=lifetimes_ms,
        txn=st.integers(0, 3),
        content=st.integers(0, 1),
        other_destination=st.integers(0, 5).map(lambda x: x == 0),
        absolute=rarely,
    )
    def schedule(
        self,
        *,
        ident: int,
        delay_ms: int,
        lifetime_ms: int | None,
        txn: int,
        content: int,
        other_destination: bool,
        absolute: bool = False,
    ) -> None:
        """`absolute` is the library form: deliverAt and expireAt as instants, expireAt at
        the tightest the window allows (deliverAt = expireAt - minDeliveryWindow), so a
        later identical retry would no longer pass the timing rules on its own."""
        ident %= self.spread
        digest = DIGEST if content == 0 else OTHER_DIGEST
        deliver_at_ms = self.model.now_ms + delay_ms
        window_ms = LIMITS.min_delivery_window_ms
        record = k.Schedule(
            *IDENTITIES[ident],
            txn=f"t{txn}",
            payload_digest=digest,
            payload_size=7,
            delay_ms=None if absolute else delay_ms,
            lifetime_ms=None if absolute else lifetime_ms,
            deliver_at_ms=deliver_at_ms if absolute else None,
            expire_at_ms=deliver_at_ms + window_ms if absolute else None,
            destination="other" if other_destination else "default",
        )
        self.last_schedule[ident] = record
        self._schedule(ident, record)

    @rule(ident=idents, late_ms=st.sampled_from((0, 0, 1_000, 30_000)))
    def identical_retry(self, ident: int, late_ms: int) -> None:
        """A client resends its last schedule, maybe much later (after deliverAt, when an
        absolute request would no longer pass the timing rules by itself)."""
        ident %= self.spread
        if ident in self.last_schedule:
            self.model.now_ms += late_ms
            self._schedule(ident, self.last_schedule[ident])

    @rule(ident=idents, delay_ms=delays_ms, lifetime_ms=lifetimes_ms, txn=st.integers(0, 2))
    def reschedule(self, ident: int, delay_ms: int, lifetime_ms: int | None, txn: int) -> None:
        ident %= self.spread
        m, t = self.model, self.model.timers.get(ident)
        record = k.Reschedule(
            *IDENTITIES[ident], txn=f"r{txn}", delay_ms=delay_ms, lifetime_ms=lifetime_ms
        )
        deliver, expire = resolve(m.now_ms, record)
        want: k.Code | None = None
        if m.shard == "FROZEN":
            want = k.Code.SHARD_NOT_ACTIVE
        elif t is not None and t.status in (S, P, U, D) and t.request == ("reschedule", record):
            want = k.Code.UNCHANGED
        else:
            want = v1_timing(m.now_ms, deliver, expire)
        if want is None:
            if t is None or t.status in (C, E) or (t.status is X and not t.crossed()):
                want = k.Code.ABSENT
            elif t.status is S:
                want = k.Code.TXN_REUSED if t.txn == record.txn else k.Code.RESCHEDULED
            else:  # crossed Admission: P, U, D, or X with an attempt UNKNOWN or PUBLISHED
                want = k.Code.TOO_LATE
        self.apply(record, want)
        if want is k.Code.RESCHEDULED:
            m.new_generation(ident, t, record, "reschedule")

    @rule(ident=idents, expected=st.sampled_from(("none", "none", "current", "stale")))
    def cancel(self, ident: int, expected: str) -> None:
        ident %= self.spread
        m, t = self.model, self.model.timers.get(ident)
        version = t.version if t else 0
        expected_version = {"none": None, "current": version, "stale": version + 1}[expected]
        if m.shard == "FROZEN":
            want = k.Code.SHARD_NOT_ACTIVE
        elif expected_version is not None and expected_version != version:
            want = k.Code.VERSION_MISMATCH
        elif t is None or t.status in (C, E) or (t.status is X and not t.crossed()):
            want = k.Code.ABSENT
        elif t.status is S:
            want = k.Code.CANCELED
        else:  # crossed Admission: P, U, D, or X with an attempt UNKNOWN or PUBLISHED
            want = k.Code.TOO_LATE
        outcome = self.apply(k.Cancel(*IDENTITIES[ident], expected_version), want)
        if want is k.Code.TOO_LATE:
            assert t is not None and outcome.attempt_id == t.too_late_names()
        if want is k.Code.CANCELED:
            assert t is not None
            t.status, t.version, t.has_work = C, t.version + 1, False

    # System mutations ----------------------------------------------------------------------

    @rule(ident=idents)
    def claim(self, ident: int) -> None:
        ident %= self.spread
        t = self.model.timers.get(ident)
        if t is not None:
            self.claims[ident] = (t.generation, t.version)

    def target(self, pick: int, raw: bool) -> int:
        """The identity a mutation is about: usually one whose timer has work (a worker
        acts on what its due scan found), sometimes `pick` as drawn."""
        armed_idents = [i for i, t in sorted(self.model.timers.items()) if t.has_work]
        if raw or not armed_idents:
            return pick % self.spread
        return armed_idents[pick % len(armed_idents)]

    @rule(
        pick=idents,
        raw=rarely,
        from_claim=st.booleans(),
        error_ms=errors_ms,
        shift_ms=shifts_ms,
        duplicate=st.integers(0, 9).map(lambda x: x == 0),
        timing=st.sampled_from(("due", "due", "due", "now", "log_lags", "log_behind")),
        then=st.sampled_from((None, None, "unknown", *RESULTS)),
    )
    def admit(
        self,
        *,
        pick: int,
        raw: bool,
        from_claim: bool,
        error_ms: int,
        shift_ms: int,
        duplicate: bool,
        timing: str,
        then: str | None,
    ) -> None:
        """A worker's Admission, optionally followed by the destination's report on it.
        `due`: the worker proposes once its clock proves actionAt (at actionAt + error).
        `now`: with whatever interval it has now. `log_lags`: it decided when due, but the
        log persisted the record at or after expireAt. `log_behind`: its clock ran ahead, so
        it decided when due by its clock and the log persisted it just before actionAt."""
        ident = self.target(pick, raw)
        m, t = self.model, self.model.timers.get(ident)
        decided_ms = m.now_ms + shift_ms
        if t is not None and timing != "now":
            decided_ms = max(m.now_ms, t.action_at_ms + error_ms)
            m.now_ms = {
                "due": decided_ms,
                "log_lags": max(m.now_ms, t.expire_at_ms + shift_ms),
                "log_behind": max(m.now_ms, t.action_at_ms - 1),
            }[timing]
        last = self.last_admission
        if duplicate and last is not None and last.attempt_id in m.attempts:
            # An enqueue retry of an Admission that won: refused before anything else.
            self.apply(last, k.Code.ADMISSION_DUPLICATE_ATTEMPT)
            return
        generation, version = (t.generation, t.version) if t else (1, 1)
        if from_claim and ident in self.claims:
            generation, version = self.claims[ident]
        self.seq += 1
        mid = MESSAGE_IDS[ident]
        interval = k.TrustedInterval(decided_ms - error_ms, decided_ms + error_ms)
        record = k.PublishAdmission(
            message_id=mid,
            generation=generation,
            version=version,
            attempt_id=f"{k.attempt_prefix(mid, generation)}{self.seq}",
            claim_id=f"claim-{self.seq}",
            owner="node-a",
            descriptor_hash="d",
            capability=k.Capability(),
            interval=interval,
            capacity=k.Capacity(True),
        )
        if m.shard != "ACTIVE_FOR_COMMANDS":
            want = k.Code.SHARD_NOT_ACTIVE
        elif t is None or (t.generation, t.version) != (generation, version) or not armed(t):
            want = k.Code.ADMISSION_STALE
        elif IDENTITIES[ident][:2] in m.closed_lanes:
            want = k.Code.ADMISSION_LANE_CLOSED
        elif not (interval.latest_ms < t.expire_at_ms and interval.earliest_ms >= t.action_at_ms):
            want = k.Code.ADMISSION_EVIDENCE_INVALID
        elif m.now_ms < t.action_at_ms:
            want = k.Code.ADMISSION_BEFORE_ACTION_TIME
        elif m.now_ms >= t.expire_at_ms:
            want = k.Code.ADMISSION_AFTER_EXPIRE
        else:
            want = k.Code.ADMITTED
        self.apply(record, want)
        self.last_admission = record
        if want is k.Code.ADMITTED:
            assert t is not None
            m.attempts[record.attempt_id] = Attempt(ident, generation, AttemptStatus.PUBLISHING)
            if t.status is U:
                t.uncertain_retries += 1
            t.status, t.version, t.has_work = P, t.version + 1, False
            t.open.add(record.attempt_id)
            t.last_attempt = record.attempt_id
            if then is not None:
                self.report(record.attempt_id, then, wrong_generation=False)

    @rule(
        pick=st.integers(0, 20),
        result=st.sampled_from(RESULTS),
        wrong_generation=st.integers(0, 9).map(lambda x: x == 0),
    )
    def outcome(self, pick: int, result: str, wrong_generation: bool) -> None:
        """A report on any admitted attempt: usually an open one, sometimes a resolved one
        (a duplicate report), an UNKNOWN one, or one of a superseded generation."""
        m = self.model
        if not m.attempts:
            return
        open_ids = [a for a, v in m.attempts.items() if v.status in OPEN_ATTEMPT_STATUSES]
        pool = open_ids if open_ids and pick % 4 else list(m.attempts)
        self.report(pool[pick % len(pool)], result, wrong_generation=wrong_generation)

    def report(self, attempt_id: str, result: str, *, wrong_generation: bool) -> None:
        m = self.model
        a = m.attempts[attempt_id]
        evidence = k.Evidence("default", 0, self.state.meta.position + 1, m.now_ms)
        bodies: dict[str, k.Published | k.NotPublished | k.Unknown] = {
            "published": k.Published(evidence),
            "retriable": k.NotPublished("retriable", "broker_down"),
            "permanent": k.NotPublished("permanent", "too_large"),
            "lane": k.NotPublished("lane_unavailable", "lane_closed"),
            "unknown": k.Unknown("timeout"),
        }
        body = bodies[result]
        generation = a.generation + (1 if wrong_generation else 0)
        record = k.PublishOutcome(attempt_id, MESSAGE_IDS[a.ident], generation, body)
        if wrong_generation:
            want = k.Code.OUTCOME_MISMATCH
        elif a.status is AttemptStatus.PUBLISHING:
            want = k.Code.OUTCOME_RECORDED
        elif a.status is AttemptStatus.UNKNOWN:
            want = {
                "published": k.Code.OUTCOME_RECORDED,
                "unknown": k.Code.OUTCOME_ALREADY_RECORDED,
            }.get(result, k.Code.OUTCOME_ABSENCE_NOT_EVIDENCE)
        else:
            want = k.Code.OUTCOME_ALREADY_RECORDED
        self.apply(record, want)
        if want is not k.Code.OUTCOME_RECORDED:
            return
        a.status = {
            "published": AttemptStatus.PUBLISHED,
            "unknown": AttemptStatus.UNKNOWN,
        }.get(result, AttemptStatus.NOT_PUBLISHED)
        t = m.timers[a.ident]
        if a.generation != t.generation:
            return  # a superseded generation's attempt: the ledger only
        t.version += 1
        if a.status is not AttemptStatus.UNKNOWN:
            t.open.discard(attempt_id)
        if t.status not in (P, U):
            # Delivered or dead-lettered already: the status stays; a dead letter proven
            # published after all keeps where it went.
            if t.status is X and result == "published" and t.delivered_by is None:
                t.delivered_by = attempt_id
            return
        if result == "published":
            t.status, t.has_work, t.delivered_by = D, False, attempt_id
        else:
            m.after_failure(t, result, spends=result == "permanent")

    @rule(
        pick=idents,
        raw=rarely,
        stale=st.integers(0, 5).map(lambda x: x == 0),
        times=st.sampled_from((1, 1, CONFIG.max_attempts)),
    )
    def claim_result(self, pick: int, raw: bool, stale: bool, times: int) -> None:
        """Permanent pre-send errors, sometimes several in a row (so the budget runs out)."""
        ident = self.target(pick, raw)
        for _ in range(times):
            t = self.model.timers.get(ident)
            generation, version = (t.generation, t.version) if t else (1, 1)
            version += 1 if stale else 0
            record = k.ClaimResult(MESSAGE_IDS[ident], generation, version, "c", "payload_missing")
            if t is None or stale or not t.has_work:
                want = k.Code.CLAIM_RESULT_STALE
            else:
                want = k.Code.CLAIM_RESULT_RECORDED
            self.apply(record, want)
            if want is k.Code.CLAIM_RESULT_RECORDED:
                assert t is not None
                t.version += 1
                self.model.after_failure(t, "claim_result", spends=True)

    @rule(
        pick=idents,
        raw=rarely,
        error_ms=errors_ms,
        shift_ms=shifts_ms,
        stale=st.integers(0, 5).map(lambda x: x == 0),
        when_due=rarely,
    )
    def expire(
        self, *, pick: int, raw: bool, error_ms: int, shift_ms: int, stale: bool, when_due: bool
    ) -> None:
        ident = self.target(pick, raw)
        m, t = self.model, self.model.timers.get(ident)
        if when_due and t is not None:
            m.now_ms = max(m.now_ms, t.expire_at_ms + error_ms)
        generation, version = (t.generation, t.version) if t else (1, 1)
        version += 1 if stale else 0
        center_ms = m.now_ms + shift_ms
        interval = k.TrustedInterval(center_ms - error_ms, center_ms + error_ms)
        record = k.Expire(MESSAGE_IDS[ident], generation, version, interval)
        if m.shard != "ACTIVE_FOR_COMMANDS":
            want = k.Code.SHARD_NOT_ACTIVE
        elif t is None or t.version != version or not armed(t):
            want = k.Code.EXPIRE_STALE
        elif interval.earliest_ms < t.expire_at_ms:
            want = k.Code.EXPIRE_EVIDENCE_INVALID
        elif m.now_ms < t.expire_at_ms:
            want = k.Code.EXPIRE_PREMATURE
        else:
            want = k.Code.EXPIRED if t.status is S else k.Code.RETRY_WINDOW_CLOSED
        self.apply(record, want)
        if want in (k.Code.EXPIRED, k.Code.RETRY_WINDOW_CLOSED):
            assert t is not None
            t.version, t.has_work = t.version + 1, False
            t.status = E if t.status is S else t.status

    @rule(
        pick=idents,
        generation_delta=st.sampled_from((0, 0, 0, -1, 1)),
        owed_first=mostly,
    )
    def copy_written(self, pick: int, generation_delta: int, owed_first: bool) -> None:
        """The runtime reports a dead-letter copy written: usually one that is owed, else
        any generation near an identity's current one (a duplicate, or never owed)."""
        m = self.model
        owed = [(i, g) for i, t in sorted(m.timers.items()) for g in sorted(t.copies_owed)]
        if owed_first and owed:
            ident, generation = owed[pick % len(owed)]
        else:
            ident = pick % self.spread
            t = m.timers.get(ident)
            generation = max((t.generation if t else 1) + generation_delta, 1)
        t = m.timers.get(ident)
        evidence = k.Evidence("default.dlq", 0, self.state.meta.position + 1, m.now_ms)
        record = k.DeadLetterWritten(MESSAGE_IDS[ident], generation, evidence)
        if t is None or generation not in t.copies_owed:
            self.apply(record, k.Code.DEAD_LETTER_NOT_PENDING)
            return
        self.apply(record, k.Code.DEAD_LETTER_RECORDED)
        t.copies_owed.discard(generation)
        if generation == t.generation:
            assert t.status is X
            t.version += 1
            t.copy_evidence = evidence

    @rule(lane=st.integers(0, len(LANES) - 1), closed=st.sampled_from((False, False, True)))
    def gate(self, lane: int, closed: bool) -> None:
        self.apply(k.LaneGate(*LANES[lane], "CLOSED" if closed else "OPEN"), k.Code.GATE_CHANGED)
        if closed:
            self.model.closed_lanes.add(LANES[lane])
        else:
            self.model.closed_lanes.discard(LANES[lane])

    @rule(state=st.sampled_from(("ACTIVE_FOR_COMMANDS",) * 4 + ("PAUSED", "FROZEN")))
    def shard(self, state: ShardStatus) -> None:
        self.apply(k.ShardState(state), k.Code.SHARD_STATE_CHANGED)
        self.model.shard = state

    @rule(
        ident=idents,
        to=st.sampled_from(
            ("plus",) * 4 + ("action_at", "action_at", "expire_before", "expire_at")
        ),
        delta_ms=st.sampled_from((1, 100, 1_000)) | st.integers(0, 3_000),
    )
    def advance_time(self, ident: int, to: str, delta_ms: int) -> None:
        ident %= self.spread
        m, t = self.model, self.model.timers.get(ident)
        target = m.now_ms + delta_ms
        if t is not None and to != "plus":
            target = {
                "action_at": t.action_at_ms,
                "expire_before": t.expire_at_ms - 1,
                "expire_at": t.expire_at_ms,
            }[to]
        m.now_ms = max(m.now_ms, target)

    # Invariants ----------------------------------------------------------------------------

    @invariant()
    def kernel_invariants_hold(self) -> None:
        k.assert_invariants(self.state)

    @invariant()
    def every_identity_matches_the_model(self) -> None:
        for ident, mid in enumerate(MESSAGE_IDS):
            message = self.state.message(mid.encode())
            t = self.model.timers.get(ident)
            if t is None:
                assert message is None
                continue
            assert message is not None
            got = (message.status, message.generation, message.version, message.txn)
            assert got == (t.status, t.generation, t.version, t.txn), ident
            assert (message.deliver_at_ms, message.expire_at_ms) == (
                t.deliver_at_ms,
                t.expire_at_ms,
            )
            assert message.has_work == t.has_work
            if t.has_work:
                assert message.action_at_ms == t.action_at_ms
            assert message.attempts_spent == t.attempts_spent
            assert message.uncertain_retries == t.uncertain_retries
            assert message.open_attempts == len(t.open)
            assert message.last_attempt_id == t.last_attempt
            assert message.dead_letter_evidence == t.copy_evidence

    @invariant()
    def the_owed_dead_letter_copies_match_the_model(self) -> None:
        rows = {
            key: value
            for key, value in self.state.items(k.Table.DEAD_LETTERS)
            if isinstance(value, k.DeadLetterPending)
        }
        expected = {
            k.dead_letter_key(MESSAGE_IDS[ident], generation)
            for ident, t in self.model.timers.items()
            for generation in t.copies_owed
        }
        assert set(rows) == expected
        assert self.state.meta.counters.dead_letters_pending == len(expected)

    @invariant()
    def the_attempt_ledger_matches_the_model(self) -> None:
        for attempt_id, a in self.model.attempts.items():
            got = self.state.attempt(attempt_id.encode())
            assert got is not None and (got.generation, got.status) == (a.generation, a.status)
            open_row = self.state.obligation(attempt_id.encode()) is not None
            assert open_row == (a.status in OPEN_ATTEMPT_STATUSES)
        assert self.state.meta.counters.attempts_publishing + sum(
            getattr(self.state.meta.counters, f"attempts_{s}")
            for s in ("published", "not_published", "unknown")
        ) == len(self.model.attempts)


def test_kernel_matches_the_naive_model() -> None:
    run_state_machine_as_test(
        KernelAgainstModel, settings=settings(props(300), stateful_step_count=50)
    )
