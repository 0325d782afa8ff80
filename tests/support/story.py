"""The story index's rule (`storage/story.py`), stated from the log alone, for the tests that
hold a store to it (`tests/storage/test_story_index.py`, the crash loop's reopen check).

A log position the fold consumed holds one record or a batch of items; each client command
among them (SCHEDULE_V1, RESCHEDULE_V1, CANCEL_V1) names the message its (tenant, queue,
timer key) hash to, whatever its verdict; an EXPIRE_V1 or DEAD_LETTER_WRITTEN_V1 names its
message when its verdict found one; the fire's records (Admissions, outcomes, claim results)
and records naming no message are never marked. Each is marked with the answer a caller is
told for that item (`kernel.effects.outcomes_of`: a batch refused as a whole answers each
item with its one verdict), computed here by the kernel's reducer in memory.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from nereus import kernel as k
from nereus.kernel.codes import POSITION_CODES
from nereus.kernel.effects import EntryOutcome, outcomes_of
from nereus.storage.schema import StoryMark, StoryMarkRow
from nereus.storage.store import ShardStore

Marks = dict[str, list[StoryMarkRow]]
EVERY = 1_000_000  # a limit no test history reaches


def _named(item: k.Record, answer: EntryOutcome) -> str | None:
    """The message a record names, by the rule."""
    if isinstance(item, k.Schedule | k.Reschedule | k.Cancel):
        return k.message_id(item.tenant, item.queue, item.timer_key)
    if isinstance(item, k.Expire | k.DeadLetterWritten) and answer.message_id is not None:
        return item.message_id
    return None


def rule_marks(entries: Iterable[k.LogEntry], config: k.KernelConfig) -> Marks:
    """Every message's marks as the rule gives them, from the reducer's answers in memory."""
    state = k.State.initial(config)
    marks: Marks = defaultdict(list)
    for entry in entries:
        state, effects = k.reduce(state, entry)
        answers = outcomes_of(entry.record, effects)
        if answers[0].code in POSITION_CODES:
            continue  # the position was not consumed: another entry will hold it
        items = k.members(entry.record)
        for index, (item, answer) in enumerate(zip(items, answers, strict=False)):
            named = _named(item, answer)
            if named is None:
                continue
            mark = StoryMark(
                entry.persisted_at_ms,
                answer.record_type,
                answer.code,
                answer.applied,
                answer.generation,
                answer.version,
                answer.deliver_at_ms,
                answer.txn,
                answer.attempt_id,
            )
            marks[named].append(StoryMarkRow(entry.position, index, mark))
    return dict(marks)


def story_problems(store: ShardStore, expected: Marks) -> list[str]:
    """Where the store's story differs from `expected`: a message's marks, or marks of
    messages `expected` does not name."""
    problems: list[str] = []
    with store.read() as view:
        for message_id, rows in expected.items():
            found = view.story_marks(message_id, EVERY)
            if found != (rows, False):
                problems.append(f"story of {message_id}: {found[0]} where the log says {rows}")
    env = store.env
    with env.env.begin() as txn:
        stored = txn.stat(env.story)["entries"]
    wanted = sum(len(rows) for rows in expected.values())
    if stored != wanted:
        problems.append(f"{stored} marks stored where the log names {wanted}")
    return problems
