"""The lifecycle transition rules, as data.

Theory of operation: which verdict a record gets depends on the message's current status and
one computed condition; that decision is this table and nothing else. The reducer looks rows
up here (`rule()`), the table tests replay every row, and `specs/lifecycle.md` is generated
from it (`python -m kernel.specgen`), so code, tests and docs cannot drift apart. Field
validation and preconditions (identity, timing, versions, evidence) come before the table and
are listed in `kernel/codes.py` in the order they are checked.

`ABSENT` stands for "no row under this identity"; `OLD_GENERATION` for an outcome whose
attempt (or a dead-letter copy whose generation) belongs to a generation the message has
since left. Conditions:
  identical      the command repeats the current generation's request exactly (same txn too)
  reused_txn     it is not identical but carries the current generation's txn: each new
                 generation is a new message and mints a new txn, so that "this txn was
                 delivered" names one message
  changed        neither
  armed          an UNCERTAIN message has retry work in the timeline
  unarmed        it has none (retries used up, or expireAt passed)
  alone          no other attempt of the generation is still open (UNKNOWN)
  behind_unknown another attempt of the generation is still UNKNOWN
  budget_left    after spending one attempt, attempts remain (and no other attempt is open)
  budget_left_behind_unknown   attempts remain, and another attempt is still UNKNOWN
  budget_spent   after spending one attempt, none remain
  pending        a dead-letter copy of the record's generation is owed (a dead_letters row)
  (for cancel/reschedule of a DEAD_LETTERED message: alone = nothing of its generation can
  be at the destination; behind_unknown = an attempt is still UNKNOWN; published = an
  UNKNOWN attempt was later proven PUBLISHED)
  -              the status alone decides
"""

from __future__ import annotations

from typing import Final, NamedTuple

from nereus.kernel.codes import Code
from nereus.kernel.model import Status

ABSENT: Final = "ABSENT"
OLD_GENERATION: Final = "OLD_GENERATION"
ANY: Final = "-"
SAME: Final = "="  # to_status: unchanged


class Rule(NamedTuple):
    op: str
    from_status: str
    condition: str
    code: Code
    to_status: str
    new_generation: bool = False


S, P, U, D = Status.SCHEDULED, Status.PUBLISHING, Status.UNCERTAIN, Status.DELIVERED
C, E, X = Status.CANCELED, Status.EXPIRED, Status.DEAD_LETTERED
FINISHED_PENDING_FREE = (C, E, X)

_rows: list[Rule] = [
    # schedule: an upsert on (tenant, queue, timer_key). An exact retry never changes
    # anything, whatever happened since: a late retry must not revive a finished timer.
    Rule("schedule", ABSENT, ANY, Code.SCHEDULED, S, True),
    *(Rule("schedule", st, "identical", Code.UNCHANGED, SAME) for st in (S, P, U, D, C, E, X)),
    Rule("schedule", S, "changed", Code.RESCHEDULED, S, True),
    Rule("schedule", P, "changed", Code.TOO_LATE, SAME),
    Rule("schedule", U, "changed", Code.TOO_LATE, SAME),
    *(Rule("schedule", st, "changed", Code.SCHEDULED, S, True) for st in (D, C, E, X)),
    # Where a change would make a new generation, a reused txn is refused; after Admission
    # the change is too late anyway, and that is the answer that carries the evidence.
    *(Rule("schedule", st, "reused_txn", Code.TXN_REUSED, SAME) for st in (S, D, C, E, X)),
    *(Rule("schedule", st, "reused_txn", Code.TOO_LATE, SAME) for st in (P, U)),
    # reschedule: timing only, same content, new txn.
    Rule("reschedule", ABSENT, ANY, Code.ABSENT, SAME),
    Rule("reschedule", S, "identical", Code.UNCHANGED, SAME),
    Rule("reschedule", S, "changed", Code.RESCHEDULED, S, True),
    Rule("reschedule", S, "reused_txn", Code.TXN_REUSED, SAME),
    *(Rule("reschedule", st, "identical", Code.UNCHANGED, SAME) for st in (P, U, D)),
    *(Rule("reschedule", st, "changed", Code.TOO_LATE, SAME) for st in (P, U, D)),
    *(Rule("reschedule", st, "reused_txn", Code.TOO_LATE, SAME) for st in (P, U, D)),
    Rule("reschedule", C, ANY, Code.ABSENT, SAME),
    Rule("reschedule", E, ANY, Code.ABSENT, SAME),
    # A dead-lettered generation whose earlier attempt is still UNKNOWN may be at the
    # destination: that is too late, not absent.
    Rule("reschedule", X, "alone", Code.ABSENT, SAME),
    Rule("reschedule", X, "behind_unknown", Code.TOO_LATE, SAME),
    Rule("reschedule", X, "published", Code.TOO_LATE, SAME),
    # cancel: wins only before Publish Admission.
    Rule("cancel", ABSENT, ANY, Code.ABSENT, SAME),
    Rule("cancel", S, ANY, Code.CANCELED, C),
    *(Rule("cancel", st, ANY, Code.TOO_LATE, SAME) for st in (P, U, D)),
    Rule("cancel", C, ANY, Code.ABSENT, SAME),
    Rule("cancel", E, ANY, Code.ABSENT, SAME),
    Rule("cancel", X, "alone", Code.ABSENT, SAME),
    Rule("cancel", X, "behind_unknown", Code.TOO_LATE, SAME),
    Rule("cancel", X, "published", Code.TOO_LATE, SAME),
    # Publish Admission: a pending generation, or an UNCERTAIN one whose retry is armed
    # (the retry may duplicate the UNKNOWN attempt; that attempt stays an obligation).
    Rule("admission", S, ANY, Code.ADMITTED, P),
    Rule("admission", U, "armed", Code.ADMITTED, P),
    Rule("admission", U, "unarmed", Code.ADMISSION_STALE, SAME),
    *(Rule("admission", st, ANY, Code.ADMISSION_STALE, SAME) for st in (P, D, C, E, X)),
    Rule("admission", ABSENT, ANY, Code.ADMISSION_STALE, SAME),
    # Claim result: a permanent pre-send error spends one attempt.
    Rule("claim_result", S, "budget_left", Code.CLAIM_RESULT_RECORDED, S),
    Rule("claim_result", U, "budget_left_behind_unknown", Code.CLAIM_RESULT_RECORDED, U),
    Rule("claim_result", U, "unarmed", Code.CLAIM_RESULT_STALE, SAME),
    *(Rule("claim_result", st, "budget_spent", Code.CLAIM_RESULT_RECORDED, X) for st in (S, U)),
    *(Rule("claim_result", st, ANY, Code.CLAIM_RESULT_STALE, SAME) for st in (P, D, C, E, X)),
    Rule("claim_result", ABSENT, ANY, Code.CLAIM_RESULT_STALE, SAME),
    # Expiry: only when nothing was admitted. For an UNCERTAIN message it only disarms the
    # retry: something may be at the destination, so it is not EXPIRED.
    Rule("expire", S, ANY, Code.EXPIRED, E),
    Rule("expire", U, "armed", Code.RETRY_WINDOW_CLOSED, SAME),
    Rule("expire", U, "unarmed", Code.EXPIRE_STALE, SAME),
    *(Rule("expire", st, ANY, Code.EXPIRE_STALE, SAME) for st in (P, D, C, E, X)),
    Rule("expire", ABSENT, ANY, Code.EXPIRE_STALE, SAME),
    # Outcomes of an attempt of the message's current generation, by the message status.
    # After delivery, later outcomes of other attempts change only the ledger.
    Rule("outcome_published", P, ANY, Code.OUTCOME_RECORDED, D),
    Rule("outcome_published", U, ANY, Code.OUTCOME_RECORDED, D),
    Rule("outcome_published", D, ANY, Code.OUTCOME_RECORDED, SAME),
    Rule("outcome_published", X, ANY, Code.OUTCOME_RECORDED, SAME),
    *(
        r
        for op in ("outcome_retriable", "outcome_lane_unavailable")
        for r in (
            Rule(op, P, "alone", Code.OUTCOME_RECORDED, S),
            Rule(op, P, "behind_unknown", Code.OUTCOME_RECORDED, U),
            Rule(op, D, ANY, Code.OUTCOME_RECORDED, SAME),
        )
    ),
    Rule("outcome_permanent", P, "budget_left", Code.OUTCOME_RECORDED, S),
    Rule("outcome_permanent", P, "budget_left_behind_unknown", Code.OUTCOME_RECORDED, U),
    Rule("outcome_permanent", P, "budget_spent", Code.OUTCOME_RECORDED, X),
    Rule("outcome_permanent", D, ANY, Code.OUTCOME_RECORDED, SAME),
    Rule("outcome_unknown", P, ANY, Code.OUTCOME_RECORDED, U),
    Rule("outcome_unknown", D, ANY, Code.OUTCOME_RECORDED, SAME),
    # An attempt of a superseded generation: only the ledger changes.
    *(
        Rule(op, OLD_GENERATION, ANY, Code.OUTCOME_RECORDED, SAME)
        for op in (
            "outcome_published",
            "outcome_retriable",
            "outcome_lane_unavailable",
            "outcome_permanent",
            "outcome_unknown",
        )
    ),
    # A dead-letter copy written: recorded once, against the copy owed since the generation
    # was dead-lettered, whatever happened to the message since (a superseding schedule does
    # not cancel a copy that is owed). Nothing else is owed a copy.
    Rule("dead_letter_written", X, "pending", Code.DEAD_LETTER_RECORDED, SAME),
    Rule("dead_letter_written", OLD_GENERATION, "pending", Code.DEAD_LETTER_RECORDED, SAME),
    *(
        Rule("dead_letter_written", st, ANY, Code.DEAD_LETTER_NOT_PENDING, SAME)
        for st in (ABSENT, S, P, U, D, C, E, X, OLD_GENERATION)
    ),
]

LIFECYCLE: Final[tuple[Rule, ...]] = tuple(_rows)

_INDEX: Final[dict[tuple[str, str, str], Rule]] = {
    (r.op, r.from_status, r.condition): r for r in LIFECYCLE
}
assert len(_INDEX) == len(LIFECYCLE), "duplicate lifecycle rule"


def rule(op: str, from_status: str, condition: str) -> Rule:
    """The row for (op, status, condition); a row with condition '-' matches any condition.
    A missing row is a programming error: the table is meant to be total for each op."""
    found = _INDEX.get((op, from_status, condition)) or _INDEX.get((op, from_status, ANY))
    if found is None:
        raise LookupError(f"no lifecycle rule for {op} from {from_status} when {condition}")
    return found


def new_status(to_status: str) -> Status:
    """A rule's to_status as a Status. The table already holds members (only SAME is a
    plain string), and Status(member) is a slow Python-level enum call for the same result."""
    return to_status if isinstance(to_status, Status) else Status(to_status)


class AttemptRule(NamedTuple):
    from_status: str
    result: str
    code: Code
    to_status: str


# The attempt ledger: an attempt is resolved once, and UNKNOWN only by positive evidence.
ATTEMPT_RULES: Final[tuple[AttemptRule, ...]] = (
    AttemptRule("PUBLISHING", "PUBLISHED", Code.OUTCOME_RECORDED, "PUBLISHED"),
    AttemptRule("PUBLISHING", "NOT_PUBLISHED", Code.OUTCOME_RECORDED, "NOT_PUBLISHED"),
    AttemptRule("PUBLISHING", "UNKNOWN", Code.OUTCOME_RECORDED, "UNKNOWN"),
    AttemptRule("UNKNOWN", "PUBLISHED", Code.OUTCOME_RECORDED, "PUBLISHED"),
    AttemptRule("UNKNOWN", "NOT_PUBLISHED", Code.OUTCOME_ABSENCE_NOT_EVIDENCE, SAME),
    AttemptRule("UNKNOWN", "UNKNOWN", Code.OUTCOME_ALREADY_RECORDED, SAME),
    *(
        AttemptRule(done, result, Code.OUTCOME_ALREADY_RECORDED, SAME)
        for done in ("PUBLISHED", "NOT_PUBLISHED")
        for result in ("PUBLISHED", "NOT_PUBLISHED", "UNKNOWN")
    ),
)

_ATTEMPT_INDEX: Final[dict[tuple[str, str], AttemptRule]] = {
    (r.from_status, r.result): r for r in ATTEMPT_RULES
}


def attempt_rule(from_status: str, result: str) -> AttemptRule:
    return _ATTEMPT_INDEX[(from_status, result)]
