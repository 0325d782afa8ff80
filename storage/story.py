"""The story index: for each message, the records of the log that named it, with verdicts.

Theory of operation: an operator asking what happened to one timer needs every command that
touched it, where it sits in the log and what the reducer answered, without reading the log
(which holds every other message too, and may be compacted). So the fold (`storage.fold`)
files a mark per (message, log position, batch item) in the `story` sub-database, in its own
write transaction, from the outcomes it has just computed: nothing is read or decoded again,
and each mark is one cursor put. The compiled folds return their outcomes to the same loop,
so every path marks alike, and a store folded either way holds the same marks.

Marked: the client commands (SCHEDULE_V1, RESCHEDULE_V1, CANCEL_V1, alone or as items of
COMMANDS_V1) and the other records naming one message outside the fire (EXPIRE_V1,
DEAD_LETTER_WRITTEN_V1). Not marked: the fire's records (Admissions, outcomes, claim
results), whose positions the attempts table already holds; records naming no message (lane
gates, shard states); an entry refused for its place in the log (`position_duplicate`,
`position_gap`), which consumes no position, so a later entry will take it.

A mark is filed under the message its outcome names. A command refused before a message was
looked at (an invalid identity, a cancel of an absent key) names none: it is filed under the
id its (tenant, queue, timer key) hash to, so a refusal is in the story of the timer it
named. An EXPIRE_V1 or DEAD_LETTER_WRITTEN_V1 whose outcome names no message is not filed:
its id names no message this store knows, and may not even be a well-formed one. A batch
refused as a whole answers each item with the batch's verdict, and each item is marked so.

The index covers the log from its floor (`storage.schema.StoryFloor`), and is read through
`storage.base.StoreView.story_marks`.
"""

from __future__ import annotations

from typing import Any, Final

import msgspec

from nereus.kernel.codes import POSITION_CODES
from nereus.kernel.effects import Effect, EntryOutcome
from nereus.kernel.keys import message_id
from nereus.kernel.records import (
    Cancel,
    CommandBatch,
    DeadLetterWritten,
    Expire,
    LogEntry,
    Record,
    Reschedule,
    Schedule,
)
from nereus.storage.codec import frame, story_key

_encoder: Final = msgspec.msgpack.Encoder()


def mark_entry(cursor: Any, entry: LogEntry, effects: tuple[Effect, ...]) -> None:
    """Put the marks of one folded entry through `cursor` (on the story sub-database)."""
    record = entry.record
    first = effects[0]
    assert isinstance(first, EntryOutcome)
    if first.code in POSITION_CODES:
        return
    if isinstance(record, CommandBatch):
        _mark_batch(cursor, entry, record, effects)
    elif isinstance(record, Schedule | Reschedule | Cancel | Expire | DeadLetterWritten):
        _mark(cursor, entry, 0, record, first)


def _mark_batch(
    cursor: Any, entry: LogEntry, record: CommandBatch, effects: tuple[Effect, ...]
) -> None:
    items = record.items
    outcomes = [effect for effect in effects if isinstance(effect, EntryOutcome)]
    if len(outcomes) != len(items):
        if not items:
            return  # an empty batch names nobody
        outcomes = [outcomes[0]] * len(items)  # refused as a whole: each item was told so
    for index, item in enumerate(items):
        _mark(cursor, entry, index, item, outcomes[index])


def _mark(cursor: Any, entry: LogEntry, index: int, record: Record, outcome: EntryOutcome) -> None:
    mid = outcome.message_id
    if mid is None:
        if not isinstance(record, Schedule | Reschedule | Cancel):
            return
        mid = message_id(record.tenant, record.queue, record.timer_key)
    cursor.put(story_key(mid, entry.position, index), encode_mark(outcome, entry.persisted_at_ms))


def encode_mark(outcome: EntryOutcome, persisted_at_ms: int) -> bytes:
    """The stored bytes of `schema.StoryMark` for this outcome, encoded from a tuple in the
    struct's field order: the same bytes, without building the struct."""
    return frame(
        _encoder.encode(
            (
                persisted_at_ms,
                outcome.record_type,
                outcome.code,
                outcome.applied,
                outcome.generation,
                outcome.version,
                outcome.deliver_at_ms,
                outcome.txn,
                outcome.attempt_id,
            )
        )
    )
