"""`reduce(state, entry) -> (state, effects)`: the whole shard as a fold.

Theory of operation: the reducer is pure and total. It checks the entry's place in the log
(positions are dense; persistence time never goes backwards), then dispatches on the closed
record union. Every entry yields exactly one `EntryOutcome` as the first effect, or, for a
batch record, one per item, each before that item's effects. Invalid
input is an outcome, never an exception; an exception means a broken invariant (a bug or a
corrupt store) and the runtime must halt rather than guess.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Final

from nereus.kernel import commands, mutations
from nereus.kernel.codes import Code
from nereus.kernel.effects import Effect, EntryOutcome
from nereus.kernel.records import (
    Cancel,
    ClaimResult,
    CommandBatch,
    DeadLetterWritten,
    Expire,
    LaneGate,
    LogEntry,
    PublishAdmission,
    PublishAdmissions,
    PublishOutcome,
    PublishOutcomes,
    Record,
    Reschedule,
    Schedule,
    ShardState,
    members,
    record_type,
    record_type_of,
)
from nereus.kernel.state import State
from nereus.kernel.step import Step
from nereus.kernel.timing import MAX_INSTANT_MS


def batch(step: Step, r: PublishAdmissions | PublishOutcomes | CommandBatch) -> None:
    """A batch record: each item decided as the single record it stands for would be, at
    this position, seeing the items before it, with its own outcome. An empty batch
    changes nothing."""
    items = members(r)
    if not items:
        return step.applied(Code.UNCHANGED)
    for index, item in enumerate(items):
        # The fire's batches first, called directly: a compiled call, not one through the
        # table's Python-level function objects.
        if isinstance(item, PublishAdmission):
            step.begin_item(index, _ADMISSION_TAG)
            mutations.admission(step, item)
        elif isinstance(item, PublishOutcome):
            step.begin_item(index, _OUTCOME_TAG)
            mutations.outcome(step, item)
        else:
            step.begin_item(index, _TAGS[type(item)])
            HANDLERS[type(item)](step, item)
    return None


# The one dispatch: the handler of each record type, looked up by exact type. The record
# union is closed (the decoders yield nothing else), so a type missing here is a broken invariant
# (tests/kernel/test_records.py checks the table covers `Record`), not input to reject.
HANDLERS: Final[dict[type[Record], Callable[[Step, Any], None]]] = {
    Schedule: commands.schedule,
    Reschedule: commands.reschedule,
    Cancel: commands.cancel,
    PublishAdmission: mutations.admission,
    PublishOutcome: mutations.outcome,
    PublishAdmissions: batch,
    PublishOutcomes: batch,
    CommandBatch: batch,
    ClaimResult: mutations.claim_result,
    Expire: mutations.expire,
    LaneGate: mutations.lane_gate,
    ShardState: mutations.shard_state,
    DeadLetterWritten: mutations.dead_letter_written,
}


_TAGS: Final[dict[type[Record], str]] = {cls: record_type_of(cls) for cls in HANDLERS}
_ADMISSION_TAG: Final = record_type_of(PublishAdmission)
_OUTCOME_TAG: Final = record_type_of(PublishOutcome)


def reduce(state: State, entry: LogEntry) -> tuple[State, tuple[Effect, ...]]:
    expected = state.meta.position + 1
    if entry.position != expected:
        code = Code.POSITION_DUPLICATE if entry.position < expected else Code.POSITION_GAP
        outcome = EntryOutcome(entry.position, record_type(entry.record), False, code)
        return state, (outcome,)
    step = Step(state, entry)
    if not 0 <= entry.persisted_at_ms < MAX_INSTANT_MS:
        step.rejected(Code.PERSISTED_AT_OUT_OF_RANGE)
        return step.finish()
    if entry.persisted_at_ms < state.meta.last_persisted_at_ms:
        step.rejected(Code.PERSISTED_AT_REGRESSED)
        return step.finish()
    HANDLERS[type(entry.record)](step, entry.record)
    return step.finish()


def fold(state: State, entries: Iterable[LogEntry]) -> tuple[State, list[tuple[Effect, ...]]]:
    """Reduce many entries, keeping every step's effects (for tests and small replays)."""
    all_effects: list[tuple[Effect, ...]] = []
    for entry in entries:
        state, effects = reduce(state, entry)
        all_effects.append(effects)
    return state, all_effects
