"""One table row per outcome code: the minimal log that produces it, ending in the code.

Every row starts from an empty shard, applies its setup through the `Shard` harness (which
checks the invariants after each step), then reduces one final entry by hand so a row can
also place it at a wrong position or time. The generic test checks what no rejection may
do: change a table row or any meta field but the position (and the last persistence time,
unless that time is out of range), emit a Publish, or revoke any claim but the rejected
Admission's own; and, for every row, that an UNKNOWN attempt stays an open obligation unless
this very entry is its positive evidence. Rows add checks where a code carries more than a
verdict (too_late's attempt id, an Admission's Publish, a retry's timeline key, the boundary
a timing row sits on).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import msgspec
import pytest

from nereus import kernel as k
from nereus.kernel.codes import APPLIED_CODES, CODE_DOCS, POSITION_CODES, Code
from nereus.kernel.effects import (
    DeadLetter,
    Effect,
    EntryOutcome,
    Publish,
    RevokeClaim,
    TimelinePut,
    TimelineRemove,
)
from nereus.kernel.model import Table
from nereus.kernel.records import record_type
from nereus.kernel.validation import action_at
from tests.support.builders import (
    DIGEST,
    FENCE,
    QUEUE,
    T0_MS,
    TENANT,
    Shard,
    expiry_proof,
    interval_at,
    mid,
    not_published,
    obligations,
    proven_absent,
    published,
    schedule,
    tables,
    unknown,
)

CONFIG = k.KernelConfig()
WINDOW_MS = CONFIG.limits.min_delivery_window_ms
HORIZON_MS = CONFIG.limits.max_delay_horizon_ms
LIFETIME_MS = CONFIG.limits.max_message_lifetime_ms
# A timer with a one-window life: due at ACTION_MS, expired from EXPIRE_MS.
ACTION_MS = T0_MS + 1_000
EXPIRE_MS = ACTION_MS + WINDOW_MS
SHORT = schedule(delay_ms=1_000, expire_at_ms=EXPIRE_MS)
RELATIVE_SHORT = schedule(delay_ms=1_000, lifetime_ms=1_000 + WINDOW_MS)  # SHORT, as sent at T0
HANDOFF = k.Capability("delayed_handoff", lead_ms=500, clock_ahead_bound_ms=200)
# Instants and durations in records, and persistence times, lie in [0, 2^53). Written out
# rather than imported from kernel.timing, so the table is an independent oracle.
TOO_BIG = 2**53
# UNKNOWN at bp arms the first retry at bp + base backoff, if that is before expireAt;
# `uncertain()` admits at actionAt + 10 and records UNKNOWN at once.
BACKOFF_MS = CONFIG.backoff_base_ms
RETRY_MS = ACTION_MS + 10 + BACKOFF_MS
NO_RETRIES = k.KernelConfig(max_uncertain_retries=0)
ONE_RETRY = k.KernelConfig(max_uncertain_retries=1)
ONE_ATTEMPT = k.KernelConfig(max_attempts=1)
# The smallest lifetime the limits allow: a timer at the horizon keeps exactly one window.
TIGHT = k.KernelConfig(
    limits=k.TimingLimits(
        min_delivery_window_ms=WINDOW_MS,
        max_delay_horizon_ms=HORIZON_MS,
        max_message_lifetime_ms=HORIZON_MS + WINDOW_MS,
    )
)

# Written out rather than imported, so the table is an independent oracle.
APPLIED = frozenset(
    {
        Code.SCHEDULED,
        Code.RESCHEDULED,
        Code.UNCHANGED,
        Code.CANCELED,
        Code.ADMITTED,
        Code.OUTCOME_RECORDED,
        Code.CLAIM_RESULT_RECORDED,
        Code.DEAD_LETTER_RECORDED,
        Code.EXPIRED,
        Code.RETRY_WINDOW_CLOSED,
        Code.GATE_CHANGED,
        Code.SHARD_STATE_CHANGED,
    }
)
POSITION = frozenset({Code.POSITION_DUPLICATE, Code.POSITION_GAP})
# Codes that were in the list once and must not come back under another meaning.
REMOVED = frozenset({"admission_budget_spent"})

PublishResult = k.Published | k.NotPublished | k.Unknown


@dataclass(frozen=True)
class Result:
    before: k.State
    after: k.State
    entry: k.LogEntry
    effects: tuple[Effect, ...]

    @property
    def outcome(self) -> EntryOutcome:
        first = self.effects[0]
        assert isinstance(first, EntryOutcome)
        return first

    def message(self, state: k.State | None = None, key: str = "k1") -> k.Message:
        found = (state or self.after).message(mid(key).encode())
        assert found is not None
        return found

    def attempt(self, attempt_id: str, state: k.State | None = None) -> k.Attempt:
        found = (state or self.after).attempt(attempt_id.encode())
        assert found is not None
        return found


Build = Callable[[Shard], k.Record]
Check = Callable[[Result], None]


@dataclass(frozen=True)
class Row:
    name: str
    build: Build
    code: Code
    check: Check | None = None
    config: k.KernelConfig = CONFIG
    offset: int = 1  # the final entry's position relative to the applied position
    bug: str | None = None  # a known kernel bug: the row is a strict xfail


# Builders ---------------------------------------------------------------------------------


def cancel(key: str = "k1", *, version: int | None = None, tenant: str = TENANT) -> k.Cancel:
    return k.Cancel(tenant, QUEUE, key, expected_version=version)


def reschedule(
    *,
    txn: str = "txn-r1",
    delay_ms: int | None = 5_000,
    tenant: str = TENANT,
    version: int | None = None,
    deliver_at_ms: int | None = None,
) -> k.Reschedule:
    if deliver_at_ms is not None:
        delay_ms = None
    return k.Reschedule(
        tenant,
        QUEUE,
        "k1",
        txn,
        deliver_at_ms=deliver_at_ms,
        delay_ms=delay_ms,
        expected_version=version,
    )


def claim(m: k.Message, *, version_delta: int = 0) -> k.ClaimResult:
    return k.ClaimResult(m.message_id, m.generation, m.version + version_delta, "c-9", "gone")


def ok(outcome: EntryOutcome) -> None:
    assert outcome.applied, outcome


def current(s: Shard) -> k.Message:
    found = s.message()
    assert found is not None
    return found


def scheduled(s: Shard, record: k.Schedule | None = None) -> k.Message:
    record = record or schedule()
    ok(s.apply(record))
    found = s.message(record.timer_key)
    assert found is not None
    return found


def uncertain(s: Shard, record: k.Schedule | None = None) -> str:
    """Schedule, admit and record UNKNOWN: the message is UNCERTAIN. Returns the attempt."""
    scheduled(s, record)
    aid = s.admit()
    ok(s.apply(s.outcome(aid, unknown())))
    return aid


def dlq_evidence(offset: int = 0) -> k.Evidence:
    return k.Evidence(f"{QUEUE}.dlq", 0, offset, T0_MS)


def copy_written(*, generation: int | None = None, offset: int = 0) -> Build:
    """DEAD_LETTER_WRITTEN_V1 for k1's current generation (or `generation`)."""

    def make(s: Shard) -> k.Record:
        m = current(s)
        return k.DeadLetterWritten(m.message_id, generation or m.generation, dlq_evidence(offset))

    return make


def dead_lettered(*then: k.Record | Build, last: Build) -> Build:
    """k1 scheduled and dead-lettered by a pre-send error (the row needs ONE_ATTEMPT); then
    each of `then` applied (a Build is called for its record first), then `last` built."""

    def build(s: Shard) -> k.Record:
        scheduled(s, schedule(delay_ms=0))
        ok(s.apply(claim(current(s))))
        assert current(s).status is k.Status.DEAD_LETTERED
        for step in then:
            ok(s.apply(step if isinstance(step, msgspec.Struct) else step(s)))
        return last(s)

    return build


def given(*records: k.Record, then: Build) -> Build:
    """Apply `records` (each must be applied), then build the row's entry."""

    def build(s: Shard) -> k.Record:
        for record in records:
            ok(s.apply(record))
        return then(s)

    return build


def on_scheduled(
    make: Callable[[Shard, k.Message], k.Record], record: k.Schedule | None = None
) -> Build:
    return lambda s: make(s, scheduled(s, record))


def on_results(
    results: tuple[PublishResult, ...],
    make: Callable[[Shard, str], k.Record],
    record: k.Schedule | None = None,
) -> Build:
    """Schedule, admit, record `results` against the attempt, then build with its id."""

    def build(s: Shard) -> k.Record:
        scheduled(s, record)
        aid = s.admit()
        for result in results:
            ok(s.apply(s.outcome(aid, result)))
        return make(s, aid)

    return build


def on_admitted(make: Callable[[Shard, str], k.Record], record: k.Schedule | None = None) -> Build:
    return on_results((), make, record)


def on_fenced(
    make: Callable[[Shard, str], k.Record],
    results: tuple[PublishResult, ...] = (),
    fence_id: str = FENCE,
) -> Build:
    """Schedule, admit with a producer fenced under `fence_id`, record `results`, then
    build with the attempt id."""

    def build(s: Shard) -> k.Record:
        scheduled(s)
        aid = s.admit(fence_id=fence_id)
        for result in results:
            ok(s.apply(s.outcome(aid, result)))
        return make(s, aid)

    return build


def on_uncertain(make: Callable[[Shard, str], k.Record], record: k.Schedule | None = None) -> Build:
    return on_results((unknown(),), make, record)


def on_uncertain_then(*records: k.Record | Build, last: Build) -> Build:
    """k1 UNCERTAIN (its attempt UNKNOWN), then each of `records` applied, then `last`."""

    def build(s: Shard) -> k.Record:
        uncertain(s)
        for step in records:
            ok(s.apply(step if isinstance(step, msgspec.Struct) else step(s)))
        return last(s)

    return build


def on_retry(
    make: Callable[[Shard, str, str], k.Record],
    *then: tuple[int, PublishResult] | k.Record,
    record: k.Schedule | None = None,
) -> Build:
    """Schedule, admit A1, record UNKNOWN, admit the armed retry A2, then apply `then` in
    order: (1 or 2, result) is an outcome for A1 or A2, anything else a record. Builds with
    (A1, A2)."""

    def build(s: Shard) -> k.Record:
        a1 = uncertain(s, record)
        a2 = s.admit()
        for step in then:
            if isinstance(step, tuple):
                which, result = step
                ok(s.apply(s.outcome(a1 if which == 1 else a2, result)))
            else:
                ok(s.apply(step))
        return make(s, a1, a2)

    return build


def admit_at(
    bp_ms: int,
    earliest_ms: int,
    latest_ms: int,
    *,
    granted: bool = True,
    record: k.Schedule = SHORT,
    first: tuple[k.Record, ...] = (),
) -> Build:
    """Schedule `record`, apply `first`, then an Admission persisted at bp_ms whose worker
    saw the interval [earliest_ms, latest_ms]."""

    def build(s: Shard) -> k.Record:
        scheduled(s, record)
        for r in first:
            ok(s.apply(r))
        s.now_ms = bp_ms
        return s.admission(interval=k.TrustedInterval(earliest_ms, latest_ms), granted=granted)

    return build


def retry_at(
    bp_ms: int, earliest_ms: int, latest_ms: int, *, first: tuple[k.Record, ...] = ()
) -> Build:
    """A SHORT timer made UNCERTAIN (its retry armed at RETRY_MS), `first` applied, then a
    retry Admission persisted at bp_ms whose worker saw [earliest_ms, latest_ms]."""

    def build(s: Shard) -> k.Record:
        uncertain(s, SHORT)
        assert current(s).action_at_ms == RETRY_MS
        for r in first:
            ok(s.apply(r))
        s.now_ms = bp_ms
        return s.admission(interval=k.TrustedInterval(earliest_ms, latest_ms))

    return build


def due_admission(s: Shard) -> k.Record:
    """An Admission of the current work, persisted just after its actionAt."""
    s.now_ms = max(s.now_ms, current(s).action_at_ms + 10)
    return s.admission()


def after_admission_at(bp_ms: int, result: PublishResult) -> Build:
    """A SHORT timer admitted at actionAt, then `result` for the attempt persisted at bp_ms."""

    def build(s: Shard) -> k.Record:
        scheduled(s, SHORT)
        aid = s.admit()
        s.now_ms = bp_ms
        return s.outcome(aid, result)

    return build


def unknown_at(bp_ms: int) -> Build:
    return after_admission_at(bp_ms, unknown())


def expire_at(
    bp_ms: int,
    earliest_ms: int,
    *,
    version_delta: int = 0,
    first: tuple[k.Record, ...] = (),
    setup: Callable[[Shard], object] = lambda s: scheduled(s, SHORT),
) -> Build:
    def build(s: Shard) -> k.Record:
        setup(s)
        for r in first:
            ok(s.apply(r))
        m = current(s)
        s.now_ms = bp_ms
        interval = k.TrustedInterval(earliest_ms, max(earliest_ms, bp_ms) + 10)
        return k.Expire(m.message_id, m.generation, m.version + version_delta, interval)

    return build


def after(first: Build, then: Build) -> Build:
    """Apply the record `first` builds (it must be applied), then build with `then`."""

    def build(s: Shard) -> k.Record:
        ok(s.apply(first(s)))
        return then(s)

    return build


def claim_overtaken_by_window_close(s: Shard) -> k.Record:
    """A worker claimed the armed retry and proves a pre-send error, but the retry window
    closed first: its claim's version is gone."""
    uncertain(s)
    claimed = current(s)
    ok(s.apply(expiry_proof(s)))
    return claim(claimed)


def at(ms: int, then: Build) -> Build:
    def build(s: Shard) -> k.Record:
        s.now_ms = ms
        return then(s)

    return build


def expiry_of(s: Shard, _attempt_id: str) -> k.Expire:
    """`expiry_proof` for builders that pass the attempt id along."""
    return expiry_proof(s)


def overtaken_by(*records: k.Record) -> Build:
    """An Admission proposed from the state the worker saw, then overtaken in the log."""

    def build(s: Shard) -> k.Record:
        scheduled(s)
        s.now_ms = ACTION_MS + 10
        proposed = s.admission()
        for record in records:
            ok(s.apply(record))
        return proposed

    return build


def overtaken_by_a_claim_result(s: Shard) -> k.Record:
    """An Admission proposed from the state the worker saw; then a permanent pre-send error
    of a claim spends an attempt: the same generation, a newer version."""
    m = scheduled(s)
    s.now_ms = ACTION_MS + 10
    proposed = s.admission()
    ok(s.apply(claim(m)))
    return proposed


def retry_overtaken_by_evidence(s: Shard) -> k.Record:
    """A retry proposed while armed, then the unknown attempt's evidence arrives first."""
    a1 = uncertain(s)
    s.now_ms = current(s).action_at_ms + 10
    proposed = s.admission()
    ok(s.apply(s.outcome(a1, published(1))))
    return proposed


def loser_of_a_race(s: Shard) -> k.Record:
    scheduled(s)
    s.now_ms = ACTION_MS + 10
    first, second = s.admission(), s.admission()
    assert s.apply(first).code is Code.ADMITTED
    return second


def enqueue_retry_of_winner(s: Shard) -> k.Record:
    scheduled(s)
    s.now_ms = ACTION_MS + 10
    winner = s.admission()
    assert s.apply(winner).code is Code.ADMITTED
    return winner


def attempt_id_reused_after_retry(s: Shard) -> k.Record:
    scheduled(s)
    aid = s.admit()
    ok(s.apply(s.outcome(aid, not_published("retriable"))))
    s.now_ms = current(s).action_at_ms + 10
    return s.admission(attempt_id=aid)


def in_retry_backoff(make: Callable[[Shard], k.Record]) -> Build:
    return on_results((not_published("retriable"),), lambda s, _aid: make(s))


def early_claim_result(then: Callable[[Shard], k.Record]) -> Build:
    """A worker whose clock runs ahead proves a pre-send error 9 s before deliverAt; the
    retry must still wait for deliverAt."""

    def build(s: Shard) -> k.Record:
        m = scheduled(s, schedule(delay_ms=10_000))
        s.now_ms = T0_MS + 1_000
        ok(s.apply(claim(m)))
        s.now_ms = T0_MS + 1_300  # 8.7 s before deliverAt
        return then(s)

    return build


def never_scheduled_admission(s: Shard) -> k.Record:
    return k.PublishAdmission(
        mid(),
        1,
        1,
        f"{mid()}.1.1",
        "c",
        "n",
        "d",
        k.Capability(),
        interval_at(T0_MS),
        k.Capacity(True),
    )


def after_out_of_range_bp(s: Shard) -> k.Record:
    """An entry persisted at 2^53 is refused and must not become the time later entries
    are held to: a schedule at T0 afterwards is not regressed."""
    scheduled(s)
    s.now_ms = TOO_BIG
    assert s.apply(k.ShardState("FROZEN")).code is Code.PERSISTED_AT_OUT_OF_RANGE
    s.now_ms = T0_MS
    return schedule("k2")


def identical_reschedule_after_delivery(s: Shard) -> k.Record:
    scheduled(s)
    ok(s.apply(reschedule(delay_ms=0)))
    aid = s.admit()
    ok(s.apply(s.outcome(aid, published())))
    return reschedule(delay_ms=0)


def expired_then(make: Callable[[Shard], k.Record], record: k.Schedule = SHORT) -> Build:
    def build(s: Shard) -> k.Record:
        scheduled(s, record)
        ok(s.apply(expiry_proof(s)))
        return make(s)

    return build


def superseded_retry(result: PublishResult) -> Build:
    """The unknown attempt is found while the retry is in flight (DELIVERED), new content
    starts generation 2, then the old retry's outcome arrives."""
    return on_retry(
        lambda s, a1, a2: s.outcome(a2, result), (1, published(1)), schedule(txn="txn-2")
    )


def headers(n: int) -> tuple[tuple[str, str], ...]:
    return tuple((f"h{i}", "v") for i in range(n))


# Checks -----------------------------------------------------------------------------------


def changed_tables(r: Result) -> set[Table]:
    before, after = tables(r.before), tables(r.after)
    return {table for table in Table if before[table] != after[table]}


def unchanged(r: Result) -> None:
    assert changed_tables(r) == set()
    assert r.effects[1:] == ()


def carries_attempt(r: Result) -> None:
    last = r.message(r.before).last_attempt_id
    assert last is not None
    assert r.outcome.attempt_id == last


def carries_evidence(r: Result) -> None:
    carries_attempt(r)
    assert r.outcome.evidence is not None
    assert r.outcome.evidence == r.message(r.before).evidence


def names_the_delivering_attempt(r: Result) -> None:
    """too_late names an attempt and where *it* landed: the evidence it carries must be
    that attempt's own."""
    assert r.outcome.evidence is not None
    assert r.outcome.evidence == r.message(r.before).evidence
    assert r.outcome.attempt_id is not None
    assert r.attempt(r.outcome.attempt_id).evidence == r.outcome.evidence


def status(expected: k.Status) -> Check:
    def check(r: Result) -> None:
        assert r.message().status is expected

    return check


def timing(deliver_at_ms: int, expire_at_ms: int | None = None) -> Check:
    """The new generation sits exactly on the boundary the row names, with timeline work."""

    def check(r: Result) -> None:
        record = r.entry.record
        assert isinstance(record, k.Schedule)
        m = r.message(key=record.timer_key)
        assert (m.status, m.deliver_at_ms) == (k.Status.SCHEDULED, deliver_at_ms)
        if expire_at_ms is not None:
            assert m.expire_at_ms == expire_at_ms
        puts = [e for e in r.effects if isinstance(e, TimelinePut)]
        assert [p.action_at_ms for p in puts] == [m.action_at_ms]

    return check


def superseded(r: Result) -> None:
    old, new = r.message(r.before), r.message()
    assert (new.status, new.generation) == (k.Status.SCHEDULED, old.generation + 1)
    assert new.payload_digest == old.payload_digest
    assert (new.attempts_spent, new.failures, new.open_attempts, new.uncertain_retries) == (
        0,
        0,
        0,
        0,
    )
    revokes = [e for e in r.effects if isinstance(e, RevokeClaim)]
    if old.has_work:
        assert revokes == [RevokeClaim(old.message_id, old.generation, r.outcome.code)]
    else:
        assert revokes == []
    # The old generation's open attempts stay obligations under their own generation.
    assert obligations(r.after) == obligations(r.before)


def canceled(r: Result) -> None:
    old = r.message(r.before)
    assert r.message().status is k.Status.CANCELED
    assert RevokeClaim(old.message_id, old.generation, Code.CANCELED) in r.effects


def publishes(visible_at_ms: int | None = None) -> Check:
    def check(r: Result) -> None:
        record = r.entry.record
        assert isinstance(record, k.PublishAdmission)
        sends = [e for e in r.effects if isinstance(e, Publish)]
        assert [p.attempt_id for p in sends] == [record.attempt_id]
        before, m = r.message(r.before), r.message()
        assert m.status is k.Status.PUBLISHING
        assert sends[0].deliver_at_ms == m.deliver_at_ms
        assert sends[0].action_at_ms == before.action_at_ms
        assert sends[0].visible_at_ms == (visible_at_ms or m.deliver_at_ms)
        assert r.after.obligation(record.attempt_id.encode()) is not None
        assert r.outcome.attempt_id == record.attempt_id
        assert not m.has_work and not list(r.after.items(Table.TIMELINE))

    return check


def unknown_ids(state: k.State) -> set[str]:
    return {
        v.attempt_id
        for _, v in state.items(Table.ATTEMPTS)
        if isinstance(v, k.Attempt) and v.status is k.AttemptStatus.UNKNOWN
    }


def retry_admitted(retries: int) -> Check:
    """An armed retry won: it publishes, counts as an uncertain retry, and every UNKNOWN
    attempt before it is still UNKNOWN and still an obligation."""

    def check(r: Result) -> None:
        publishes()(r)
        before, m = r.message(r.before), r.message()
        assert before.status is k.Status.UNCERTAIN
        assert m.uncertain_retries == retries
        assert m.open_attempts == before.open_attempts + 1
        assert unknown_ids(r.before)
        assert unknown_ids(r.after) == unknown_ids(r.before)
        assert unknown_ids(r.before) < obligations(r.after)

    return check


def _retry_time(r: Result) -> int:
    m, cfg = r.message(), r.after.config
    first = action_at(m.deliver_at_ms, m.capability)
    return max(r.entry.persisted_at_ms + cfg.backoff_ms(m.failures), first)


def armed(expected_at_ms: int | None = None) -> Check:
    """UNCERTAIN with retry work at max(bp + backoff(failures), first actionAt)."""

    def check(r: Result) -> None:
        m = r.message()
        assert (m.status, m.has_work) == (k.Status.UNCERTAIN, True)
        assert m.action_at_ms == _retry_time(r) < m.expire_at_ms
        if expected_at_ms is not None:
            assert m.action_at_ms == expected_at_ms
        puts = [(e.action_at_ms, e.work.kind) for e in r.effects if isinstance(e, TimelinePut)]
        assert puts == [(m.action_at_ms, "retry")]
        assert unknown_ids(r.after) <= obligations(r.after)

    return check


def keyed_at(action_at_ms: int) -> Check:
    """Back to SCHEDULED, the retry keyed at exactly this time."""

    def check(r: Result) -> None:
        m = r.message()
        assert (m.status, m.has_work, m.action_at_ms) == (k.Status.SCHEDULED, True, action_at_ms)
        assert m.action_at_ms == min(_retry_time(r), m.expire_at_ms)
        puts = [(e.action_at_ms, e.work.kind) for e in r.effects if isinstance(e, TimelinePut)]
        assert puts == [(action_at_ms, "retry")]

    return check


def unarmed(r: Result) -> None:
    """UNCERTAIN, waiting for evidence alone: no retry work anywhere."""
    m = r.message()
    assert (m.status, m.has_work) == (k.Status.UNCERTAIN, False)
    assert not any(isinstance(e, TimelinePut) for e in r.effects)
    assert not list(r.after.items(Table.TIMELINE))
    assert unknown_ids(r.after) and unknown_ids(r.after) <= obligations(r.after)


def delivered_while_retrying(r: Result) -> None:
    """The unknown attempt's evidence delivers the message; the retry stays in flight."""
    before, m = r.message(r.before), r.message()
    record = r.entry.record
    assert isinstance(record, k.PublishOutcome) and isinstance(record.result, k.Published)
    assert m.status is k.Status.DELIVERED
    assert m.evidence == record.result.evidence == r.outcome.evidence
    retry = before.last_attempt_id
    assert retry is not None and retry != record.attempt_id
    assert r.attempt(retry).status is k.AttemptStatus.PUBLISHING
    assert obligations(r.after) == {retry}


def its_claim_released(r: Result) -> tuple[RevokeClaim]:
    """The one effect of an outcome that moves no message: the claim its attempt was sent
    under is released (only that claim)."""
    record = r.entry.record
    assert isinstance(record, k.PublishOutcome)
    attempt = r.before.attempt(record.attempt_id.encode())
    assert attempt is not None
    code = C.OUTCOME_RECORDED
    return (RevokeClaim(attempt.message_id, attempt.generation, code, attempt.claim_id),)


def ledger_only(r: Result) -> None:
    """The message keeps its status, evidence, budget and work; only the ledger (and the
    message's bookkeeping of open attempts) changes."""
    before, m = r.message(r.before), r.message()
    keep = {
        "version": m.version,
        "open_attempts": m.open_attempts,
        "updated_at_ms": m.updated_at_ms,
        "updated_position": m.updated_position,
    }
    assert msgspec.structs.replace(before, **keep) == m
    assert changed_tables(r) <= {Table.MESSAGES, Table.ATTEMPTS, Table.OBLIGATIONS}
    assert r.effects[1:] == its_claim_released(r)


def gains_evidence(r: Result) -> None:
    """A dead-lettered message whose unknown attempt is proven published keeps its status
    and budget but records where the attempt landed, and which attempt it was."""
    before, m = r.message(r.before), r.message()
    assert before.evidence is None and m.evidence is not None
    assert m.delivered_attempt_id == r.outcome.attempt_id
    keep = {
        "version": m.version,
        "open_attempts": m.open_attempts,
        "updated_at_ms": m.updated_at_ms,
        "updated_position": m.updated_position,
        "evidence": m.evidence,
        "delivered_attempt_id": m.delivered_attempt_id,
    }
    assert msgspec.structs.replace(before, **keep) == m
    assert r.effects[1:] == its_claim_released(r)


def untouched(r: Result) -> None:
    """An outcome of a superseded generation: the message row does not move at all."""
    assert r.message() == r.message(r.before)
    assert changed_tables(r) <= {Table.ATTEMPTS, Table.OBLIGATIONS}
    assert r.effects[1:] == its_claim_released(r)


def dead_lettered_behind_unknown(r: Result) -> None:
    m = r.message()
    assert (m.status, m.has_work) == (k.Status.DEAD_LETTERED, False)
    assert [e for e in r.effects if isinstance(e, DeadLetter)] == [
        DeadLetter(m.message_id, m.generation, m.attempts_spent, m.failures, m.last_error)
    ]
    # The copy is owed from this very entry, with what it is made of, and holds the payload.
    pending = r.after.dead_letter(k.dead_letter_key(m.message_id, m.generation))
    assert pending == k.DeadLetterPending(
        m.message_id, m.generation, m.attempts_spent, m.failures, m.last_error, m.txn,
        m.payload_digest, m.payload_size, m.partition_key, m.producer_sub, m.encrypted,
        m.deliver_at_ms, r.entry.position, r.entry.persisted_at_ms,
    )  # fmt: skip
    assert m.dead_letter_evidence is None
    assert r.after.meta.counters.dead_letters_pending == 1
    ref = r.after.payload(m.payload_digest.encode())
    assert ref is not None and ref.count == 1
    assert unknown_ids(r.after) and unknown_ids(r.after) <= obligations(r.after)
    assert not list(r.after.items(Table.TIMELINE))


def copy_recorded(r: Result) -> None:
    """The owed copy is closed: its row and its payload reference go, and the message keeps
    the copy's evidence (a change of the row: a new version)."""
    record = r.entry.record
    assert isinstance(record, k.DeadLetterWritten)
    key = k.dead_letter_key(record.message_id, record.generation)
    pending = r.before.dead_letter(key)
    assert pending is not None and r.after.dead_letter(key) is None
    owed = r.before.meta.counters.dead_letters_pending
    assert r.after.meta.counters.dead_letters_pending == owed - 1
    ref_before = r.before.payload(pending.payload_digest.encode())
    ref_after = r.after.payload(pending.payload_digest.encode())
    assert ref_before is not None
    assert (ref_after.count if ref_after else 0) == ref_before.count - 1
    assert r.outcome.evidence == record.evidence
    before, m = r.message(r.before), r.message()
    if record.generation == before.generation:
        assert before.dead_letter_evidence is None
        keep = {
            "version": before.version + 1,
            "updated_at_ms": r.entry.persisted_at_ms,
            "updated_position": r.entry.position,
            "dead_letter_evidence": record.evidence,
        }
        assert msgspec.structs.replace(before, **keep) == m
    else:
        assert m == before  # a superseded generation's copy: the message is a later one
    assert changed_tables(r) <= {Table.MESSAGES, Table.DEAD_LETTERS, Table.PAYLOADS}
    assert r.effects[1:] == ()


def superseded_copy_still_owed(r: Result) -> None:
    """A new generation does not cancel the copy the old one owes, nor its payload."""
    superseded(r)
    old = r.message(r.before)
    pending = r.after.dead_letter(k.dead_letter_key(old.message_id, old.generation))
    assert pending is not None and pending.txn == old.txn
    assert r.message().dead_letter_evidence is None


def window_closed(r: Result) -> None:
    before, m = r.message(r.before), r.message()
    assert before.has_work
    assert (m.status, m.has_work, m.version) == (k.Status.UNCERTAIN, False, before.version + 1)
    assert not list(r.after.items(Table.TIMELINE))
    assert any(isinstance(e, TimelineRemove) for e in r.effects)
    assert RevokeClaim(m.message_id, m.generation, Code.RETRY_WINDOW_CLOSED) in r.effects
    assert obligations(r.after) == obligations(r.before)


def retry_floor(first_action_ms: int) -> Check:
    """A claim result persisted before the first action time keys the retry at that time,
    never at bp + backoff."""

    def check(r: Result) -> None:
        m = r.message()
        assert r.entry.persisted_at_ms + BACKOFF_MS < first_action_ms
        assert (m.status, m.action_at_ms) == (k.Status.SCHEDULED, first_action_ms)
        puts = [(e.action_at_ms, e.work.kind) for e in r.effects if isinstance(e, TimelinePut)]
        assert puts == [(first_action_ms, "retry")]

    return check


def shard_status(expected: str) -> Check:
    def check(r: Result) -> None:
        assert r.after.meta.shard_status == expected
        unchanged(r)

    return check


def persisted_at(expected_ms: int) -> Check:
    def check(r: Result) -> None:
        assert r.after.meta.last_persisted_at_ms == expected_ms

    return check


def lane_closed(r: Result) -> None:
    lane = r.after.lane(f"{TENANT}\x00{QUEUE}".encode())
    assert lane is not None and lane.gate == "CLOSED"
    assert changed_tables(r) == {Table.LANES}
    assert r.effects[1:] == ()


def spent_one(r: Result) -> None:
    m = r.message()
    assert (m.status, m.attempts_spent, m.failures) == (k.Status.SCHEDULED, 1, 1)
    assert RevokeClaim(m.message_id, m.generation, Code.CLAIM_RESULT_RECORDED, "c-9") in r.effects


def spent_one_uncertain(r: Result) -> None:
    m = r.message()
    assert (m.attempts_spent, m.failures) == (1, 2)
    assert RevokeClaim(m.message_id, m.generation, Code.CLAIM_RESULT_RECORDED, "c-9") in r.effects
    armed()(r)


def both(*checks: Check) -> Check:
    def check(r: Result) -> None:
        for c in checks:
            c(r)

    return check


# The table --------------------------------------------------------------------------------

C, S, R = Code, schedule, Row
FROZEN, PAUSED = k.ShardState("FROZEN"), k.ShardState("PAUSED")
CLOSED = k.LaneGate(TENANT, QUEUE, "CLOSED")
OPEN = k.LaneGate(TENANT, QUEUE, "OPEN")
DUE = admit_at(ACTION_MS, ACTION_MS, ACTION_MS + 10)  # an honest Admission at actionAt

# fmt: off
ROWS: tuple[Row, ...] = (
    # Applied: client commands.
    R("fresh key", lambda s: S(), C.SCHEDULED, timing(T0_MS + 1_000)),
    R("delay at the horizon", lambda s: S(delay_ms=HORIZON_MS), C.SCHEDULED,
      timing(T0_MS + HORIZON_MS, T0_MS + LIFETIME_MS)),
    R("delay at the horizon, the tightest lifetime the limits allow",
      lambda s: S(delay_ms=HORIZON_MS), C.SCHEDULED,
      timing(T0_MS + HORIZON_MS, T0_MS + HORIZON_MS + WINDOW_MS), config=TIGHT),
    R("deliverAt at the horizon", lambda s: S(deliver_at_ms=T0_MS + HORIZON_MS), C.SCHEDULED,
      timing(T0_MS + HORIZON_MS)),
    R("expireAt at the lifetime", lambda s: S(expire_at_ms=T0_MS + LIFETIME_MS), C.SCHEDULED,
      timing(T0_MS + 1_000, T0_MS + LIFETIME_MS)),
    R("lifetime_ms at the lifetime", lambda s: S(lifetime_ms=LIFETIME_MS), C.SCHEDULED,
      timing(T0_MS + 1_000, T0_MS + LIFETIME_MS)),
    R("expireAt one window after deliverAt", lambda s: SHORT, C.SCHEDULED,
      timing(ACTION_MS, EXPIRE_MS)),
    R("past deliverAt, expireAt one window after bp",
      lambda s: S(deliver_at_ms=T0_MS - 5_000, expire_at_ms=T0_MS + WINDOW_MS), C.SCHEDULED,
      timing(T0_MS - 5_000, T0_MS + WINDOW_MS)),
    R("deliverAt at the epoch", lambda s: S(deliver_at_ms=0), C.SCHEDULED, timing(0)),
    R("payload at the ceiling", lambda s: S(size=CONFIG.max_payload_bytes), C.SCHEDULED),
    R("headers at the count limit", lambda s: S(headers=headers(CONFIG.max_headers)), C.SCHEDULED),
    R("handoff lead and clock bound at their maxima",
      lambda s: S(capability=k.Capability("delayed_handoff", 60_000, 60_000)), C.SCHEDULED),
    R("slash allowed in the timer key", lambda s: S("a/b/c"), C.SCHEDULED, timing(T0_MS + 1_000)),
    R("key of exactly max bytes", lambda s: S("k" * CONFIG.max_identity_bytes), C.SCHEDULED),
    R("same bp as the predecessor", given(S("k0"), then=lambda s: S()), C.SCHEDULED),
    R("paused shard takes schedules", given(PAUSED, then=lambda s: S()), C.SCHEDULED),
    R("bp after an out-of-range one is held to the last good bp", after_out_of_range_bp,
      C.SCHEDULED, timing(T0_MS + 1_000)),
    R("new content for a canceled timer", given(S(), cancel(), then=lambda s: S(txn="txn-2")),
      C.SCHEDULED, superseded),
    R("new content for a delivered timer, its retry in flight",
      on_retry(lambda s, a1, a2: S(txn="txn-2"), (1, published(1))), C.SCHEDULED, superseded),
    R("new content for a dead-lettered timer, its first attempt unknown",
      on_retry(lambda s, a1, a2: S(txn="txn-2"), (2, not_published("permanent"))), C.SCHEDULED,
      superseded, config=ONE_ATTEMPT),
    R("new content for a dead-lettered timer whose copy is still owed",
      dead_lettered(last=lambda s: S(txn="txn-2")), C.SCHEDULED, superseded_copy_still_owed,
      config=ONE_ATTEMPT),
    R("schedule with a new txn", on_scheduled(lambda s, m: S(txn="txn-2")), C.RESCHEDULED,
      superseded),
    R("reschedule", on_scheduled(lambda s, m: reschedule()), C.RESCHEDULED, superseded),
    R("reschedule in retry backoff", in_retry_backoff(lambda s: reschedule()), C.RESCHEDULED,
      superseded),
    R("identical schedule", on_scheduled(lambda s, m: S()), C.UNCHANGED, unchanged),
    R("identical schedule after admission", on_admitted(lambda s, aid: S()), C.UNCHANGED,
      unchanged),
    R("identical schedule while the retry is armed", on_uncertain(lambda s, aid: S()),
      C.UNCHANGED, unchanged),
    R("identical schedule of a delivered timer", on_results((published(),), lambda s, a: S()),
      C.UNCHANGED, unchanged),
    R("identical schedule of a canceled timer", given(S(), cancel(), then=lambda s: S()),
      C.UNCHANGED, unchanged),
    R("identical schedule of an expired timer, relative times",
      expired_then(lambda s: RELATIVE_SHORT, RELATIVE_SHORT), C.UNCHANGED, unchanged),
    R("identical schedule of an expired timer, absolute expireAt now past",
      expired_then(lambda s: SHORT), C.UNCHANGED, unchanged),
    R("identical schedule of a dead-lettered timer",
      on_results((not_published("permanent"),), lambda s, a: S()), C.UNCHANGED, unchanged,
      config=ONE_ATTEMPT),
    R("identical reschedule", given(S(), reschedule(), then=lambda s: reschedule()), C.UNCHANGED,
      unchanged),
    R("identical reschedule after delivery", identical_reschedule_after_delivery, C.UNCHANGED,
      unchanged),
    R("identical conditional schedule",
      on_scheduled(lambda s, m: S(expected_version=0), S(expected_version=0)), C.UNCHANGED,
      unchanged),
    R("identical conditional schedule after its version moved on",
      on_admitted(lambda s, a: S(expected_version=0), S(expected_version=0)), C.UNCHANGED,
      unchanged),
    R("identical conditional reschedule",
      given(S(), reschedule(version=1), then=lambda s: reschedule(version=1)), C.UNCHANGED,
      unchanged),
    R("pending timer", on_scheduled(lambda s, m: cancel()), C.CANCELED, canceled),
    R("in retry backoff after NOT_PUBLISHED", in_retry_backoff(lambda s: cancel()), C.CANCELED,
      canceled),
    R("paused shard takes cancels", given(S(), PAUSED, then=lambda s: cancel()), C.CANCELED,
      canceled),
    # Applied: system mutations.
    R("at actionAt with an honest clock", DUE, C.ADMITTED, publishes()),
    R("bp one ms before expireAt", admit_at(EXPIRE_MS - 1, ACTION_MS, EXPIRE_MS - 1), C.ADMITTED,
      publishes()),
    R("handoff starts lead_ms early, reveals after the clock bound",
      admit_at(T0_MS + 500, T0_MS + 500, T0_MS + 510, record=S(capability=HANDOFF)), C.ADMITTED,
      publishes(visible_at_ms=T0_MS + 1_200)),
    R("lane reopened", admit_at(ACTION_MS, ACTION_MS, ACTION_MS + 1, first=(CLOSED, OPEN)),
      C.ADMITTED, publishes()),
    R("armed retry of an uncertain timer, the unknown attempt kept",
      on_uncertain(lambda s, a: due_admission(s)), C.ADMITTED, retry_admitted(1)),
    R("armed retry at exactly its retry time", retry_at(RETRY_MS, RETRY_MS, RETRY_MS + 10),
      C.ADMITTED, retry_admitted(1)),
    R("armed retry one ms before expireAt", retry_at(EXPIRE_MS - 1, RETRY_MS, EXPIRE_MS - 1),
      C.ADMITTED, retry_admitted(1)),
    R("second retry after the first was not published",
      on_retry(lambda s, a1, a2: due_admission(s), (2, not_published())), C.ADMITTED,
      retry_admitted(2)),
    R("published", on_admitted(lambda s, aid: s.outcome(aid, published())), C.OUTCOME_RECORDED,
      status(k.Status.DELIVERED)),
    R("retriable failure, retry keyed no later than expireAt",
      after_admission_at(EXPIRE_MS - BACKOFF_MS + 1, not_published()), C.OUTCOME_RECORDED,
      keyed_at(EXPIRE_MS)),
    R("retriable failure, retry one ms before expireAt",
      after_admission_at(EXPIRE_MS - BACKOFF_MS - 1, not_published()), C.OUTCOME_RECORDED,
      keyed_at(EXPIRE_MS - 1)),
    R("absence proven under the attempt's own fence: retried",
      on_fenced(lambda s, aid: s.outcome(aid, proven_absent())), C.OUTCOME_RECORDED,
      keyed_at(ACTION_MS + 10 + BACKOFF_MS)),
    R("unknown arms a retry after backoff",
      on_admitted(lambda s, aid: s.outcome(aid, unknown())), C.OUTCOME_RECORDED,
      armed(ACTION_MS + 10 + BACKOFF_MS)),
    R("unknown, no retries allowed: unarmed",
      on_admitted(lambda s, aid: s.outcome(aid, unknown())), C.OUTCOME_RECORDED, unarmed,
      config=NO_RETRIES),
    R("unknown whose retry would reach expireAt: unarmed", unknown_at(EXPIRE_MS - BACKOFF_MS),
      C.OUTCOME_RECORDED, unarmed),
    R("unknown one ms earlier: armed at expireAt minus one",
      unknown_at(EXPIRE_MS - BACKOFF_MS - 1), C.OUTCOME_RECORDED, armed(EXPIRE_MS - 1)),
    R("unknown of the last allowed retry: unarmed",
      on_retry(lambda s, a1, a2: s.outcome(a2, unknown())), C.OUTCOME_RECORDED, unarmed,
      config=ONE_RETRY),
    R("unknown of a retry with retries left: armed again",
      on_retry(lambda s, a1, a2: s.outcome(a2, unknown())), C.OUTCOME_RECORDED, armed()),
    R("unknown resolved by positive evidence",
      on_results((unknown(),), lambda s, aid: s.outcome(aid, published())), C.OUTCOME_RECORDED,
      status(k.Status.DELIVERED)),
    R("unknown resolved by evidence once unarmed",
      on_results((unknown(),), lambda s, aid: s.outcome(aid, published())), C.OUTCOME_RECORDED,
      status(k.Status.DELIVERED), config=NO_RETRIES),
    R("the unknown attempt found while the retry is in flight",
      on_retry(lambda s, a1, a2: s.outcome(a1, published(1))), C.OUTCOME_RECORDED,
      delivered_while_retrying),
    R("the retry published too, after the unknown attempt was found",
      on_retry(lambda s, a1, a2: s.outcome(a2, published(2)), (1, published(1))),
      C.OUTCOME_RECORDED, ledger_only),
    R("the retry not published, after the unknown attempt was found",
      on_retry(lambda s, a1, a2: s.outcome(a2, not_published()), (1, published(1))),
      C.OUTCOME_RECORDED, ledger_only),
    R("the retry unknown, after the unknown attempt was found",
      on_retry(lambda s, a1, a2: s.outcome(a2, unknown()), (1, published(1))),
      C.OUTCOME_RECORDED, ledger_only),
    R("the retry not published behind the unknown attempt: armed again",
      on_retry(lambda s, a1, a2: s.outcome(a2, not_published())), C.OUTCOME_RECORDED, armed()),
    R("the retry's lane unavailable behind the unknown attempt: armed again",
      on_retry(lambda s, a1, a2: s.outcome(a2, not_published("lane_unavailable"))),
      C.OUTCOME_RECORDED, armed()),
    R("the retry's permanent failure behind the unknown attempt, budget left",
      on_retry(lambda s, a1, a2: s.outcome(a2, not_published("permanent"))), C.OUTCOME_RECORDED,
      armed()),
    R("the retry's permanent failure spends the budget behind the unknown attempt",
      on_retry(lambda s, a1, a2: s.outcome(a2, not_published("permanent"))), C.OUTCOME_RECORDED,
      dead_lettered_behind_unknown, config=ONE_ATTEMPT),
    R("evidence for a dead-lettered timer's unknown attempt",
      on_retry(lambda s, a1, a2: s.outcome(a1, published(1)), (2, not_published("permanent"))),
      C.OUTCOME_RECORDED, both(gains_evidence, status(k.Status.DEAD_LETTERED)),
      config=ONE_ATTEMPT),
    R("the old generation's retry published", superseded_retry(published(2)),
      C.OUTCOME_RECORDED, untouched),
    R("the old generation's retry not published", superseded_retry(not_published("permanent")),
      C.OUTCOME_RECORDED, untouched),
    R("the old generation's retry unknown", superseded_retry(unknown()), C.OUTCOME_RECORDED,
      untouched),
    R("permanent pre-send error, budget left", on_scheduled(lambda s, m: claim(m), S(delay_ms=0)),
      C.CLAIM_RESULT_RECORDED, spent_one),
    R("pre-send error before deliverAt: the retry waits for deliverAt",
      on_scheduled(lambda s, m: claim(m), S(delay_ms=10_000)), C.CLAIM_RESULT_RECORDED,
      retry_floor(T0_MS + 10_000)),
    R("pre-send error before a handoff's first action time",
      on_scheduled(lambda s, m: claim(m), S(delay_ms=10_000, capability=HANDOFF)),
      C.CLAIM_RESULT_RECORDED, retry_floor(T0_MS + 10_000 - HANDOFF.lead_ms)),
    R("pre-send error on an armed uncertain timer, budget left",
      on_uncertain(lambda s, a: claim(current(s))), C.CLAIM_RESULT_RECORDED, spent_one_uncertain),
    R("pre-send error on an armed uncertain timer spends the budget",
      on_uncertain(lambda s, a: claim(current(s))), C.CLAIM_RESULT_RECORDED,
      dead_lettered_behind_unknown, config=ONE_ATTEMPT),
    R("the dead-lettered timer's copy", dead_lettered(last=copy_written()),
      C.DEAD_LETTER_RECORDED, copy_recorded, config=ONE_ATTEMPT),
    R("the copy, on a frozen shard", dead_lettered(FROZEN, last=copy_written()),
      C.DEAD_LETTER_RECORDED, copy_recorded, config=ONE_ATTEMPT),
    R("the copy of a timer dead-lettered behind an unknown attempt",
      on_uncertain_then(lambda s: claim(current(s)), last=copy_written()),
      C.DEAD_LETTER_RECORDED, copy_recorded, config=ONE_ATTEMPT),
    R("the copy of a generation superseded before its copy was written",
      dead_lettered(S(txn="txn-2"), last=copy_written(generation=1)), C.DEAD_LETTER_RECORDED,
      copy_recorded, config=ONE_ATTEMPT),
    R("the copy of a generation superseded and dead-lettered again",
      dead_lettered(S(txn="txn-2", delay_ms=0), lambda s: claim(current(s)),
                    last=copy_written(generation=1)),
      C.DEAD_LETTER_RECORDED, copy_recorded, config=ONE_ATTEMPT),
    R("proof at expireAt", expire_at(EXPIRE_MS, EXPIRE_MS), C.EXPIRED, status(k.Status.EXPIRED)),
    R("proof at expireAt with the retry armed",
      expire_at(EXPIRE_MS, EXPIRE_MS, setup=lambda s: uncertain(s, SHORT)),
      C.RETRY_WINDOW_CLOSED, window_closed),
    R("proof after the retry was not published, behind the unknown attempt",
      on_retry(lambda s, a1, a2: expiry_proof(s), (2, not_published()), record=SHORT),
      C.RETRY_WINDOW_CLOSED, window_closed),
    R("lane closed", lambda s: CLOSED, C.GATE_CHANGED, lane_closed),
    R("frozen", lambda s: FROZEN, C.SHARD_STATE_CHANGED, shard_status("FROZEN")),
    R("bp at the last representable ms", at(TOO_BIG - 1, lambda s: FROZEN),
      C.SHARD_STATE_CHANGED, persisted_at(TOO_BIG - 1)),
    # Rejected: client verdicts.
    R("cancel after admission", on_admitted(lambda s, aid: cancel()), C.TOO_LATE,
      carries_attempt),
    R("new content after admission", on_admitted(lambda s, aid: S(txn="txn-2")), C.TOO_LATE,
      carries_attempt),
    R("reschedule while uncertain", on_results((unknown(),), lambda s, aid: reschedule()),
      C.TOO_LATE, carries_attempt),
    R("new content while the retry is armed", on_uncertain(lambda s, a: S(txn="txn-2")),
      C.TOO_LATE, carries_attempt),
    R("cancel while the retry is in flight", on_retry(lambda s, a1, a2: cancel()), C.TOO_LATE,
      carries_attempt),
    R("cancel of a delivered timer", on_results((published(3),), lambda s, aid: cancel()),
      C.TOO_LATE, carries_evidence),
    R("cancel of a timer its retry delivered",
      on_retry(lambda s, a1, a2: cancel(), (2, published(3))), C.TOO_LATE,
      both(carries_evidence, names_the_delivering_attempt)),
    R("cancel of a timer its unknown attempt delivered, the retry in flight",
      on_retry(lambda s, a1, a2: cancel(), (1, published(3))), C.TOO_LATE,
      names_the_delivering_attempt),
    R("reschedule repeating the current txn with a new delay",
      on_scheduled(lambda s, m: reschedule(txn=m.txn, delay_ms=9_000)), C.TXN_REUSED,
      status(k.Status.SCHEDULED)),
    R("new content under the current txn", on_scheduled(lambda s, m: S(txn=m.txn, delay_ms=9_000)),
      C.TXN_REUSED, status(k.Status.SCHEDULED)),
    R("a canceled timer scheduled again under its last txn",
      given(S(), cancel(), then=lambda s: S(delay_ms=9_000)), C.TXN_REUSED,
      status(k.Status.CANCELED)),
    R("cancel, never scheduled", lambda s: cancel(), C.ABSENT),
    R("reschedule, never scheduled", lambda s: reschedule(), C.ABSENT),
    R("cancel of a canceled timer", given(S(), cancel(), then=lambda s: cancel()), C.ABSENT),
    R("cancel under another tenant", on_scheduled(lambda s, m: cancel(tenant="other")),
      C.ABSENT),
    R("identical reschedule of a canceled timer",
      given(S(), reschedule(), cancel(), then=lambda s: reschedule()), C.ABSENT),
    # Rejected: log structure.
    R("position 0 on an empty shard", lambda s: S(), C.POSITION_DUPLICATE, offset=0),
    R("the applied position again", given(S(), then=lambda s: S("k2")), C.POSITION_DUPLICATE,
      offset=0),
    R("below the applied position", given(S(), S("k2"), then=lambda s: S("k3")),
      C.POSITION_DUPLICATE, offset=-1),
    R("skips a position", lambda s: S(), C.POSITION_GAP, offset=2),
    R("gap with an out-of-range bp", at(-1, lambda s: S()), C.POSITION_GAP, offset=2),
    R("command with bp before the predecessor's", given(S(), then=at(T0_MS - 1, lambda s: S("k2"))),
      C.PERSISTED_AT_REGRESSED),
    R("mutation with bp before the predecessor's", given(S(), then=at(T0_MS - 1, lambda s: FROZEN)),
      C.PERSISTED_AT_REGRESSED),
    R("negative bp on an empty shard", at(-1, lambda s: S()), C.PERSISTED_AT_OUT_OF_RANGE),
    R("negative bp after a predecessor, not a regression",
      given(S(), then=at(-1, lambda s: FROZEN)), C.PERSISTED_AT_OUT_OF_RANGE),
    R("bp at 2^53", given(S(), then=at(TOO_BIG, lambda s: S("k2"))), C.PERSISTED_AT_OUT_OF_RANGE),
    R("mutation with bp at 2^53", given(S(), then=at(TOO_BIG, lambda s: FROZEN)),
      C.PERSISTED_AT_OUT_OF_RANGE),
    # Rejected: shard state.
    R("frozen schedule", given(FROZEN, then=lambda s: S()), C.SHARD_NOT_ACTIVE),
    R("frozen reschedule", given(S(), FROZEN, then=lambda s: reschedule()), C.SHARD_NOT_ACTIVE),
    R("frozen cancel", given(S(), FROZEN, then=lambda s: cancel()), C.SHARD_NOT_ACTIVE),
    R("frozen admission", admit_at(ACTION_MS, ACTION_MS, ACTION_MS + 1, first=(FROZEN,)),
      C.SHARD_NOT_ACTIVE),
    R("paused admission", admit_at(ACTION_MS, ACTION_MS, ACTION_MS + 1, first=(PAUSED,)),
      C.SHARD_NOT_ACTIVE),
    R("paused retry admission", retry_at(RETRY_MS, RETRY_MS, RETRY_MS + 10, first=(PAUSED,)),
      C.SHARD_NOT_ACTIVE),
    R("paused expiry", expire_at(EXPIRE_MS, EXPIRE_MS, first=(PAUSED,)), C.SHARD_NOT_ACTIVE),
    R("paused expiry of the retry window",
      expire_at(EXPIRE_MS, EXPIRE_MS, first=(PAUSED,), setup=lambda s: uncertain(s, SHORT)),
      C.SHARD_NOT_ACTIVE),
    # Rejected: command validation, in the order the codes list gives.
    R("NUL in tenant", lambda s: S(tenant="a\x00b"), C.INVALID_IDENTITY),
    R("NUL in key", lambda s: S("k\x001"), C.INVALID_IDENTITY),
    R("slash in queue", lambda s: S(queue="a/b"), C.INVALID_IDENTITY),
    R("slash in tenant", lambda s: S(tenant="a/b"), C.INVALID_IDENTITY),
    R("empty key", lambda s: S(""), C.INVALID_IDENTITY),
    R("empty queue", lambda s: S(queue=""), C.INVALID_IDENTITY),
    R("key one byte too long", lambda s: S("k" * (CONFIG.max_identity_bytes + 1)),
      C.INVALID_IDENTITY),
    R("key too long in bytes, not in chars",
      lambda s: S("é" * (CONFIG.max_identity_bytes // 2 + 1)), C.INVALID_IDENTITY),
    R("cancel with an empty key", lambda s: cancel(""), C.INVALID_IDENTITY),
    R("reschedule with NUL in tenant", lambda s: reschedule(tenant="\x00"), C.INVALID_IDENTITY),
    R("lane gate with slash in queue", lambda s: k.LaneGate(TENANT, "a/b", "CLOSED"),
      C.INVALID_IDENTITY),
    R("empty txn", lambda s: S(txn=""), C.INVALID_TXN),
    R("txn one byte too long", lambda s: S(txn="t" * (CONFIG.max_txn_bytes + 1)), C.INVALID_TXN),
    R("reschedule with an empty txn", on_scheduled(lambda s, m: reschedule(txn="")),
      C.INVALID_TXN),
    R("digest not hex", lambda s: S(digest="xyz"), C.INVALID_PAYLOAD_REF),
    R("digest in upper case", lambda s: S(digest=DIGEST.upper()), C.INVALID_PAYLOAD_REF),
    R("negative size", lambda s: S(size=-1), C.INVALID_PAYLOAD_REF),
    R("payload one byte over", lambda s: S(size=CONFIG.max_payload_bytes + 1),
      C.PAYLOAD_TOO_LARGE),
    R("one header too many", lambda s: S(headers=headers(CONFIG.max_headers + 1)),
      C.INVALID_HEADERS),
    R("reserved header", lambda s: S(headers=(("nereus-attempt", "x"),)), C.INVALID_HEADERS),
    R("reserved header, other case", lambda s: S(headers=(("Nereus-Id", "x"),)),
      C.INVALID_HEADERS),
    R("empty header name", lambda s: S(headers=(("", "x"),)), C.INVALID_HEADERS),
    R("headers one byte too large", lambda s: S(headers=(("h", "x" * CONFIG.max_header_bytes),)),
      C.INVALID_HEADERS),
    R("immediate with a lead", lambda s: S(capability=k.Capability("immediate", 1, 0)),
      C.INVALID_CAPABILITY),
    R("immediate with a clock bound", lambda s: S(capability=k.Capability("immediate", 0, 1)),
      C.INVALID_CAPABILITY),
    R("handoff lead above max", lambda s: S(capability=k.Capability("delayed_handoff", 60_001)),
      C.INVALID_CAPABILITY),
    R("handoff negative lead", lambda s: S(capability=k.Capability("delayed_handoff", -1)),
      C.INVALID_CAPABILITY),
    R("handoff clock bound above max",
      lambda s: S(capability=k.Capability("delayed_handoff", 0, 60_001)), C.INVALID_CAPABILITY),
    R("both delay and deliverAt",
      lambda s: msgspec.structs.replace(S(delay_ms=1_000), deliver_at_ms=ACTION_MS),
      C.INVALID_TIMING),
    R("neither delay nor deliverAt", lambda s: S(delay_ms=None), C.INVALID_TIMING),
    R("negative delay", lambda s: S(delay_ms=-1), C.INVALID_TIMING),
    R("negative deliverAt", lambda s: S(deliver_at_ms=-1), C.INVALID_TIMING),
    R("negative expireAt", lambda s: S(expire_at_ms=-1), C.INVALID_TIMING),
    R("both expireAt and lifetime", lambda s: S(expire_at_ms=EXPIRE_MS, lifetime_ms=5_000),
      C.INVALID_TIMING),
    R("negative lifetime", lambda s: S(lifetime_ms=-1), C.INVALID_TIMING),
    R("deliverAt below the representable range", lambda s: S(deliver_at_ms=-(2**62) - 1),
      C.INVALID_TIMING),
    R("deliverAt at 2^53", lambda s: S(deliver_at_ms=TOO_BIG), C.INVALID_TIMING),
    R("delay of 2^53", lambda s: S(delay_ms=TOO_BIG), C.INVALID_TIMING),
    R("expireAt at 2^53", lambda s: S(expire_at_ms=TOO_BIG), C.INVALID_TIMING),
    R("lifetime of 2^53", lambda s: S(lifetime_ms=TOO_BIG), C.INVALID_TIMING),
    R("reschedule with neither", on_scheduled(lambda s, m: reschedule(delay_ms=None)),
      C.INVALID_TIMING),
    R("reschedule to deliverAt 2^53",
      on_scheduled(lambda s, m: reschedule(deliver_at_ms=TOO_BIG)), C.INVALID_TIMING),
    R("delay one ms past the horizon", lambda s: S(delay_ms=HORIZON_MS + 1),
      C.HORIZON_EXCEEDED),
    R("deliverAt one ms past the horizon", lambda s: S(deliver_at_ms=T0_MS + HORIZON_MS + 1),
      C.HORIZON_EXCEEDED),
    R("deliverAt at 2^53 - 1: in range, past the horizon",
      lambda s: S(deliver_at_ms=TOO_BIG - 1), C.HORIZON_EXCEEDED),
    R("delay of 2^53 - 1: in range, past the horizon", lambda s: S(delay_ms=TOO_BIG - 1),
      C.HORIZON_EXCEEDED),
    R("reschedule one ms past the horizon",
      on_scheduled(lambda s, m: reschedule(delay_ms=HORIZON_MS + 1)), C.HORIZON_EXCEEDED),
    R("expireAt one ms past the lifetime", lambda s: S(expire_at_ms=T0_MS + LIFETIME_MS + 1),
      C.LIFETIME_EXCEEDED),
    R("lifetime_ms one ms too long", lambda s: S(lifetime_ms=LIFETIME_MS + 1),
      C.LIFETIME_EXCEEDED),
    R("expireAt at 2^53 - 1: in range, past the lifetime",
      lambda s: S(expire_at_ms=TOO_BIG - 1), C.LIFETIME_EXCEEDED),
    R("lifetime of 2^53 - 1: in range, too long", lambda s: S(lifetime_ms=TOO_BIG - 1),
      C.LIFETIME_EXCEEDED),
    R("expireAt one ms short of the window", lambda s: S(expire_at_ms=EXPIRE_MS - 1),
      C.EXPIRE_BEFORE_WINDOW),
    R("past deliverAt, window measured from bp",
      lambda s: S(deliver_at_ms=T0_MS - 5_000, expire_at_ms=T0_MS + WINDOW_MS - 1),
      C.EXPIRE_BEFORE_WINDOW),
    R("expireAt in the past", lambda s: S(expire_at_ms=T0_MS - 1), C.EXPIRE_BEFORE_WINDOW),
    R("expected version on an absent key", lambda s: S(expected_version=1), C.VERSION_MISMATCH),
    R("new content with a stale expected version",
      on_scheduled(lambda s, m: S(txn="txn-2", expected_version=0), S(expected_version=0)),
      C.VERSION_MISMATCH),
    R("stale version on cancel", on_scheduled(lambda s, m: cancel(version=m.version - 1)),
      C.VERSION_MISMATCH),
    R("stale version on reschedule", on_scheduled(lambda s, m: reschedule(version=m.version + 1)),
      C.VERSION_MISMATCH),
    R("new destination for a live timer",
      on_scheduled(lambda s, m: S(txn="txn-2", destination="elsewhere")), C.DESTINATION_CHANGED),
    R("new capability for a live timer", on_scheduled(lambda s, m: S(txn="2", capability=HANDOFF)),
      C.DESTINATION_CHANGED),
    # Rejected: Publish Admissions (never a Publish; see the generic checks).
    R("attempt id without the prefix",
      on_scheduled(lambda s, m: s.admission(attempt_id="attempt-1"), S(delay_ms=0)),
      C.ADMISSION_BAD_ATTEMPT_ID),
    R("attempt id of another generation",
      on_scheduled(lambda s, m: s.admission(attempt_id=f"{mid()}.2.1"), S(delay_ms=0)),
      C.ADMISSION_BAD_ATTEMPT_ID),
    R("enqueue retry of the winning admission", enqueue_retry_of_winner,
      C.ADMISSION_DUPLICATE_ATTEMPT),
    R("attempt id reused after a retriable failure", attempt_id_reused_after_retry,
      C.ADMISSION_DUPLICATE_ATTEMPT),
    R("retry reusing the unknown attempt's id",
      on_uncertain(lambda s, a: msgspec.structs.replace(due_admission(s), attempt_id=a)),
      C.ADMISSION_DUPLICATE_ATTEMPT),
    R("overtaken by a cancel", overtaken_by(cancel()), C.ADMISSION_STALE),
    R("overtaken by a reschedule", overtaken_by(reschedule(delay_ms=0)), C.ADMISSION_STALE),
    R("overtaken by a claim result (same generation, newer version)",
      overtaken_by_a_claim_result, C.ADMISSION_STALE),
    R("lost a race to another admission", loser_of_a_race, C.ADMISSION_STALE),
    R("never scheduled", never_scheduled_admission, C.ADMISSION_STALE),
    R("uncertain, no retries allowed", on_uncertain(lambda s, a: due_admission(s)),
      C.ADMISSION_STALE, config=NO_RETRIES),
    R("uncertain, retries used up",
      on_retry(lambda s, a1, a2: due_admission(s), (2, unknown())), C.ADMISSION_STALE,
      config=ONE_RETRY),
    R("uncertain, its retry would reach expireAt",
      after(unknown_at(EXPIRE_MS - BACKOFF_MS), lambda s: s.admission()), C.ADMISSION_STALE),
    R("uncertain, retry window closed", after(on_uncertain(expiry_of), due_admission),
      C.ADMISSION_STALE),
    R("retry overtaken by the unknown attempt's evidence", retry_overtaken_by_evidence,
      C.ADMISSION_STALE),
    R("lane closed", admit_at(ACTION_MS, ACTION_MS, ACTION_MS + 1, first=(CLOSED,)),
      C.ADMISSION_LANE_CLOSED),
    R("retry on a closed lane", retry_at(RETRY_MS, RETRY_MS, RETRY_MS + 10, first=(CLOSED,)),
      C.ADMISSION_LANE_CLOSED),
    R("capability differs from the pinned one",
      on_scheduled(lambda s, m: msgspec.structs.replace(s.admission(), capability=HANDOFF),
                   S(delay_ms=0)),
      C.ADMISSION_CAPABILITY_MISMATCH),
    R("latest reaches expireAt", admit_at(ACTION_MS, ACTION_MS, EXPIRE_MS),
      C.ADMISSION_EVIDENCE_INVALID),
    R("earliest before actionAt", admit_at(ACTION_MS, ACTION_MS - 1, ACTION_MS + 10),
      C.ADMISSION_EVIDENCE_INVALID),
    R("earliest at expireAt", admit_at(EXPIRE_MS - 1, EXPIRE_MS, EXPIRE_MS + 10),
      C.ADMISSION_EVIDENCE_INVALID),
    R("capacity not granted", admit_at(ACTION_MS, ACTION_MS, ACTION_MS + 10, granted=False),
      C.ADMISSION_EVIDENCE_INVALID),
    R("honest clock before deliverAt after an early claim result",
      early_claim_result(lambda s: s.admission()), C.ADMISSION_EVIDENCE_INVALID),
    R("retry whose earliest is one ms before its retry time",
      retry_at(RETRY_MS + 10, RETRY_MS - 1, RETRY_MS + 10), C.ADMISSION_EVIDENCE_INVALID),
    R("bp one ms before actionAt", admit_at(ACTION_MS - 1, ACTION_MS, ACTION_MS + 10),
      C.ADMISSION_BEFORE_ACTION_TIME),
    R("fast clock before deliverAt after an early claim result",
      early_claim_result(lambda s: s.admission(interval=interval_at(T0_MS + 10_010))),
      C.ADMISSION_BEFORE_ACTION_TIME),
    R("retry persisted one ms before its retry time",
      retry_at(RETRY_MS - 1, RETRY_MS, RETRY_MS + 10), C.ADMISSION_BEFORE_ACTION_TIME),
    R("bp at expireAt", admit_at(EXPIRE_MS, ACTION_MS, EXPIRE_MS - 1), C.ADMISSION_AFTER_EXPIRE),
    R("bp well after expireAt", admit_at(EXPIRE_MS + 5_000, ACTION_MS, ACTION_MS + 1),
      C.ADMISSION_AFTER_EXPIRE),
    R("retry persisted at expireAt", retry_at(EXPIRE_MS, RETRY_MS, EXPIRE_MS - 1),
      C.ADMISSION_AFTER_EXPIRE),
    # Rejected: outcomes.
    R("never admitted",
      on_scheduled(lambda s, m: k.PublishOutcome(f"{mid()}.1.9", mid(), 1, published())),
      C.OUTCOME_UNKNOWN_ATTEMPT),
    R("another generation", on_admitted(lambda s, a: k.PublishOutcome(a, mid(), 2, published())),
      C.OUTCOME_MISMATCH),
    R("another message",
      on_admitted(lambda s, a: k.PublishOutcome(a, mid("k2"), 1, published())),
      C.OUTCOME_MISMATCH),
    R("an old generation's attempt under the new generation",
      on_retry(lambda s, a1, a2: k.PublishOutcome(a2, mid(), 2, published()),
               (1, published(1)), schedule(txn="txn-2")),
      C.OUTCOME_MISMATCH),
    R("published twice", on_results((published(),), lambda s, a: s.outcome(a, published(1))),
      C.OUTCOME_ALREADY_RECORDED),
    R("published after not published",
      on_results((not_published(),), lambda s, a: s.outcome(a, published())),
      C.OUTCOME_ALREADY_RECORDED),
    R("unknown twice", on_results((unknown(),), lambda s, a: s.outcome(a, unknown())),
      C.OUTCOME_ALREADY_RECORDED),
    R("the unknown attempt found twice, the retry in flight",
      on_retry(lambda s, a1, a2: s.outcome(a1, published(5)), (1, published(1))),
      C.OUTCOME_ALREADY_RECORDED),
    R("unknown turned into not published",
      on_results((unknown(),), lambda s, a: s.outcome(a, not_published())),
      C.OUTCOME_ABSENCE_NOT_EVIDENCE),
    R("the unknown attempt not published, the retry in flight",
      on_retry(lambda s, a1, a2: s.outcome(a1, not_published("permanent"))),
      C.OUTCOME_ABSENCE_NOT_EVIDENCE),
    R("the old generation's unknown attempt not published",
      on_retry(lambda s, a1, a2: s.outcome(a1, not_published()), (2, published(2)),
               schedule(txn="txn-2")),
      C.OUTCOME_ABSENCE_NOT_EVIDENCE),
    R("a proof of absence for an unknown attempt",
      on_fenced(lambda s, aid: s.outcome(aid, proven_absent()), (unknown(),)),
      C.OUTCOME_ABSENCE_NOT_EVIDENCE),
    R("a proof of absence for a producer that cannot be fenced",
      on_admitted(lambda s, aid: s.outcome(aid, proven_absent())), C.OUTCOME_PROOF_INVALID),
    R("a proof of absence under another producer's fence",
      on_fenced(lambda s, aid: s.outcome(aid, proven_absent("nereus-dest.other"))),
      C.OUTCOME_PROOF_INVALID),
    R("a proof of absence after the attempt was published",
      on_fenced(lambda s, aid: s.outcome(aid, proven_absent()), (published(),)),
      C.OUTCOME_ALREADY_RECORDED),
    # Rejected: dead-letter copies.
    R("the copy recorded twice", dead_lettered(copy_written(), last=copy_written(offset=1)),
      C.DEAD_LETTER_NOT_PENDING, config=ONE_ATTEMPT),
    R("a copy of a delivered timer", on_results((published(),), lambda s, a: copy_written()(s)),
      C.DEAD_LETTER_NOT_PENDING),
    R("a copy of a pending timer", on_scheduled(lambda s, m: copy_written()(s)),
      C.DEAD_LETTER_NOT_PENDING),
    R("a copy of a timer never scheduled",
      lambda s: k.DeadLetterWritten(mid(), 1, dlq_evidence()), C.DEAD_LETTER_NOT_PENDING),
    R("a copy of a generation not yet made", dead_lettered(last=copy_written(generation=2)),
      C.DEAD_LETTER_NOT_PENDING, config=ONE_ATTEMPT),
    R("a copy of a superseded generation never dead-lettered",
      given(S(), S(txn="txn-2"), then=copy_written(generation=1)), C.DEAD_LETTER_NOT_PENDING),
    R("a copy of a superseded generation already recorded",
      dead_lettered(copy_written(), S(txn="txn-2"), last=copy_written(generation=1, offset=1)),
      C.DEAD_LETTER_NOT_PENDING, config=ONE_ATTEMPT),
    R("a copy recorded on a frozen shard, recorded twice",
      dead_lettered(FROZEN, copy_written(), last=copy_written(offset=1)),
      C.DEAD_LETTER_NOT_PENDING, config=ONE_ATTEMPT),
    # Rejected: claim results and expiry.
    R("stale version", on_scheduled(lambda s, m: claim(m, version_delta=-1)),
      C.CLAIM_RESULT_STALE),
    R("after admission", on_admitted(lambda s, a: claim(current(s))), C.CLAIM_RESULT_STALE),
    R("never scheduled", lambda s: k.ClaimResult(mid(), 1, 1, "c", "gone"), C.CLAIM_RESULT_STALE),
    R("uncertain and unarmed", on_uncertain(lambda s, a: claim(current(s))),
      C.CLAIM_RESULT_STALE, config=NO_RETRIES),
    R("uncertain, claimed before the retry window closed", claim_overtaken_by_window_close,
      C.CLAIM_RESULT_STALE),
    R("stale version", expire_at(EXPIRE_MS, EXPIRE_MS, version_delta=1), C.EXPIRE_STALE),
    R("after admission, with a valid proof", on_admitted(expiry_of, SHORT),
      C.EXPIRE_STALE),
    R("uncertain and unarmed, with a valid proof", on_uncertain(expiry_of, SHORT),
      C.EXPIRE_STALE, config=NO_RETRIES),
    R("retry window already closed", after(on_uncertain(expiry_of, SHORT), expiry_proof),
      C.EXPIRE_STALE),
    R("bp one ms before expireAt", expire_at(EXPIRE_MS - 1, EXPIRE_MS), C.EXPIRE_PREMATURE),
    R("retry window, bp one ms before expireAt",
      expire_at(EXPIRE_MS - 1, EXPIRE_MS, setup=lambda s: uncertain(s, SHORT)),
      C.EXPIRE_PREMATURE),
    R("earliest one ms before expireAt", expire_at(EXPIRE_MS, EXPIRE_MS - 1),
      C.EXPIRE_EVIDENCE_INVALID),
    R("retry window, earliest one ms before expireAt",
      expire_at(EXPIRE_MS, EXPIRE_MS - 1, setup=lambda s: uncertain(s, SHORT)),
      C.EXPIRE_EVIDENCE_INVALID),
)
# fmt: on


def _param(row: Row) -> object:
    marks = [pytest.mark.xfail(strict=True, reason=row.bug)] if row.bug else []
    return pytest.param(row, id=f"{row.code.value}[{row.name.replace(' ', '_')}]", marks=marks)


def _run(row: Row) -> Result:
    shard = Shard(config=row.config)
    record = row.build(shard)
    before = shard.state
    entry = k.LogEntry(before.meta.position + row.offset, shard.now_ms, record)
    after, effects = k.reduce(before, entry)
    k.assert_invariants(after)
    return Result(before, after, entry, effects)


@pytest.mark.parametrize("row", [_param(row) for row in ROWS])
def test_code(row: Row) -> None:
    r = _run(row)
    assert (r.outcome.code, r.outcome.applied) == (row.code, row.code in APPLIED)
    assert r.outcome.position == r.entry.position
    assert r.outcome.record_type == record_type(r.entry.record)
    if not r.outcome.applied:
        _assert_rejection_changes_nothing(r)
    _assert_unknown_attempts_stay_open(r)
    if row.check is not None:
        row.check(r)


def _assert_rejection_changes_nothing(r: Result) -> None:
    if r.outcome.code in POSITION:
        # Not part of the log at all: the very same state object, and only the verdict.
        assert r.after is r.before
        assert r.effects == (r.outcome,)
        return
    assert tables(r.after) == tables(r.before)
    # The position is consumed. A persistence time out of range is not one to hold later
    # entries to, so it does not move the last persistence time.
    bp = r.entry.persisted_at_ms
    last = r.before.meta.last_persisted_at_ms
    if r.outcome.code is not C.PERSISTED_AT_OUT_OF_RANGE:
        last = max(last, bp)
    assert r.after.meta == msgspec.structs.replace(
        r.before.meta, position=r.entry.position, last_persisted_at_ms=last
    )
    rest = r.effects[1:]
    assert not any(isinstance(e, Publish) for e in rest)
    record = r.entry.record
    if isinstance(record, k.PublishAdmission) and r.outcome.code not in (
        C.ADMISSION_DUPLICATE_ATTEMPT,
        C.PERSISTED_AT_OUT_OF_RANGE,
    ):
        # A losing Admission drops only its own claim, never the winner's.
        code = r.outcome.code
        assert rest == (RevokeClaim(record.message_id, record.generation, code, record.claim_id),)
        assert r.outcome.attempt_id == record.attempt_id
    else:
        # Includes the enqueue retry of a winner: revoking would stop the send in flight.
        assert rest == ()


def _assert_unknown_attempts_stay_open(r: Result) -> None:
    """An UNKNOWN attempt may be at the destination: whatever the entry, it stays UNKNOWN and
    an open obligation, unless the entry is its own positive evidence."""
    record = r.entry.record
    for aid in unknown_ids(r.before):
        found = (
            r.outcome.applied
            and isinstance(record, k.PublishOutcome)
            and record.attempt_id == aid
            and isinstance(record.result, k.Published)
        )
        now = r.attempt(aid)
        if found:
            assert now.status is k.AttemptStatus.PUBLISHED
            assert aid not in obligations(r.after)
        else:
            assert now.status is k.AttemptStatus.UNKNOWN
            assert aid in obligations(r.after)


def test_every_code_has_a_row() -> None:
    missing = set(Code) - {row.code for row in ROWS if row.bug is None}
    assert not missing, f"codes without a passing table row: {sorted(missing)}"


def test_row_ids_are_unique() -> None:
    ids = [(row.code, row.name) for row in ROWS]
    assert len(ids) == len(set(ids))


def test_every_code_is_documented() -> None:
    assert set(CODE_DOCS) == set(Code)
    assert all(doc.strip() for doc in CODE_DOCS.values())


def test_applied_and_position_codes_are_the_expected_ones() -> None:
    assert APPLIED_CODES == APPLIED
    assert POSITION_CODES == POSITION
    assert POSITION.isdisjoint(APPLIED)


def test_removed_codes_stay_removed() -> None:
    assert REMOVED.isdisjoint({code.value for code in Code})


def test_timing_limits_leave_a_window_at_the_horizon() -> None:
    # A timer scheduled at the horizon must still be able to keep the minimum window.
    with pytest.raises(ValueError, match="max_message_lifetime_ms"):
        k.TimingLimits(
            min_delivery_window_ms=WINDOW_MS,
            max_delay_horizon_ms=HORIZON_MS,
            max_message_lifetime_ms=HORIZON_MS + WINDOW_MS - 1,
        )
    assert TIGHT.limits.max_message_lifetime_ms == HORIZON_MS + WINDOW_MS
