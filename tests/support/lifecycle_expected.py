"""What the lifecycle and attempt tables must say, written out here, apart from the kernel.

The table tests (`tests/kernel/test_lifecycle_table.py`) take their expected verdicts from these
literal rows, never from `kernel.rules`, the code under test: an edited kernel row then
disagrees with this file and fails, where a test reading the kernel's own table would agree
with any edit. The rows restate `specs/lifecycle.md`: change a row here only with the decision that
changes it.

Rows are grouped under their op (`schedule:`, ...). Columns: the message's status
(`ABSENT`: no row; `OLD_GENERATION`: the record's attempt or copy belongs to a generation the
message has left), the condition (`-`: any), the code, the status it leaves (`=`:
unchanged), and `new` where the row starts a new generation. Nothing here imports the
kernel, so a half-edited kernel table cannot stop the tests from being collected.
"""

from __future__ import annotations

from typing import NamedTuple

ABSENT = "ABSENT"
OLD_GENERATION = "OLD_GENERATION"
ANY = "-"
SAME = "="

LIFECYCLE_TEXT = """
schedule:
    ABSENT          -                           scheduled              SCHEDULED      new
    SCHEDULED       identical                   unchanged              =
    PUBLISHING      identical                   unchanged              =
    UNCERTAIN       identical                   unchanged              =
    DELIVERED       identical                   unchanged              =
    CANCELED        identical                   unchanged              =
    EXPIRED         identical                   unchanged              =
    DEAD_LETTERED   identical                   unchanged              =
    SCHEDULED       changed                     rescheduled            SCHEDULED      new
    PUBLISHING      changed                     too_late               =
    UNCERTAIN       changed                     too_late               =
    DELIVERED       changed                     scheduled              SCHEDULED      new
    CANCELED        changed                     scheduled              SCHEDULED      new
    EXPIRED         changed                     scheduled              SCHEDULED      new
    DEAD_LETTERED   changed                     scheduled              SCHEDULED      new
    SCHEDULED       reused_txn                  txn_reused             =
    DELIVERED       reused_txn                  txn_reused             =
    CANCELED        reused_txn                  txn_reused             =
    EXPIRED         reused_txn                  txn_reused             =
    DEAD_LETTERED   reused_txn                  txn_reused             =
    PUBLISHING      reused_txn                  too_late               =
    UNCERTAIN       reused_txn                  too_late               =
reschedule:
    ABSENT          -                           absent                 =
    SCHEDULED       identical                   unchanged              =
    SCHEDULED       changed                     rescheduled            SCHEDULED      new
    SCHEDULED       reused_txn                  txn_reused             =
    PUBLISHING      identical                   unchanged              =
    UNCERTAIN       identical                   unchanged              =
    DELIVERED       identical                   unchanged              =
    PUBLISHING      changed                     too_late               =
    UNCERTAIN       changed                     too_late               =
    DELIVERED       changed                     too_late               =
    PUBLISHING      reused_txn                  too_late               =
    UNCERTAIN       reused_txn                  too_late               =
    DELIVERED       reused_txn                  too_late               =
    CANCELED        -                           absent                 =
    EXPIRED         -                           absent                 =
    DEAD_LETTERED   alone                       absent                 =
    DEAD_LETTERED   behind_unknown              too_late               =
    DEAD_LETTERED   published                   too_late               =
cancel:
    ABSENT          -                           absent                 =
    SCHEDULED       -                           canceled               CANCELED
    PUBLISHING      -                           too_late               =
    UNCERTAIN       -                           too_late               =
    DELIVERED       -                           too_late               =
    CANCELED        -                           absent                 =
    EXPIRED         -                           absent                 =
    DEAD_LETTERED   alone                       absent                 =
    DEAD_LETTERED   behind_unknown              too_late               =
    DEAD_LETTERED   published                   too_late               =
admission:
    SCHEDULED       -                           admitted               PUBLISHING
    UNCERTAIN       armed                       admitted               PUBLISHING
    UNCERTAIN       unarmed                     admission_stale        =
    PUBLISHING      -                           admission_stale        =
    DELIVERED       -                           admission_stale        =
    CANCELED        -                           admission_stale        =
    EXPIRED         -                           admission_stale        =
    DEAD_LETTERED   -                           admission_stale        =
    ABSENT          -                           admission_stale        =
claim_result:
    SCHEDULED       budget_left                 claim_result_recorded  SCHEDULED
    UNCERTAIN       budget_left_behind_unknown  claim_result_recorded  UNCERTAIN
    UNCERTAIN       unarmed                     claim_result_stale     =
    SCHEDULED       budget_spent                claim_result_recorded  DEAD_LETTERED
    UNCERTAIN       budget_spent                claim_result_recorded  DEAD_LETTERED
    PUBLISHING      -                           claim_result_stale     =
    DELIVERED       -                           claim_result_stale     =
    CANCELED        -                           claim_result_stale     =
    EXPIRED         -                           claim_result_stale     =
    DEAD_LETTERED   -                           claim_result_stale     =
    ABSENT          -                           claim_result_stale     =
expire:
    SCHEDULED       -                           expired                EXPIRED
    UNCERTAIN       armed                       retry_window_closed    =
    UNCERTAIN       unarmed                     expire_stale           =
    PUBLISHING      -                           expire_stale           =
    DELIVERED       -                           expire_stale           =
    CANCELED        -                           expire_stale           =
    EXPIRED         -                           expire_stale           =
    DEAD_LETTERED   -                           expire_stale           =
    ABSENT          -                           expire_stale           =
outcome_published:
    PUBLISHING      -                           outcome_recorded       DELIVERED
    UNCERTAIN       -                           outcome_recorded       DELIVERED
    DELIVERED       -                           outcome_recorded       =
    DEAD_LETTERED   -                           outcome_recorded       =
outcome_retriable:
    PUBLISHING      alone                       outcome_recorded       SCHEDULED
    PUBLISHING      behind_unknown              outcome_recorded       UNCERTAIN
    DELIVERED       -                           outcome_recorded       =
outcome_lane_unavailable:
    PUBLISHING      alone                       outcome_recorded       SCHEDULED
    PUBLISHING      behind_unknown              outcome_recorded       UNCERTAIN
    DELIVERED       -                           outcome_recorded       =
outcome_permanent:
    PUBLISHING      budget_left                 outcome_recorded       SCHEDULED
    PUBLISHING      budget_left_behind_unknown  outcome_recorded       UNCERTAIN
    PUBLISHING      budget_spent                outcome_recorded       DEAD_LETTERED
    DELIVERED       -                           outcome_recorded       =
outcome_unknown:
    PUBLISHING      -                           outcome_recorded       UNCERTAIN
    DELIVERED       -                           outcome_recorded       =
outcome_published:
    OLD_GENERATION  -                           outcome_recorded       =
outcome_retriable:
    OLD_GENERATION  -                           outcome_recorded       =
outcome_lane_unavailable:
    OLD_GENERATION  -                           outcome_recorded       =
outcome_permanent:
    OLD_GENERATION  -                           outcome_recorded       =
outcome_unknown:
    OLD_GENERATION  -                           outcome_recorded       =
dead_letter_written:
    DEAD_LETTERED   pending                     dead_letter_recorded   =
    OLD_GENERATION  pending                     dead_letter_recorded   =
    ABSENT          -                           dead_letter_not_pending  =
    SCHEDULED       -                           dead_letter_not_pending  =
    PUBLISHING      -                           dead_letter_not_pending  =
    UNCERTAIN       -                           dead_letter_not_pending  =
    DELIVERED       -                           dead_letter_not_pending  =
    CANCELED        -                           dead_letter_not_pending  =
    EXPIRED         -                           dead_letter_not_pending  =
    DEAD_LETTERED   -                           dead_letter_not_pending  =
    OLD_GENERATION  -                           dead_letter_not_pending  =
"""

ATTEMPT_TEXT = """
    PUBLISHING      PUBLISHED       outcome_recorded              PUBLISHED
    PUBLISHING      NOT_PUBLISHED   outcome_recorded              NOT_PUBLISHED
    PUBLISHING      UNKNOWN         outcome_recorded              UNKNOWN
    UNKNOWN         PUBLISHED       outcome_recorded              PUBLISHED
    UNKNOWN         NOT_PUBLISHED   outcome_absence_not_evidence  =
    UNKNOWN         UNKNOWN         outcome_already_recorded      =
    PUBLISHED       PUBLISHED       outcome_already_recorded      =
    PUBLISHED       NOT_PUBLISHED   outcome_already_recorded      =
    PUBLISHED       UNKNOWN         outcome_already_recorded      =
    NOT_PUBLISHED   PUBLISHED       outcome_already_recorded      =
    NOT_PUBLISHED   NOT_PUBLISHED   outcome_already_recorded      =
    NOT_PUBLISHED   UNKNOWN         outcome_already_recorded      =
"""

# The codes that count as applied (the entry changed state, or deliberately nothing, as
# `unchanged`); every other code is a rejection (`specs/codes.md`).
APPLIED_CODES = frozenset(
    {
        "scheduled",
        "rescheduled",
        "unchanged",
        "canceled",
        "admitted",
        "outcome_recorded",
        "claim_result_recorded",
        "dead_letter_recorded",
        "expired",
        "retry_window_closed",
        "gate_changed",
        "shard_state_changed",
    }
)


class Row(NamedTuple):
    op: str
    from_status: str
    condition: str
    code: str
    to_status: str
    new_generation: bool = False


class AttemptRow(NamedTuple):
    from_status: str
    result: str
    code: str
    to_status: str


def _lifecycle_rows(text: str) -> tuple[Row, ...]:
    rows: list[Row] = []
    op = ""
    for line in text.strip().splitlines():
        if line.endswith(":"):
            op = line[:-1]
            continue
        status, condition, code, to_status, *new = line.split()
        rows.append(Row(op, status, condition, code, to_status, new == ["new"]))
    return tuple(rows)


def _attempt_rows(text: str) -> tuple[AttemptRow, ...]:
    return tuple(AttemptRow(*line.split()) for line in text.strip().splitlines())


LIFECYCLE = _lifecycle_rows(LIFECYCLE_TEXT)
ATTEMPT_ROWS = _attempt_rows(ATTEMPT_TEXT)
_INDEX = {(r.op, r.from_status, r.condition): r for r in LIFECYCLE}
_ATTEMPT_INDEX = {(r.from_status, r.result): r for r in ATTEMPT_ROWS}


def expected_row(op: str, from_status: str, condition: str) -> Row | None:
    """The row governing (op, status, condition): the exact one, else the status's '-' row;
    None where the table says nothing (a test fails on that, nothing raises)."""
    return _INDEX.get((op, from_status, condition)) or _INDEX.get((op, from_status, ANY))


def expected_attempt_row(from_status: str, result: str) -> AttemptRow | None:
    return _ATTEMPT_INDEX.get((from_status, result))
