"""Properties for the rules that say "never".

Each rule is a checker run on every step of a history: (a) no publish without PUBLISHING,
(b) no publish outside [actionAt, expireAt) or before deliverAt allows, and never twice for
one attempt, (c) cancel versus Admission, (d) UNKNOWN is never resolved but by evidence,
(e) no expiry without proof or with an open attempt, (f) a rejected entry changes no row,
(g) no entry persisted before its predecessor is applied. One hypothesis test applies all
of them to generated histories (one generation, many checks); the directed tests below
reach the deep cases on purpose and apply them too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, get_args

from hypothesis import assume, example, given
from hypothesis import strategies as st

from nereus import kernel as k
from nereus.kernel.effects import DeadLetter, Publish, RevokeClaim, TimelinePut, TimelineRemove
from nereus.kernel.keys import lane_id, str_key
from nereus.kernel.model import LIVE_STATUSES, TABLES, AttemptStatus, Status, Table
from nereus.kernel.state import State
from tests.support.strategies import (
    IDENTITIES,
    MESSAGE_IDS,
    Action,
    At,
    DoAdmit,
    DoClaimResult,
    DoSchedule,
    Driver,
    IntervalSpec,
    StepRecord,
    TimingSpec,
    action_lists,
    capability_of,
    deliver_action_at_ms,
    drive,
    props,
)

# Verdicts about the entry's place in the log rather than its content.
LOG_STRUCTURE_CODES = frozenset(
    {k.Code.POSITION_GAP, k.Code.POSITION_DUPLICATE, k.Code.PERSISTED_AT_REGRESSED}
)
CANCEL_PRECONDITION_CODES = LOG_STRUCTURE_CODES | {k.Code.VERSION_MISMATCH, k.Code.SHARD_NOT_ACTIVE}


def _lane_closed(state: State, message: k.Message) -> bool:
    lane = state.lane(str_key(lane_id(message.tenant, message.queue)))
    return lane is not None and lane.gate == "CLOSED"


def _obligations_of(state: State, message_id: str) -> list[str]:
    return [
        key.decode()
        for key, ob in state.items(Table.OBLIGATIONS)
        if isinstance(ob, k.Obligation) and ob.message_id == message_id
    ]


def _published_before(step: StepRecord, p: Publish) -> k.Message:
    message = step.before.message(p.message_id.encode())
    assert message is not None, f"publish for a message that did not exist: {p}"
    return message


# (a) no publish without PUBLISHING --------------------------------------------------------


def check_a_publish_only_after_publishing(step: StepRecord) -> None:
    """Every Publish names an attempt that this very step made PUBLISHING (with its open
    obligation) and whose message is PUBLISHING in the state the step returns."""
    assert len(step.publishes) <= 1
    for p in step.publishes:
        assert step.outcome.applied and step.outcome.code is k.Code.ADMITTED
        assert step.outcome.attempt_id == p.attempt_id
        assert step.before.attempt(p.attempt_id.encode()) is None
        attempt = step.after.attempt(p.attempt_id.encode())
        assert attempt is not None and attempt.status is AttemptStatus.PUBLISHING
        assert (attempt.message_id, attempt.generation) == (p.message_id, p.generation)
        message = step.after.message(p.message_id.encode())
        assert message is not None and message.status is Status.PUBLISHING
        assert message.generation == p.generation and message.last_attempt_id == p.attempt_id
        assert step.after.obligation(p.attempt_id.encode()) is not None


# (b) never outside [actionAt, expireAt), never before deliverAt, never twice ------------


def check_b_publish_only_inside_the_window(step: StepRecord, published: set[str]) -> None:
    bp_ms = step.entry.persisted_at_ms
    for p in step.publishes:
        message = _published_before(step, p)
        # Pending, or UNCERTAIN with its bounded retry armed (specs/README.md).
        assert message.status in (Status.SCHEDULED, Status.UNCERTAIN) and message.has_work
        assert message.action_at_ms <= bp_ms < message.expire_at_ms
        record = step.entry.record
        assert isinstance(record, k.PublishAdmission) and record.capacity.granted
        decision = k.decide(record.interval, message.action_at_ms, message.expire_at_ms)
        assert decision is k.Decision.ADMIT
        assert step.before.meta.shard_status == "ACTIVE_FOR_COMMANDS"
        assert not _lane_closed(step.before, message)
        assert p.visible_at_ms >= p.deliver_at_ms == message.deliver_at_ms
        # "Never before deliverAt", restated from deliverAt itself rather than from the
        # derived, mutable actionAt: a handoff lead is made up by the target's reveal time.
        assert bp_ms >= deliver_action_at_ms(message), (
            f"published at {bp_ms}, deliverAt {message.deliver_at_ms}"
        )
        assert p.attempt_id not in published, f"attempt {p.attempt_id} published twice"
        published.add(p.attempt_id)


# (c) cancel versus Admission --------------------------------------------------------------


@dataclass
class Crossing:
    """What the log says about one message's current generation, tracked from outcomes
    alone: the attempts that won Admission and what became of each."""

    generation: int | None = None
    attempts: dict[str, AttemptStatus] = field(default_factory=dict)
    last: str | None = None
    delivered: str | None = None  # the first attempt of the generation proven PUBLISHED

    def named(self) -> str | None:
        """The attempt a too_late names: the one proven delivered, else the latest admitted."""
        return self.delivered or self.last

    def crossed(self) -> bool:
        """ARCHITECTURE decision 1: too_late means the current generation has crossed
        Admission (an attempt PUBLISHING, PUBLISHED or UNKNOWN)."""
        return any(s is not AttemptStatus.NOT_PUBLISHED for s in self.attempts.values())

    def observe(self, step: StepRecord) -> None:
        out, record = step.outcome, step.entry.record
        if out.code in (k.Code.SCHEDULED, k.Code.RESCHEDULED):
            self.generation, self.attempts = out.generation, {}
            self.last = self.delivered = None
        elif out.code is k.Code.ADMITTED and out.attempt_id is not None:
            self.attempts[out.attempt_id] = AttemptStatus.PUBLISHING
            self.last = out.attempt_id
        elif (
            out.code is k.Code.OUTCOME_RECORDED
            and isinstance(record, k.PublishOutcome)
            and record.generation == self.generation
        ):
            self.attempts[record.attempt_id] = {
                k.Published: AttemptStatus.PUBLISHED,
                k.NotPublished: AttemptStatus.NOT_PUBLISHED,
                k.Unknown: AttemptStatus.UNKNOWN,
            }[type(record.result)]
            if isinstance(record.result, k.Published) and self.delivered is None:
                self.delivered = record.attempt_id


def check_c_cancel_verdict(step: StepRecord, crossing: Crossing) -> None:
    """A cancel that passes its preconditions is too_late exactly when its generation has
    crossed Admission, naming the latest attempt that did; otherwise it wins or is absent."""
    out = step.outcome
    if out.code in CANCEL_PRECONDITION_CODES:
        return
    if crossing.crossed():
        assert out.code is k.Code.TOO_LATE and not out.applied, out
        assert out.attempt_id == crossing.named()
    else:
        assert out.code in (k.Code.CANCELED, k.Code.ABSENT), out


# (d) UNKNOWN stays an obligation until PUBLISHED ------------------------------------------


def check_d_unknown_waits_for_evidence(step: StepRecord) -> None:
    record = step.entry.record
    for _, before in step.before.items(Table.ATTEMPTS):
        if not isinstance(before, k.Attempt) or before.status is not AttemptStatus.UNKNOWN:
            continue
        key = before.attempt_id.encode()
        after = step.after.attempt(key)
        assert after is not None
        if after.status is AttemptStatus.UNKNOWN:
            assert step.after.obligation(key) is not None
        else:
            assert after.status is AttemptStatus.PUBLISHED, f"UNKNOWN became {after.status}"
            assert isinstance(record, k.PublishOutcome) and record.attempt_id == before.attempt_id
            assert isinstance(record.result, k.Published)
            assert step.after.obligation(key) is None
        if (
            isinstance(record, k.PublishOutcome)
            and isinstance(record.result, k.NotPublished)
            and (record.attempt_id, record.generation) == (before.attempt_id, before.generation)
            and step.outcome.code not in LOG_STRUCTURE_CODES
        ):
            assert step.outcome.code is k.Code.OUTCOME_ABSENCE_NOT_EVIDENCE


# (d') absence after the fact only under the attempt's own fence ----------------------------


def check_d_absence_only_with_its_fence(step: StepRecord) -> None:
    """A NOT_PUBLISHED outcome carrying a proof of absence is recorded only for a PUBLISHING
    attempt sent under a fence, and only when the proof names that very fence."""
    record, out = step.entry.record, step.outcome
    if not (
        isinstance(record, k.PublishOutcome)
        and isinstance(record.result, k.NotPublished)
        and record.result.proof is not None
    ):
        return
    before = step.before.attempt(record.attempt_id.encode())
    if out.code is k.Code.OUTCOME_RECORDED:
        assert before is not None and before.status is AttemptStatus.PUBLISHING
        assert before.fence_id is not None
        assert before.fence_id == record.result.proof.fence_id
    elif (
        before is not None
        and before.status is AttemptStatus.PUBLISHING
        and (before.message_id, before.generation) == (record.message_id, record.generation)
        and before.fence_id != record.result.proof.fence_id
        and out.code not in LOG_STRUCTURE_CODES
    ):
        assert out.code is k.Code.OUTCOME_PROOF_INVALID, out


# (e) expiry only when proven and nothing is admitted --------------------------------------


def check_e_expiry_only_when_proven(step: StepRecord) -> None:
    record, code = step.entry.record, step.outcome.code
    became_expired = [
        mid
        for mid in MESSAGE_IDS
        if (after := step.after.message(mid.encode())) is not None
        and after.status is Status.EXPIRED
        and (
            (before := step.before.message(mid.encode())) is None
            or before.status is not Status.EXPIRED
            or before.generation != after.generation
        )
    ]
    if code not in (k.Code.EXPIRED, k.Code.RETRY_WINDOW_CLOSED):
        assert became_expired == []
        return
    assert isinstance(record, k.Expire)
    before = step.before.message(record.message_id.encode())
    after = step.after.message(record.message_id.encode())
    assert before is not None and after is not None
    assert step.entry.persisted_at_ms >= before.expire_at_ms
    assert record.interval.earliest_ms >= before.expire_at_ms
    assert step.before.meta.shard_status == "ACTIVE_FOR_COMMANDS"
    if code is k.Code.RETRY_WINDOW_CLOSED:
        # The same proof on an UNCERTAIN message only disarms its retry.
        assert before.status is after.status is Status.UNCERTAIN and not after.has_work
        assert became_expired == []
        return
    assert became_expired == [record.message_id] and before.status is Status.SCHEDULED
    # Nothing of this generation is open; an older generation's obligation (left by a
    # schedule that superseded a finished message) is untouched by the expiry.
    older = _obligations_of(step.before, record.message_id)
    for aid in older:
        attempt = step.before.attempt(aid.encode())
        assert attempt is not None and attempt.generation != before.generation
    assert _obligations_of(step.after, record.message_id) == older


# (f) a rejected entry changes no row ------------------------------------------------------


def check_f_rejected_entry_changes_no_row(step: StepRecord) -> None:
    out = step.outcome
    if out.applied and out.code is not k.Code.UNCHANGED:
        return
    for table in TABLES:
        assert list(step.after.items(table)) == list(step.before.items(table)), table
    assert step.after.meta.counters == step.before.meta.counters
    assert step.after.meta.shard_status == step.before.meta.shard_status
    assert not any(
        isinstance(e, Publish | TimelinePut | TimelineRemove | DeadLetter) for e in step.effects
    )
    if out.code in (k.Code.POSITION_GAP, k.Code.POSITION_DUPLICATE):
        assert step.after.meta == step.before.meta
    else:
        assert step.after.meta.position == step.before.meta.position + 1


# (g) time never runs backwards ------------------------------------------------------------


def check_g_time_never_runs_backwards(step: StepRecord) -> None:
    """An entry persisted before its predecessor is never applied (so no decision can rest
    on a clock that went back), and the shard's persistence time never decreases."""
    if step.entry.persisted_at_ms < step.before.meta.last_persisted_at_ms:
        assert not step.outcome.applied
        assert step.outcome.code in LOG_STRUCTURE_CODES
    assert step.after.meta.last_persisted_at_ms >= step.before.meta.last_persisted_at_ms


# All of them over a history ---------------------------------------------------------------


@dataclass
class NeverRules:
    """Runs every checker on each step, with the little history some of them need."""

    published: set[str] = field(default_factory=set)
    canceled: set[tuple[str, int]] = field(default_factory=set)
    crossings: dict[str, Crossing] = field(default_factory=dict)

    def check(self, step: StepRecord) -> None:
        out, record = step.outcome, step.entry.record
        check_a_publish_only_after_publishing(step)
        check_b_publish_only_inside_the_window(step, self.published)
        for p in step.publishes:  # (c) a canceled generation is never published
            assert (p.message_id, p.generation) not in self.canceled
        if out.code is k.Code.CANCELED:
            assert out.message_id is not None and out.generation is not None
            self.canceled.add((out.message_id, out.generation))
        if isinstance(record, k.Cancel):
            mid = k.message_id(record.tenant, record.queue, record.timer_key)
            check_c_cancel_verdict(step, self.crossings.setdefault(mid, Crossing()))
        elif out.message_id is not None:
            self.crossings.setdefault(out.message_id, Crossing()).observe(step)
        check_d_unknown_waits_for_evidence(step)
        check_d_absence_only_with_its_fence(step)
        check_e_expiry_only_when_proven(step)
        check_f_rejected_entry_changes_no_row(step)
        check_g_time_never_runs_backwards(step)

    def check_all(self, driver: Driver) -> None:
        for step in driver.steps:
            self.check(step)


# A regression example for a bug of the first kernel (0deec3d), fixed in 97f8d5d ("retry
# floor at first actionAt"): a permanent pre-send error recorded while the timer was not yet
# due (bp < actionAt) set actionAt = bp + backoff, far before deliverAt, and an Admission
# persisted at that new actionAt was accepted and published ~10 s early.
CLAIM_RESULT_BEFORE_DUE: list[Action] = [
    DoSchedule(At(), 0, TimingSpec("delay", 10_000)),
    DoClaimResult(At(), 0),
    DoAdmit(At("action_at"), 0, "current", IntervalSpec("bp", "bp", 0)),
]


@props(200)
@example(actions=CLAIM_RESULT_BEFORE_DUE)
@given(action_lists())
def test_no_never_rule_breaks_in_any_history(actions: list[Action]) -> None:
    NeverRules().check_all(drive(actions))


# Directed scenarios -----------------------------------------------------------------------


def pending_ident(driver: Driver, pick: int) -> int:
    """An identity whose timer is SCHEDULED and still admissible now, with shard and lane
    open, scheduling a fresh one when the generated prefix left none."""
    if driver.state.meta.shard_status != "ACTIVE_FOR_COMMANDS":
        driver.append(k.ShardState("ACTIVE_FOR_COMMANDS"))

    def admissible(i: int) -> bool:
        m = driver.message(i)
        return (
            m is not None
            and m.status is Status.SCHEDULED
            and max(driver.now_ms, m.action_at_ms) < m.expire_at_ms
        )

    candidates = [i for i in range(len(IDENTITIES)) if admissible(i)]
    if not candidates:
        free = [
            i
            for i in range(len(IDENTITIES))
            if (m := driver.message(i)) is None or m.status not in LIVE_STATUSES
        ]
        assume(free)
        tenant, queue, key = IDENTITIES[free[0]]
        schedule = k.Schedule(
            tenant, queue, key, "txn-fresh", "0" * 64, 1, delay_ms=500,
            capability=capability_of(free[0]),
        )  # fmt: skip
        assert driver.append(schedule).outcome.code is k.Code.SCHEDULED
        candidates = free[:1]
    ident = candidates[pick % len(candidates)]
    driver.append(k.LaneGate(*IDENTITIES[ident][:2], "OPEN"))
    return ident


@props(100)
@given(action_lists(max_size=30), st.data())
def test_cancel_or_reschedule_ordered_before_the_admission_wins(
    actions: list[Action], data: st.DataObject
) -> None:
    driver = drive(actions)
    ident = pending_ident(driver, data.draw(st.integers(0, 11), label="pick"))
    message = driver.message(ident)
    assert message is not None
    # A worker claims the generation exactly at actionAt and prepares its Admission ...
    claimed = driver.fresh_admission(
        ident, k.TrustedInterval(message.action_at_ms, message.action_at_ms)
    )
    # ... but a command is ordered first, at any time up to that actionAt.
    at_ms = data.draw(st.integers(driver.now_ms, max(driver.now_ms, message.action_at_ms)))
    tenant, queue, key = IDENTITIES[ident]
    if data.draw(st.booleans(), label="cancel"):
        command: k.Record = k.Cancel(tenant, queue, key)
        wins = k.Code.CANCELED
    else:
        command = k.Reschedule(tenant, queue, key, "txn-moved", delay_ms=2_000)
        wins = k.Code.RESCHEDULED
    first = driver.append(command, at_ms=at_ms)
    assert first.outcome.code is wins
    assert RevokeClaim(message.message_id, message.generation, wins) in first.effects
    admission = driver.append(claimed, at_ms=max(driver.now_ms, message.action_at_ms))
    assert admission.outcome.code is k.Code.ADMISSION_STALE
    assert admission.publishes == []
    assert admission.after.attempt(claimed.attempt_id.encode()) is None
    after = driver.message(ident)
    assert after is not None and after.status in (Status.CANCELED, Status.SCHEDULED)
    assert after.version == first.outcome.version
    NeverRules().check_all(driver)


Report = Literal["unknown", "published", "retry"]
# (what, which admitted attempt it is about, how much later in ms)
reports = st.lists(
    st.tuples(
        st.sampled_from(get_args(Report)),
        st.integers(0, 3),
        st.sampled_from((0, 100, 1_000)) | st.integers(0, 5_000),
    ),
    max_size=6,
)


@props(100)
# The deep case: UNKNOWN, an armed retry wins, the first attempt is found delivered, then
# the retry (still in flight when that happened) reports UNKNOWN: the ledger only.
@example(
    actions=[],
    pick=0,
    reports=[("unknown", 0, 0), ("retry", 0, 0), ("published", 0, 0), ("unknown", 1, 0)],
)
@given(action_lists(max_size=30), st.integers(0, 11), reports)
def test_cancel_after_a_winning_admission_is_too_late_with_its_attempt(
    actions: list[Action], pick: int, reports: list[tuple[Report, int, int]]
) -> None:
    """After Admission, whatever the destination reports short of a definite NOT_PUBLISHED
    (UNKNOWN, PUBLISHED, an armed retry of an UNKNOWN one, in any order), a later cancel
    answers too_late, naming the attempt that delivered it, else the latest admitted."""
    driver = drive(actions)
    ident = pending_ident(driver, pick)
    message = driver.message(ident)
    assert message is not None
    at_ms = max(driver.now_ms, message.action_at_ms)
    first = driver.fresh_admission(ident, k.TrustedInterval(at_ms, at_ms))
    admitted = driver.append(first, at_ms=at_ms)
    assert admitted.outcome.code is k.Code.ADMITTED and len(admitted.publishes) == 1
    attempts, delivered_by = [first.attempt_id], None
    mid, generation = first.message_id, first.generation
    for report, about, later_ms in reports:
        current = driver.message(ident)
        assert current is not None
        at_ms = driver.now_ms + later_ms
        if report == "retry":
            if current.has_work:
                at_ms = max(at_ms, current.action_at_ms)
                retry = driver.fresh_admission(ident, k.TrustedInterval(at_ms, at_ms))
                if driver.append(retry, at_ms=at_ms).outcome.code is k.Code.ADMITTED:
                    attempts.append(retry.attempt_id)
            continue
        attempt_id = attempts[about % len(attempts)]
        result: k.Unknown | k.Published = (
            k.Unknown("timeout")
            if report == "unknown"
            else k.Published(k.Evidence("default", 0, len(driver.steps), at_ms))
        )
        step = driver.append(k.PublishOutcome(attempt_id, mid, generation, result), at_ms=at_ms)
        after = driver.message(ident)
        assert after is not None
        if delivered_by is None and after.status is Status.DELIVERED:
            assert step.outcome.code is k.Code.OUTCOME_RECORDED
            delivered_by = attempt_id
    tenant, queue, key = IDENTITIES[ident]
    before = driver.message(ident)
    assert before is not None
    cancel = driver.append(k.Cancel(tenant, queue, key), at_ms=driver.now_ms + 60_000)
    assert cancel.outcome.code is k.Code.TOO_LATE and not cancel.outcome.applied
    assert cancel.outcome.attempt_id == (delivered_by or attempts[-1])
    assert driver.message(ident) == before
    if before.status is Status.DELIVERED:
        named = driver.state.attempt((delivered_by or "").encode())
        assert named is not None and cancel.outcome.evidence == named.evidence is not None
    NeverRules().check_all(driver)


RESULTS: list[k.Published | k.NotPublished | k.Unknown] = [
    k.NotPublished("retriable", "broker_down"),
    k.NotPublished("permanent", "record_too_large"),
    k.NotPublished("lane_unavailable", "lane_closed"),
    k.Unknown("timeout"),
    k.Unknown("owner_fenced"),
    k.Published(k.Evidence("default", 0, 42, 0)),
]
Event = Literal["report_unknown", "retry", "report_retry", "claim_result", "expire", "wait"]
# (what, which report (an index into RESULTS), how much later in ms)
events = st.lists(
    st.tuples(
        st.sampled_from(get_args(Event)),
        st.integers(0, len(RESULTS) - 1),
        st.sampled_from((0, 100, 1_000)) | st.integers(0, 20_000),
    ),
    max_size=12,
)
UNKNOWN_AGAIN = 3  # RESULTS[3] is Unknown("timeout")


@props(100)
# Every armed retry wins and goes UNKNOWN again, until the retries are used up.
@example(
    actions=[],
    pick=0,
    events=[("retry", 0, 0), ("report_retry", UNKNOWN_AGAIN, 0)] * 5 + [("retry", 0, 0)],
)
@given(action_lists(max_size=30), st.integers(0, 11), events)
def test_an_unknown_attempt_waits_for_positive_evidence(
    actions: list[Action], pick: int, events: list[tuple[Event, int, int]]
) -> None:
    """After an attempt goes UNKNOWN, whatever follows (more reports about it, bounded
    retries and their outcomes, claim results, expiry proofs, time) it stays an open
    obligation until a PUBLISHED report for it, and its generation never looks pending."""
    driver = drive(actions)
    ident = pending_ident(driver, pick)
    message = driver.message(ident)
    assert message is not None
    at_ms = max(driver.now_ms, message.action_at_ms)
    record = driver.fresh_admission(ident, k.TrustedInterval(at_ms, at_ms))
    assert driver.append(record, at_ms=at_ms).outcome.code is k.Code.ADMITTED
    mid, generation, key = record.message_id, record.generation, record.attempt_id.encode()
    unknown = k.PublishOutcome(record.attempt_id, mid, generation, k.Unknown("timeout"))
    assert driver.append(unknown).outcome.code is k.Code.OUTCOME_RECORDED
    retries: list[str] = []
    for event, which, later_ms in events:
        current = driver.message(ident)
        assert current is not None
        at_ms = driver.now_ms + later_ms
        if event == "report_unknown":
            outcome = k.PublishOutcome(record.attempt_id, mid, generation, RESULTS[which])
            driver.append(outcome, at_ms=at_ms)
        elif event == "retry" and current.has_work:
            at_ms = max(at_ms, current.action_at_ms)
            retry = driver.fresh_admission(ident, k.TrustedInterval(at_ms, at_ms))
            if driver.append(retry, at_ms=at_ms).outcome.code is k.Code.ADMITTED:
                retries.append(retry.attempt_id)
        elif event == "report_retry" and retries:
            outcome = k.PublishOutcome(retries[-1], mid, generation, RESULTS[which])
            driver.append(outcome, at_ms=at_ms)
        elif event == "claim_result":
            claim = k.ClaimResult(mid, generation, current.version, "c", "payload_missing")
            driver.append(claim, at_ms=max(at_ms, current.action_at_ms))
        elif event == "expire":
            at_ms = max(at_ms, current.expire_at_ms)
            interval = k.TrustedInterval(at_ms, at_ms)
            driver.append(k.Expire(mid, generation, current.version, interval), at_ms=at_ms)
        else:
            driver.now_ms = at_ms
        attempt = driver.state.attempt(key)
        after = driver.message(ident)
        assert attempt is not None and after is not None and after.generation == generation
        if attempt.status is AttemptStatus.PUBLISHED:
            assert driver.state.obligation(key) is None
            assert after.status in (Status.DELIVERED, Status.DEAD_LETTERED)
            break
        assert attempt.status is AttemptStatus.UNKNOWN
        assert driver.state.obligation(key) is not None
        assert after.status in (
            Status.UNCERTAIN,
            Status.PUBLISHING,
            Status.DELIVERED,
            Status.DEAD_LETTERED,
        )
        # Retries are bounded: once used up, an UNCERTAIN message waits for evidence.
        assert after.uncertain_retries == len(retries) <= driver.config.max_uncertain_retries
        if after.status is Status.UNCERTAIN and len(retries) == driver.config.max_uncertain_retries:
            assert not after.has_work
    NeverRules().check_all(driver)


EDGE_MS = st.sampled_from((-2, -1, 0, 1)) | st.integers(-5_000, 5_000)


@given(bp_ms=EDGE_MS, earliest_ms=EDGE_MS, width_ms=st.sampled_from((0, 1, 10)))
def test_an_expiry_needs_both_its_evidence_and_its_persistence_time_at_expire_at(
    bp_ms: int, earliest_ms: int, width_ms: int
) -> None:
    """A pending timer is EXPIRED by an Expire only when the worker's evidence (the
    interval's earliest end) and the log's own persistence time both reached expireAt: either
    one a millisecond short (the log's clock behind the worker's, or the other way round)
    leaves it pending. Offsets are from expireAt."""
    driver = drive([DoSchedule(At(), 0)])
    message = driver.message(0)
    assert message is not None and message.status is Status.SCHEDULED
    expire_at_ms = message.expire_at_ms
    earliest = expire_at_ms + earliest_ms
    expiry = k.Expire(
        message.message_id,
        message.generation,
        message.version,
        k.TrustedInterval(earliest, earliest + width_ms),
    )
    step = driver.append(expiry, at_ms=max(driver.now_ms, expire_at_ms + bp_ms))
    proven = earliest >= expire_at_ms and step.entry.persisted_at_ms >= expire_at_ms
    after = driver.message(0)
    assert after is not None
    assert (after.status is Status.EXPIRED) == proven, (step.outcome.code, bp_ms, earliest_ms)
    NeverRules().check_all(driver)


def test_cancel_of_a_dead_letter_with_an_unknown_attempt_is_too_late() -> None:
    """A generation whose first attempt went UNKNOWN and whose budget was then spent by
    claim results is DEAD_LETTERED, but the unknown attempt may be at the destination: the
    generation has crossed Admission, so cancel and reschedule answer too_late, not absent.
    (A regression test for the bug fixed in 9efd00e.)"""
    driver, unknown_id = dead_lettered_behind_unknown()
    cancel = driver.append(k.Cancel(*IDENTITIES[0]))
    assert cancel.outcome.code is k.Code.TOO_LATE
    assert cancel.outcome.attempt_id == unknown_id
    reschedule = driver.append(k.Reschedule(*IDENTITIES[0], "r", delay_ms=10))
    assert reschedule.outcome.code is k.Code.TOO_LATE
    NeverRules().check_all(driver)


def test_cancel_of_a_dead_letter_later_proven_published_is_too_late() -> None:
    """The same generation once the unknown attempt is found at the destination: it has
    crossed Admission and landed, so a cancel is too_late and carries the evidence.
    (A regression test for the bug fixed in 5907bc3.)"""
    driver, unknown_id = dead_lettered_behind_unknown()
    evidence = k.Evidence("default", 0, 5, driver.now_ms)
    found = k.PublishOutcome(unknown_id, MESSAGE_IDS[0], 1, k.Published(evidence))
    assert driver.append(found).outcome.code is k.Code.OUTCOME_RECORDED
    cancel = driver.append(k.Cancel(*IDENTITIES[0]))
    assert cancel.outcome.code is k.Code.TOO_LATE
    assert cancel.outcome.attempt_id == unknown_id
    assert cancel.outcome.evidence == evidence
    reschedule = driver.append(k.Reschedule(*IDENTITIES[0], "r", delay_ms=10))
    assert reschedule.outcome.code is k.Code.TOO_LATE
    NeverRules().check_all(driver)


def dead_lettered_behind_unknown() -> tuple[Driver, str]:
    """Schedule, admit, UNKNOWN, then claim results until the budget is spent."""
    driver = drive([DoSchedule(At(), 0), DoAdmit(At(), 0, "worker")])
    unknown_id = driver.admitted[-1]
    message = driver.message(0)
    assert message is not None and message.status is Status.PUBLISHING
    driver.append(k.PublishOutcome(unknown_id, message.message_id, 1, k.Unknown("timeout")))
    # Each claim result spends one attempt: the budget ends the loop (bounded, so a kernel
    # that never dead-letters fails here instead of looping).
    for _ in range(driver.config.max_attempts + 1):
        m = driver.message(0)
        if m is None or m.status is not Status.UNCERTAIN:
            break
        claim = k.ClaimResult(m.message_id, m.generation, m.version, "c", "payload_missing")
        assert driver.append(claim, at_ms=m.action_at_ms).outcome.applied
    m = driver.message(0)
    assert m is not None and m.status is Status.DEAD_LETTERED
    attempt = driver.state.attempt(unknown_id.encode())
    assert attempt is not None and attempt.status is AttemptStatus.UNKNOWN
    return driver, unknown_id
