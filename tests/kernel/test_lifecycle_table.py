"""Drive every row of the lifecycle and attempt tables, each against its expected verdict.

Rows are replayed on real states. A *scene* is a short script of real records, applied
through the `Shard` harness (which checks the invariants after every step), that leaves
message k1 in one shape of a status: a SCHEDULED timer fresh, in backoff, after a claim
result, or as a new generation while an attempt of the old one is still open; an UNCERTAIN
one armed, or unarmed for each of its reasons; a DELIVERED one with the retry still in
flight; and so on. Each scene declares what it builds (status, armed, every attempt and its
status, the budget spent) and `build` checks the declaration before anything relies on it.

From a scene, `situations` lists what each op meets there: the effective status (an outcome
for an attempt of a superseded generation meets `OLD_GENERATION`) and the condition, made
for real (`behind_unknown` is an outcome of the retry while the first attempt is UNKNOWN;
budget conditions are made with `max_attempts`). The row governing a situation comes from
the literal table in `tests/support/lifecycle_expected.py`, never from `kernel.rules` (the code
under
test), and each row is driven from every situation it governs, so a '-' row is proven in
every shape of its status. An edited kernel row then fails the rows it changes here and the
table comparison; a row no situation reaches fails its own test and the meta-test; a
situation without a row fails the totality test. Collecting the tests looks nothing up in
the kernel, so a half-edited kernel table fails tests instead of aborting the run. Nothing
is skipped: a new row needs a line in the expected table and a scene here.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import msgspec
import pytest

from nereus import kernel as k
from nereus.kernel import rules as kernel_rules
from nereus.kernel.model import OPEN_ATTEMPT_STATUSES, Table
from nereus.kernel.validation import action_at
from tests.support.builders import (
    QUEUE,
    TENANT,
    Shard,
    expiry_proof,
    interval_at,
    mid,
    not_published,
    obligations,
    published,
    schedule,
    tables,
    unknown,
)
from tests.support.lifecycle_expected import (
    ABSENT,
    ANY,
    APPLIED_CODES,
    ATTEMPT_ROWS,
    LIFECYCLE,
    OLD_GENERATION,
    SAME,
    AttemptRow,
    Row,
    expected_attempt_row,
    expected_row,
)

S, P, U, D = k.Status.SCHEDULED, k.Status.PUBLISHING, k.Status.UNCERTAIN, k.Status.DELIVERED
C, E, X = k.Status.CANCELED, k.Status.EXPIRED, k.Status.DEAD_LETTERED
DEFAULT = k.KernelConfig()

# The requests the scenes and conditions are made of. `identical` resends the exact record
# that made the current generation; `changed` sends one that differs in its txn;
# `reused_txn` changes the timing but repeats the current generation's txn.
FIRST = schedule(txn="txn-1", delay_ms=1_000)
SUPERSEDE = schedule(txn="txn-2", delay_ms=1_000)  # new content for a finished timer
CHANGED = schedule(txn="txn-3", delay_ms=1_000)
RESCHEDULE = k.Reschedule(TENANT, QUEUE, "k1", "txn-r1", delay_ms=2_000)
CHANGED_RESCHEDULE = k.Reschedule(TENANT, QUEUE, "k1", "txn-r2", delay_ms=3_000)
CANCEL = k.Cancel(TENANT, QUEUE, "k1")

Result = k.Published | k.NotPublished | k.Unknown
STATUSES = (ABSENT, *(str(s) for s in k.Status))
OUTCOME_RESULTS: dict[str, Result] = {
    "outcome_published": published(),
    "outcome_retriable": not_published("retriable"),
    "outcome_lane_unavailable": not_published("lane_unavailable", "lane_down"),
    "outcome_permanent": not_published("permanent", "rejected"),
    "outcome_unknown": unknown(),
}
# The conditions each op's verdict can depend on ('-' alone: the status decides).
OP_CONDITIONS: dict[str, tuple[str, ...]] = {
    "schedule": ("identical", "changed", "reused_txn"),
    "reschedule": ("identical", "changed", "reused_txn", "alone", "behind_unknown", "published"),
    "cancel": ("alone", "behind_unknown", "published"),
    "admission": ("armed", "unarmed"),
    "claim_result": ("budget_left", "budget_left_behind_unknown", "budget_spent", "unarmed"),
    "expire": ("armed", "unarmed"),
    "outcome_published": (),
    "outcome_retriable": ("alone", "behind_unknown"),
    "outcome_lane_unavailable": ("alone", "behind_unknown"),
    "outcome_permanent": ("budget_left", "budget_left_behind_unknown", "budget_spent"),
    "outcome_unknown": (),
    "dead_letter_written": ("pending",),
}


def _result_tag(result: Result) -> str:
    tag = type(result).__struct_config__.tag
    assert isinstance(tag, str)
    return tag


def _ok(outcome: k.EntryOutcome) -> None:
    assert outcome.applied, outcome


def _copy_written(shard: Shard, *, old: bool = False) -> k.DeadLetterWritten:
    """The runtime's report that the dead-letter copy of k1's current (or left) generation
    is written."""
    m = shard.message()
    generation = (m.generation - (1 if old else 0)) if m else 1
    return k.DeadLetterWritten(mid(), generation, k.Evidence(f"{QUEUE}.dlq", 0, 0, shard.now_ms))


def _claim(shard: Shard) -> k.ClaimResult:
    m = shard.message()
    gen, version = (m.generation, m.version) if m else (1, 1)
    return k.ClaimResult(mid(), gen, version, "claim-x", "payload_missing")


# Scenes -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scene:
    """A script of real records and what it leaves behind. Script steps: `schedule` (FIRST)
    and `supersede` (new content, a new generation), each followed by RESCHEDULE when the
    scene is built for a reschedule row; `admit A1` (labels an attempt); `unknown A1`,
    `published A1`, `retriable A1`, `permanent A1` (its outcome); `claim`; `expire` (the
    expiry proof); `cancel`. Every step must be applied."""

    name: str
    status: str
    script: tuple[str, ...] = ()
    attempts: tuple[tuple[str, str], ...] = ()  # every labelled attempt and its status
    armed: bool = False  # UNCERTAIN only: the retry has work in the timeline
    spent: int = 0  # attempts_spent of the current generation
    max_attempts: int | None = None  # the budget the script needs exactly, if any
    max_uncertain_retries: int = DEFAULT.max_uncertain_retries
    superseded: bool = False  # the attempts belong to a generation the message has left
    old_copy_owed: bool = False  # superseded only: the left generation still owes its copy

    def config(self, max_attempts: int | None = None) -> k.KernelConfig:
        return k.KernelConfig(
            max_attempts=max_attempts or self.max_attempts or DEFAULT.max_attempts,
            max_uncertain_retries=self.max_uncertain_retries,
        )

    def open_attempts(self) -> list[str]:
        """The labels of the current generation's open attempts."""
        if self.superseded:
            return []
        return [label for label, st in self.attempts if st in OPEN_ATTEMPT_STATUSES]

    def has_work(self) -> bool:
        return self.status == S or self.armed

    def copy_owed(self) -> bool:
        """A DEAD_LETTERED generation whose dead-letter copy is not recorded yet."""
        return self.status == X and "copy written" not in self.script

    def published(self) -> bool:
        """A dead-lettered generation one of whose attempts was later proven published."""
        return (
            self.status == X
            and not self.superseded
            and any(st == k.AttemptStatus.PUBLISHED for _, st in self.attempts)
        )


UNKNOWN_THEN_RETRY = ("schedule", "admit A1", "unknown A1", "admit A2")
PUB, NOT, UNK, PUBLISHING = "PUBLISHED", "NOT_PUBLISHED", "UNKNOWN", "PUBLISHING"

SCENES: tuple[Scene, ...] = (
    Scene("absent", ABSENT),
    Scene("scheduled", S, ("schedule",)),
    Scene("in backoff", S, ("schedule", "admit A1", "retriable A1"), (("A1", NOT),)),
    Scene("after an early claim result", S, ("schedule", "claim"), spent=1),
    Scene(
        "new generation, the old retry in flight",
        S,
        (*UNKNOWN_THEN_RETRY, "published A1", "supersede"),
        (("A1", PUB), ("A2", PUBLISHING)),
        superseded=True,
    ),
    Scene(
        "new generation, the old attempt unknown",
        S,
        (*UNKNOWN_THEN_RETRY, "published A2", "supersede"),
        (("A1", UNK), ("A2", PUB)),
        superseded=True,
    ),
    Scene(
        "new generation after dead-lettering behind an unknown attempt",
        S,
        (*UNKNOWN_THEN_RETRY, "permanent A2", "copy written", "supersede"),
        (("A1", UNK), ("A2", NOT)),
        max_attempts=1,
        superseded=True,
    ),
    Scene("publishing", P, ("schedule", "admit A1"), (("A1", PUBLISHING),)),
    Scene(
        "publishing after backoff",
        P,
        ("schedule", "admit A1", "retriable A1", "admit A2"),
        (("A1", NOT), ("A2", PUBLISHING)),
    ),
    Scene("retry in flight", P, UNKNOWN_THEN_RETRY, (("A1", UNK), ("A2", PUBLISHING))),
    Scene("armed", U, ("schedule", "admit A1", "unknown A1"), (("A1", UNK),), armed=True),
    Scene(
        "armed, two unknown",
        U,
        (*UNKNOWN_THEN_RETRY, "unknown A2"),
        (("A1", UNK), ("A2", UNK)),
        armed=True,
    ),
    Scene(
        "armed, the retry not published",
        U,
        (*UNKNOWN_THEN_RETRY, "retriable A2"),
        (("A1", UNK), ("A2", NOT)),
        armed=True,
    ),
    Scene(
        "armed after a claim result",
        U,
        ("schedule", "admit A1", "unknown A1", "claim"),
        (("A1", UNK),),
        armed=True,
        spent=1,
    ),
    Scene(
        "unarmed, no retries allowed",
        U,
        ("schedule", "admit A1", "unknown A1"),
        (("A1", UNK),),
        max_uncertain_retries=0,
    ),
    Scene(
        "unarmed, retries used up",
        U,
        (*UNKNOWN_THEN_RETRY, "unknown A2"),
        (("A1", UNK), ("A2", UNK)),
        max_uncertain_retries=1,
    ),
    Scene(
        "unarmed, retry window closed",
        U,
        ("schedule", "admit A1", "unknown A1", "expire"),
        (("A1", UNK),),
    ),
    Scene("delivered", D, ("schedule", "admit A1", "published A1"), (("A1", PUB),)),
    Scene(
        "delivered by the unknown attempt, retry in flight",
        D,
        (*UNKNOWN_THEN_RETRY, "published A1"),
        (("A1", PUB), ("A2", PUBLISHING)),
    ),
    Scene(
        "delivered by the retry, first attempt unknown",
        D,
        (*UNKNOWN_THEN_RETRY, "published A2"),
        (("A1", UNK), ("A2", PUB)),
    ),
    Scene("canceled", C, ("schedule", "cancel")),
    Scene("expired", E, ("schedule", "expire")),
    Scene(
        "dead-lettered",
        X,
        ("schedule", "admit A1", "permanent A1"),
        (("A1", NOT),),
        spent=1,
        max_attempts=1,
    ),
    Scene("dead-lettered by a claim result", X, ("schedule", "claim"), spent=1, max_attempts=1),
    Scene(
        "dead-lettered, its copy written",
        X,
        ("schedule", "claim", "copy written"),
        spent=1,
        max_attempts=1,
    ),
    Scene(
        "new generation while the dead-letter copy is owed",
        S,
        ("schedule", "admit A1", "permanent A1", "supersede"),
        (("A1", NOT),),
        max_attempts=1,
        superseded=True,
        old_copy_owed=True,
    ),
    Scene(
        "dead-lettered behind an unknown attempt",
        X,
        (*UNKNOWN_THEN_RETRY, "permanent A2"),
        (("A1", UNK), ("A2", NOT)),
        spent=1,
        max_attempts=1,
    ),
    Scene(
        "dead-lettered, then its unknown attempt proven published",
        X,
        (*UNKNOWN_THEN_RETRY, "permanent A2", "published A1"),
        (("A1", PUB), ("A2", NOT)),
        spent=1,
        max_attempts=1,
    ),
    Scene(
        "dead-lettered by a claim result while uncertain",
        X,
        ("schedule", "admit A1", "unknown A1", "claim"),
        (("A1", UNK),),
        spent=1,
        max_attempts=1,
    ),
)


@dataclass
class Built:
    attempts: dict[str, str]  # label -> attempt id
    made_by: k.Schedule | k.Reschedule | None  # the request that made the current generation


def build(shard: Shard, scene: Scene, *, via_reschedule: bool = False) -> Built:
    """Run the scene's script on `shard` and check that it built what it declares."""
    built = Built({}, None)
    for step in scene.script:
        verb, _, label = step.partition(" ")
        match verb:
            case "schedule" | "supersede":
                built.made_by = FIRST if verb == "schedule" else SUPERSEDE
                _ok(shard.apply(built.made_by))
                if via_reschedule:
                    built.made_by = RESCHEDULE
                    _ok(shard.apply(RESCHEDULE))
            case "admit":
                built.attempts[label] = shard.admit()
            case "claim":
                _ok(shard.apply(_claim(shard)))
            case "expire":
                _ok(shard.apply(expiry_proof(shard)))
            case "cancel":
                _ok(shard.apply(CANCEL))
            case "copy":
                _ok(shard.apply(_copy_written(shard)))
            case "unknown" | "published" | "retriable" | "permanent":
                result = {
                    "unknown": OUTCOME_RESULTS["outcome_unknown"],
                    "published": OUTCOME_RESULTS["outcome_published"],
                    "retriable": OUTCOME_RESULTS["outcome_retriable"],
                    "permanent": OUTCOME_RESULTS["outcome_permanent"],
                }[verb]
                _ok(shard.apply(shard.outcome(built.attempts[label], result)))
            case _:
                raise AssertionError(f"unknown scene step {step!r}")

    m = shard.message()
    if scene.status == ABSENT:
        assert m is None
        return built
    assert m is not None
    assert (m.status, m.has_work, m.attempts_spent) == (
        scene.status,
        scene.has_work(),
        scene.spent,
    ), scene.name
    assert set(built.attempts) == {label for label, _ in scene.attempts}, scene.name
    for label, status in scene.attempts:
        attempt = shard.state.attempt(built.attempts[label].encode())
        assert attempt is not None and attempt.status == status, (scene.name, label)
        assert (attempt.generation < m.generation) is scene.superseded, scene.name
    assert m.open_attempts == len(scene.open_attempts()), scene.name
    owed = {
        d.generation
        for _, d in shard.state.items(Table.DEAD_LETTERS)
        if isinstance(d, k.DeadLetterPending)
    }
    expected = {m.generation} if scene.copy_owed() else set()
    if scene.old_copy_owed:
        left = shard.state.attempt(built.attempts[scene.attempts[0][0]].encode())
        assert left is not None
        expected.add(left.generation)
    assert owed == expected, scene.name
    return built


# Situations: what an op meets in a scene ---------------------------------------------------


@dataclass(frozen=True)
class Situation:
    op: str
    where: str  # the status the verdict is looked up under (OLD_GENERATION for old attempts)
    condition: str
    subject: str | None = None  # the labelled attempt an outcome is for
    max_attempts: int | None = None  # the budget that makes a budget condition
    old: bool = False  # dead_letter_written: a copy of the generation the message left


def _budget(scene: Scene, condition: str) -> tuple[bool, int | None]:
    """(possible, max_attempts) for a budget condition: spending one more attempt must use
    the last one (budget_spent) or leave exactly one (budget_left...)."""
    if condition == "budget_spent":
        need = scene.spent + 1
    elif condition.startswith("budget_left"):
        need = scene.spent + 2
    else:
        return True, None
    return scene.max_attempts in (None, need), need


def _conditions(scene: Scene, op: str, subject: str | None) -> list[str]:
    """The conditions `op` can meet in `scene`, made the way the kernel computes them."""
    behind = bool([a for a in scene.open_attempts() if a != subject])
    match op:
        case "cancel" | "reschedule" if scene.status == X:
            if scene.published():
                return ["published"]
            return ["behind_unknown" if scene.open_attempts() else "alone"]
        case "schedule" | "reschedule":
            return [ANY] if scene.status == ABSENT else ["identical", "changed", "reused_txn"]
        case "admission" | "expire":
            if scene.status == U:
                return ["armed" if scene.armed else "unarmed"]
            return [ANY]
        case "claim_result":
            if scene.status == U and not scene.armed:
                return ["unarmed"]
            if scene.has_work():
                left = "budget_left_behind_unknown" if behind else "budget_left"
                return [left, "budget_spent"]
            return [ANY]
        case "outcome_retriable" | "outcome_lane_unavailable" if scene.status == P:
            return ["behind_unknown" if behind else "alone"]
        case "outcome_permanent" if scene.status == P:
            return ["budget_left_behind_unknown" if behind else "budget_left", "budget_spent"]
    return [ANY]


def situations(scene: Scene) -> Iterator[Situation]:
    for op in OP_CONDITIONS:
        if op == "dead_letter_written":
            # A copy of the current generation, and of the one a superseded scene left.
            yield Situation(op, scene.status, "pending" if scene.copy_owed() else ANY)
            if scene.superseded:
                owed = "pending" if scene.old_copy_owed else ANY
                yield Situation(op, OLD_GENERATION, owed, old=True)
            continue
        subjects: list[str | None] = [None]
        where = scene.status
        if op in OUTCOME_RESULTS:
            # Outcomes exist only for an attempt the ledger still lets change.
            tag = _result_tag(OUTCOME_RESULTS[op])
            subjects = [label for label, st in scene.attempts if _attempt_changes(st, tag)]
            where = OLD_GENERATION if scene.superseded else scene.status
        for subject in subjects:
            for condition in _conditions(scene, op, subject):
                possible, need = _budget(scene, condition)
                if possible:
                    yield Situation(op, where, condition, subject, need)


def _attempt_changes(status: str, result: str) -> bool:
    row = expected_attempt_row(status, result)
    return row is not None and row.to_status != SAME


def governing(situation: Situation) -> Row | None:
    """The expected row that decides the situation (None: the table has none)."""
    return expected_row(situation.op, situation.where, situation.condition)


@dataclass(frozen=True)
class Case:
    scene: Scene
    situation: Situation


def cases(row: Row) -> list[Case]:
    return [
        Case(scene, sit)
        for scene in SCENES
        for sit in situations(scene)
        if sit.op == row.op and governing(sit) == row
    ]


def _case_id(row: Row, case: Case | None) -> str:
    cond = "any" if row.condition == ANY else row.condition
    base = f"{row.op}:{row.from_status}:{cond}"
    if case is None:
        return f"{base}[NO SCENE]"
    sit = case.situation
    extra = [case.scene.name.replace(" ", "_")]
    if sit.subject:
        extra.append(sit.subject)
    if sit.condition != row.condition:
        extra.append(sit.condition)
    if sit.old:
        extra.append("old_generation")
    return f"{base}[{'/'.join(extra)}]"


def _lifecycle_params() -> Iterator[object]:
    for row in LIFECYCLE:
        found = cases(row)
        if not found:
            yield pytest.param(row, None, id=_case_id(row, None))
        for case in found:
            yield pytest.param(row, case, id=_case_id(row, case))


def op_record(shard: Shard, built: Built, sit: Situation) -> k.Record:
    """The record for the situation's op, built from the message as it now stands."""
    m = shard.message()
    match sit.op:
        case "schedule":
            made_by = built.made_by
            if sit.condition == "identical":
                assert isinstance(made_by, k.Schedule)
                return made_by
            if sit.condition == "reused_txn":
                assert m is not None
                return schedule(txn=m.txn, delay_ms=7_000)
            return CHANGED
        case "reschedule":
            if sit.condition == "identical":
                assert isinstance(built.made_by, k.Reschedule)
                return built.made_by
            if sit.condition == "reused_txn":
                assert m is not None
                return k.Reschedule(TENANT, QUEUE, "k1", m.txn, delay_ms=7_000)
            return CHANGED_RESCHEDULE
        case "cancel":
            return CANCEL
        case "admission":
            if m is None:
                aid = f"{k.attempt_prefix(mid(), 1)}1"
                interval = interval_at(shard.now_ms)
                return k.PublishAdmission(
                    mid(), 1, 1, aid, "c", "n", "d", k.Capability(), interval, k.Capacity(True)
                )
            # Evidence and time that would qualify, so only the status can decide.
            shard.now_ms = max(shard.now_ms, m.action_at_ms + 10)
            return shard.admission()
        case "claim_result":
            return _claim(shard)
        case "expire":
            if m is None:
                return k.Expire(mid(), 1, 1, interval_at(shard.now_ms))
            return expiry_proof(shard)  # valid evidence: only the status can decide
        case "dead_letter_written":
            return _copy_written(shard, old=sit.old)
        case op if op in OUTCOME_RESULTS and sit.subject is not None:
            return shard.outcome(built.attempts[sit.subject], OUTCOME_RESULTS[op])
    raise AssertionError(f"cannot drive {sit}")


def _run(case: Case) -> tuple[Shard, Built, k.State, k.Record, k.EntryOutcome]:
    scene, sit = case.scene, case.situation
    shard = Shard(config=scene.config(sit.max_attempts))
    built = build(shard, scene, via_reschedule=sit.op == "reschedule")
    record = op_record(shard, built, sit)
    before_state = shard.state
    return shard, built, before_state, record, shard.apply(record)


# The lifecycle rows -------------------------------------------------------------------------

LEDGER_FIELDS = ("version", "open_attempts", "updated_at_ms", "updated_position")


@pytest.mark.parametrize(("row", "case"), list(_lifecycle_params()))
def test_lifecycle_row(row: Row, case: Case | None) -> None:
    if case is None:
        pytest.fail(f"no scene reaches {row}: add one")
    shard, built, before_state, record, outcome = _run(case)
    before = before_state.message(mid().encode())
    after = shard.message()
    effects = shard.last_effects

    assert outcome.code == row.code
    assert outcome.applied is (row.code in APPLIED_CODES)
    if row.to_status == SAME:
        assert (after and after.status) == (before and before.status)
    else:
        assert after is not None and after.status == row.to_status
    if row.new_generation:
        assert after is not None
        assert after.generation == (before.generation + 1 if before else 1)
    elif before is not None:
        assert after is not None and after.generation == before.generation
    if not outcome.applied or row.code == k.Code.UNCHANGED:
        assert tables(shard.state) == tables(before_state)
        # Nothing happens but the verdict; a refused Admission drops its own claim only.
        own: tuple[k.Effect, ...] = ()
        if isinstance(record, k.PublishAdmission):
            code = k.Code(row.code)
            own = (k.RevokeClaim(record.message_id, record.generation, code, record.claim_id),)
        assert effects[1:] == own
    sends = [e for e in effects if isinstance(e, k.Publish)]
    assert len(sends) == (1 if row.code == k.Code.ADMITTED else 0)
    dead = [e for e in effects if isinstance(e, k.DeadLetter)]
    assert len(dead) == (1 if row.to_status == X else 0)

    # Obligations: only an Admission opens one (its own), and only this outcome's own
    # attempt can close one. The UNKNOWN attempt's survives retries, supersession, expiry
    # and dead-lettering alike.
    opened = obligations(shard.state) - obligations(before_state)
    closed = obligations(before_state) - obligations(shard.state)
    expected_open: set[str] = set()
    if isinstance(record, k.PublishAdmission) and row.code == k.Code.ADMITTED:
        expected_open = {record.attempt_id}
    assert opened == expected_open
    subject = case.situation.subject
    assert closed <= ({built.attempts[subject]} if subject else set())
    if subject:
        assert outcome.attempt_id == built.attempts[subject]

    assert before is not None or row.from_status == ABSENT
    if outcome.applied and row.op not in OUTCOME_RESULTS:
        _assert_claims_revoked(row, before, effects)
    if outcome.applied and row.op in OUTCOME_RESULTS:
        assert isinstance(record, k.PublishOutcome)
        _assert_claim_released(record, before_state, effects)
    if before is None or after is None:
        return
    if row.op in OUTCOME_RESULTS and row.to_status == SAME:
        _assert_ledger_only(row, before, after, effects)
    if row.code == k.Code.DEAD_LETTER_RECORDED:
        assert isinstance(record, k.DeadLetterWritten)
        _assert_copy_recorded(row, before_state, shard.state, record)
    if row.code == k.Code.ADMITTED:
        _assert_admitted(before, after, sends[0])
    failed = row.op in OUTCOME_RESULTS and row.to_status not in (SAME, D)
    if failed or row.code == k.Code.CLAIM_RESULT_RECORDED:
        _assert_retry(shard, before, after)
    if row.code == k.Code.RETRY_WINDOW_CLOSED:
        assert (after.status, after.has_work, before.has_work) == (U, False, True)


def _assert_claims_revoked(
    row: Row, before: k.Message | None, effects: tuple[k.Effect, ...]
) -> None:
    """Whatever takes a generation's work away from it revokes the local claims on that
    work: a cancel, an expiry, a closed retry window, a superseding command; a claim result
    revokes its own claim. Nothing else revokes anything."""
    revokes = [e for e in effects if isinstance(e, k.RevokeClaim)]
    expected: list[k.RevokeClaim] = []
    if before is not None:
        gone = row.code in (k.Code.CANCELED, k.Code.EXPIRED, k.Code.RETRY_WINDOW_CLOSED)
        if row.code == k.Code.CLAIM_RESULT_RECORDED:
            code = k.Code(row.code)
            expected = [k.RevokeClaim(before.message_id, before.generation, code, "claim-x")]
        elif gone or (row.new_generation and before.has_work):
            code = k.Code(row.code)
            expected = [k.RevokeClaim(before.message_id, before.generation, code)]
    assert revokes == expected


def _assert_claim_released(
    record: k.PublishOutcome, before: k.State, effects: tuple[k.Effect, ...]
) -> None:
    """A recorded outcome releases the claim its attempt was sent under, and only that one
    (never the claim of a retry that may be in flight for the same message): the runtime
    lets go of a claim on this effect alone."""
    attempt = before.attempt(record.attempt_id.encode())
    assert attempt is not None
    released = k.RevokeClaim(
        attempt.message_id, attempt.generation, k.Code.OUTCOME_RECORDED, attempt.claim_id
    )
    assert [e for e in effects if isinstance(e, k.RevokeClaim)] == [released]


def _assert_ledger_only(
    row: Row, before: k.Message, after: k.Message, effects: tuple[k.Effect, ...]
) -> None:
    """An outcome for a finished or superseded generation changes the ledger only: the
    message keeps its status, budget, work; a superseded one is not touched. The one thing
    a finished message may gain is evidence: a dead-lettered message whose unknown attempt
    is proven published records where it went (once)."""
    if row.from_status == OLD_GENERATION:
        assert after == before
        return
    same = {name: getattr(before, name) for name in LEDGER_FIELDS}
    gained = row.op == "outcome_published" and row.from_status == X and before.evidence is None
    if gained:
        assert after.evidence is not None and after.delivered_attempt_id is not None
        same |= {"evidence": None, "delivered_attempt_id": None}
    assert msgspec.structs.replace(after, **same) == before
    assert [e for e in effects[1:] if not isinstance(e, k.RevokeClaim)] == []


def _assert_copy_recorded(
    row: Row, before: k.State, after: k.State, record: k.DeadLetterWritten
) -> None:
    """The owed copy is closed (row and payload reference gone); the message keeps the
    copy's evidence, unless it has moved on to a later generation, which is not touched."""
    key = k.dead_letter_key(record.message_id, record.generation)
    assert before.dead_letter(key) is not None and after.dead_letter(key) is None
    was, now = before.message(mid().encode()), after.message(mid().encode())
    assert was is not None and now is not None
    if row.from_status == OLD_GENERATION:
        assert now == was
    else:
        assert now.dead_letter_evidence == record.evidence and now.version == was.version + 1
        assert msgspec.structs.replace(
            now, version=was.version, updated_at_ms=was.updated_at_ms,
            updated_position=was.updated_position, dead_letter_evidence=None,
        ) == was  # fmt: skip


def _assert_admitted(before: k.Message, after: k.Message, send: k.Publish) -> None:
    retry = before.status == U
    assert after.uncertain_retries == before.uncertain_retries + (1 if retry else 0)
    assert after.attempts_admitted == before.attempts_admitted + 1
    assert after.open_attempts == before.open_attempts + 1
    assert not after.has_work
    assert send.action_at_ms == before.action_at_ms
    assert send.attempt_id == after.last_attempt_id


def _assert_retry(shard: Shard, before: k.Message, after: k.Message) -> None:
    """After a failure (or UNKNOWN) the retry is keyed at max(bp + backoff, first actionAt):
    clipped to expireAt while SCHEDULED; armed while UNCERTAIN only with retries left and a
    retry time before expireAt; nothing once DEAD_LETTERED."""
    cfg = shard.config
    assert after.failures == before.failures + 1
    first = action_at(after.deliver_at_ms, after.capability)
    retry_at = max(shard.now_ms + cfg.backoff_ms(after.failures), first)
    if after.status == S:
        assert after.has_work and after.action_at_ms == min(retry_at, after.expire_at_ms)
    elif after.status == U:
        armed = after.uncertain_retries < cfg.max_uncertain_retries and (
            retry_at < after.expire_at_ms
        )
        assert after.has_work is armed
        if armed:
            assert after.action_at_ms == retry_at
    else:
        assert after.status == X and not after.has_work


# The attempt ledger -------------------------------------------------------------------------

RESULTS: dict[str, tuple[Result, ...]] = {
    "PUBLISHED": (published(7),),
    "NOT_PUBLISHED": tuple(
        not_published(d, "e") for d in ("retriable", "permanent", "lane_unavailable")
    ),
    "UNKNOWN": (unknown("timeout"),),
}


@dataclass(frozen=True)
class AttemptCase:
    scene: Scene
    label: str
    result: Result


def attempt_cases(arule: AttemptRow) -> list[AttemptCase]:
    return [
        AttemptCase(scene, label, result)
        for scene in SCENES
        for label, status in scene.attempts
        if status == arule.from_status
        for result in RESULTS[arule.result]
    ]


def _attempt_params() -> Iterator[object]:
    for arule in ATTEMPT_ROWS:
        found = attempt_cases(arule)
        base = f"{arule.from_status}->{arule.result}"
        if not found:
            yield pytest.param(arule, None, id=f"{base}[NO SCENE]")
        for case in found:
            kind = f"{case.result.disposition}/" if isinstance(case.result, k.NotPublished) else ""
            scene = case.scene.name.replace(" ", "_")
            yield pytest.param(arule, case, id=f"{base}[{kind}{scene}/{case.label}]")


@pytest.mark.parametrize(("arule", "case"), list(_attempt_params()))
def test_attempt_row(arule: AttemptRow, case: AttemptCase | None) -> None:
    if case is None:
        pytest.fail(f"no scene has an attempt in {arule.from_status}: add one")
    shard = Shard(config=case.scene.config())
    built = build(shard, case.scene)
    aid = built.attempts[case.label]
    before_state = shard.state

    outcome = shard.apply(shard.outcome(aid, case.result))

    attempt = shard.state.attempt(aid.encode())
    assert attempt is not None
    assert outcome.code == arule.code
    assert outcome.attempt_id == aid
    expected = arule.from_status if arule.to_status == SAME else arule.to_status
    assert attempt.status == expected
    if not outcome.applied:
        assert tables(shard.state) == tables(before_state)
        assert shard.last_effects[1:] == ()
    open_now = attempt.status in OPEN_ATTEMPT_STATUSES
    assert (shard.state.obligation(aid.encode()) is not None) is open_now
    if arule.to_status != SAME:
        # Resolved once and for good: a resolution position, and evidence for PUBLISHED.
        assert (attempt.resolved_position == shard.position) is not open_now
        if isinstance(case.result, k.Published):
            assert attempt.evidence == case.result.evidence


# The tables themselves ----------------------------------------------------------------------


def test_rows_use_only_known_ops_statuses_and_conditions() -> None:
    # A row outside these sets has no scene above: extend the scenes with the table.
    for row in LIFECYCLE:
        assert row.op in OP_CONDITIONS, row
        assert row.from_status in STATUSES or (
            row.from_status == OLD_GENERATION
            and (row.op in OUTCOME_RESULTS or row.op == "dead_letter_written")
        ), row
        assert row.condition in (ANY, *OP_CONDITIONS[row.op]), row
        assert row.to_status == SAME or row.to_status in STATUSES[1:], row
        assert row.new_generation is False or row.to_status == S, row
    for arule in ATTEMPT_ROWS:
        assert arule.result in RESULTS, arule
        assert arule.from_status in {str(s) for s in k.AttemptStatus}, arule


def test_every_row_is_driven() -> None:
    assert [row for row in LIFECYCLE if not cases(row)] == []
    assert [arule for arule in ATTEMPT_ROWS if not attempt_cases(arule)] == []


def test_every_situation_has_a_row() -> None:
    # The table is total over what the scenes can meet.
    for scene in SCENES:
        for sit in situations(scene):
            found = governing(sit)
            assert found is not None and found.op == sit.op, (scene.name, sit)


def test_every_status_has_a_scene_of_each_shape() -> None:
    statuses = {scene.status for scene in SCENES}
    assert statuses == set(STATUSES)
    assert {scene.armed for scene in SCENES if scene.status == U} == {True, False}
    assert any(scene.superseded for scene in SCENES)


def test_attempt_rules_are_total() -> None:
    pairs = {(r.from_status, r.result) for r in ATTEMPT_ROWS}
    assert len(pairs) == len(ATTEMPT_ROWS)
    assert pairs == {(str(s), res) for s in k.AttemptStatus for res in RESULTS}


@pytest.mark.parametrize("via_reschedule", [False, True], ids=["schedule", "reschedule"])
@pytest.mark.parametrize("scene", SCENES, ids=[s.name.replace(" ", "_") for s in SCENES])
def test_scene_builds_what_it_declares(scene: Scene, via_reschedule: bool) -> None:
    build(Shard(config=scene.config()), scene, via_reschedule=via_reschedule)


def test_the_kernel_tables_say_what_the_tests_expect() -> None:
    """The kernel's own tables, row for row, against the literal ones: an edited, added or
    removed kernel row is named here (the driven rows above show what it would do)."""
    kernel_rows = {
        Row(r.op, str(r.from_status), r.condition, str(r.code), str(r.to_status), r.new_generation)
        for r in kernel_rules.LIFECYCLE
    }
    assert sorted(kernel_rows - set(LIFECYCLE)) == [], "kernel rows not in the expected table"
    assert sorted(set(LIFECYCLE) - kernel_rows) == [], "expected rows the kernel lacks"
    kernel_attempts = {
        AttemptRow(r.from_status, r.result, str(r.code), str(r.to_status))
        for r in kernel_rules.ATTEMPT_RULES
    }
    assert sorted(kernel_attempts ^ set(ATTEMPT_ROWS)) == [], "the attempt tables differ"


def test_config_refuses_negative_uncertain_retries() -> None:
    with pytest.raises(ValueError, match="max_uncertain_retries"):
        k.KernelConfig(max_uncertain_retries=-1)


def test_timeline_is_empty_without_work() -> None:
    # Unarmed UNCERTAIN messages and finished ones hold no timeline rows at all.
    for scene in SCENES:
        shard = Shard(config=scene.config())
        build(shard, scene)
        rows = list(shard.state.items(Table.TIMELINE))
        assert len(rows) == (1 if scene.has_work() else 0), scene.name
