"""Effects: what the reducer asks the outside world to do, as plain values.

Theory of operation: the reducer never performs I/O; it returns effects and the runtime
performs them *after* the batch that produced them is durably committed. Every entry yields
exactly one `EntryOutcome` first (the reply to a command, or the verdict on a mutation);
other effects follow in the order the runtime should perform them. A batch record
(`PUBLISH_ADMISSIONS_V1`, `PUBLISH_OUTCOMES_V1`, `COMMANDS_V1`) yields that for each item in
turn: the item's outcome (its `index` says which item), then the item's effects (`split` pairs them
with the records the items stand for). An effect is identified by (entry position, index in
the returned tuple), which is stable under replay.
"""

from __future__ import annotations

import msgspec

from nereus.kernel.codes import Code
from nereus.kernel.model import TimelineWork
from nereus.kernel.records import BATCH_TYPES, Evidence, Record, members


# `gc=False`: effects are frozen values of strings, numbers and other frozen values, so they
# can never be part of a reference cycle (see kernel/model.py); untracked, the few made per
# entry do not count towards triggering the cycle collector.
class EntryOutcome(msgspec.Struct, frozen=True, gc=False):
    position: int
    record_type: str
    applied: bool
    code: Code
    message_id: str | None = None
    generation: int | None = None
    version: int | None = None
    txn: str | None = None
    deliver_at_ms: int | None = None
    # For too_late: which attempt crossed Admission and, if known, where it landed.
    attempt_id: str | None = None
    evidence: Evidence | None = None
    # Which item of a batch record this answers (0 for a single record).
    index: int = 0


class TimelinePut(msgspec.Struct, frozen=True, gc=False):
    key: bytes
    action_at_ms: int
    work: TimelineWork


class TimelineRemove(msgspec.Struct, frozen=True, gc=False):
    key: bytes


class Publish(msgspec.Struct, frozen=True, gc=False):
    """Send this admitted attempt. Only valid after the entry's batch is durable."""

    position: int
    attempt_id: str
    message_id: str
    generation: int
    claim_id: str
    descriptor_hash: str
    destination: str
    action_at_ms: int
    deliver_at_ms: int
    # When the target may reveal the record: deliverAt for immediate targets,
    # deliverAt + clock-ahead bound for a delayed handoff.
    visible_at_ms: int


class RevokeClaim(msgspec.Struct, frozen=True, gc=False):
    """Drop a local claim. With `claim_id`, only that claim (a stale Admission must not
    revoke the winning claim that is sending); without, every claim on the generation."""

    message_id: str
    generation: int
    reason: Code
    claim_id: str | None = None


class DeadLetter(msgspec.Struct, frozen=True, gc=False):
    """Copy the message to its destination's dead-letter queue. Its attempt history is the
    ATTEMPTS key range `attempt_prefix(message_id, generation)`."""

    message_id: str
    generation: int
    attempts_spent: int
    failures: int
    last_error: str | None


Effect = EntryOutcome | TimelinePut | TimelineRemove | Publish | RevokeClaim | DeadLetter


def split(
    record: Record, effects: tuple[Effect, ...]
) -> list[tuple[Record, EntryOutcome, tuple[Effect, ...]]]:
    """An entry's effects per record it stands for: (record, its outcome, its other effects).
    One triple for a single record; one per item for a batch record (the item as the single
    record it means), unless the whole entry was refused before its items were looked at
    (a position or persistence-time verdict), which is one triple for the batch itself."""
    first = effects[0]
    assert isinstance(first, EntryOutcome)
    if not isinstance(record, BATCH_TYPES) or not record.items:
        return [(record, first, effects[1:])]
    items = members(record)
    found: list[tuple[Record, EntryOutcome, tuple[Effect, ...]]] = []
    starts = [i for i, e in enumerate(effects) if isinstance(e, EntryOutcome)]
    if len(starts) != len(items):
        return [(record, first, effects[1:])]  # refused as a whole
    for n, start in enumerate(starts):
        end = starts[n + 1] if n + 1 < len(starts) else len(effects)
        outcome = effects[start]
        assert isinstance(outcome, EntryOutcome)
        found.append((items[n], outcome, effects[start + 1 : end]))
    return found


def outcomes_of(record: Record, effects: tuple[Effect, ...]) -> tuple[EntryOutcome, ...]:
    """The answer to each record an entry stands for (`per_item`)."""
    return per_item(record, [outcome for _record, outcome, _rest in split(record, effects)])


def per_item(record: Record, outcomes: list[EntryOutcome]) -> tuple[EntryOutcome, ...]:
    """`split`'s outcomes of an entry as one answer per record it stands for, in item
    order: a batch refused as a whole (one verdict on the entry) answers each item with
    that verdict."""
    if len(outcomes) == 1 and isinstance(record, BATCH_TYPES) and len(record.items) > 1:
        return tuple(outcomes) * len(record.items)
    return tuple(outcomes)
