"""Each generation's end, from a pure fold of the log with the kernel alone.

Theory of operation: the audit judges every generation ever scheduled by the row it ended
with, which the store no longer holds once a later generation replaced it. So the log is
folded again with `kernel.reduce` alone (no storage), and a generation's row is kept as it
stood just before the command that superseded it (a reschedule, an upsert, a schedule after
it ended); a batch is decided item by item on a step of its own, since two items of one
batch may supersede each other. What is left at the end is each key's final generation.
"""

from __future__ import annotations

from nereus.kernel.config import KernelConfig
from nereus.kernel.effects import outcomes_of
from nereus.kernel.keys import message_id
from nereus.kernel.model import Message, Table
from nereus.kernel.records import CommandBatch, LogEntry, Reschedule, Schedule, record_type
from nereus.kernel.reducer import HANDLERS, reduce
from nereus.kernel.state import State
from nereus.kernel.step import Step


def generation_ends(
    entries: list[LogEntry], config: KernelConfig
) -> tuple[dict[tuple[str, int], Message], State]:
    """Each generation's message row as it stood when it was superseded (by a reschedule,
    an upsert, or a schedule after it ended), or its final row: a pure fold of the log with
    the kernel alone, independent of storage."""
    state = State.initial(config)
    ends: dict[tuple[str, int], Message] = {}
    for entry in entries:
        record = entry.record
        before: Message | None = None
        if isinstance(record, CommandBatch):
            found = _batch_ends(state, entry, record)
            state, effects = reduce(state, entry)
            if len(outcomes_of(record, effects)) == len(record.items):  # not refused whole
                ends.update(found)
            continue
        if isinstance(record, Schedule | Reschedule):
            mid = message_id(record.tenant, record.queue, record.timer_key)
            before = state.message(mid.encode())
        state, _ = reduce(state, entry)
        if before is not None:
            after = state.message(before.message_id.encode())
            if after is not None and after.generation != before.generation:
                ends[(before.message_id, before.generation)] = before
    for _key, value in state.items(Table.MESSAGES):
        assert isinstance(value, Message)
        ends[(value.message_id, value.generation)] = value
    return ends, state


def _batch_ends(
    state: State, entry: LogEntry, record: CommandBatch
) -> dict[tuple[str, int], Message]:
    """The rows a batch of commands supersedes, item by item as the reducer decides them
    (two items of one batch may supersede each other), from a step of its own."""
    ends: dict[tuple[str, int], Message] = {}
    step = Step(state, entry)
    for index, item in enumerate(record.items):
        mid = message_id(item.tenant, item.queue, item.timer_key)
        before = step.message(mid)
        step.begin_item(index, record_type(item))
        HANDLERS[type(item)](step, item)
        after = step.message(mid)
        if before is not None and after is not None and after.generation != before.generation:
            ends[(before.message_id, before.generation)] = before
    return ends
