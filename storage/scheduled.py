"""The fold of first schedules in compiled code, and when it may be used.

Theory of operation: most schedules name a timer key that has no message yet, and
`kernel.commands.schedule` (the rule) then writes the same four rows every time: the
message, its timeline row, the payload reference and the tenant's usage.
`kernel.native.fold_scheduled` (Rust) writes those rows without building Python values.

The command's own checks run here first, with the kernel's own functions
(`check_schedule`, `timing_of`, `request_digest`, `action_at`): identity, txn, payload,
headers, capability, timing against the persistence time, and the precondition of a key
that has no message (expectedVersion absent or 0). Rust then decides only what the rows
say: no message under the key, and the payload reference and usage rows, if stored, in
msgspec's form; it also writes the two derived index entries (`storage.indexes`) a new
live timer has. A record any item of which fails any of this goes to the reducer whole.
`usable` switches the path off when the lifecycle table no longer says what a first
schedule does. `tests/storage/test_published_fold.py` folds generated histories both ways
and compares every byte of the store and every effect.
"""

from __future__ import annotations

from typing import Any, Final

import msgspec

from nereus.kernel import native
from nereus.kernel.codes import Code
from nereus.kernel.commands import check_schedule, request_digest, timing_of
from nereus.kernel.config import KernelConfig
from nereus.kernel.effects import Effect, EntryOutcome, TimelinePut
from nereus.kernel.keys import message_id, timeline_key
from nereus.kernel.model import Message, ShardMeta, Status, Table, TimelineWork
from nereus.kernel.records import CommandBatch, LogEntry, Schedule, record_type_of
from nereus.kernel.validation import action_at
from nereus.storage.codec import remember
from nereus.storage.compiled_rows import may_fold, next_meta, put_by_table, reader, rule_is
from nereus.storage.env import Env

_TAG: Final = record_type_of(Schedule)
_SCHEDULED: Final = Code.SCHEDULED
_STATUS: Final = Status.SCHEDULED
_MESSAGES: Final = Table.MESSAGES
_TIMELINE: Final = Table.TIMELINE
_encoder = msgspec.msgpack.Encoder()


def usable() -> bool:
    """Whether the compiled fold exists, writes the rows as the model lays them out, and
    does what the lifecycle table says a schedule of an absent key does."""
    return native.fold_scheduled is not None and rule_is(
        "schedule", "ABSENT", "changed", code=_SCHEDULED, to_status=_STATUS, new_generation=True
    )


_USABLE: Final = usable()


def candidate(meta: ShardMeta, entry: LogEntry) -> list[Schedule] | None:
    """The record's schedules when the compiled fold may try it: the entry is next in the
    log with a persistence time the reducer accepts, and every item is a schedule."""
    if not may_fold(_USABLE, meta, entry):
        return None
    record = entry.record
    if isinstance(record, CommandBatch):
        items: list[Schedule] = []
        for item in record.items:
            if not isinstance(item, Schedule):
                return None
            items.append(item)
    elif isinstance(record, Schedule):
        items = [record]
    else:
        return None
    return items or None


# What the crate takes of one schedule: who, what, when (native/src/schedules.rs).
Item = tuple[
    tuple[str, str, str, str, str, str],
    tuple[str, int, str | None, tuple[tuple[str, str], ...], str, bytes, str | None, bool],
    tuple[int, int, int, bytes],
]


def _item(config: KernelConfig, shard_status: str, bp_ms: int, r: Schedule) -> Item | None:
    """The command's side of the rule for a first schedule, or None if any check fails."""
    if check_schedule(shard_status, r, config) is not None:
        return None
    if r.expected_version is not None and r.expected_version != 0:
        return None  # a precondition no absent key meets: the reducer rejects it
    timing = timing_of(bp_ms, r, config)
    if isinstance(timing, Code):
        return None
    deliver_at_ms, expire_at_ms = timing
    mid = message_id(r.tenant, r.queue, r.timer_key)
    action_at_ms = action_at(deliver_at_ms, r.capability)
    return (
        (mid, r.tenant, r.queue, r.timer_key, r.txn, request_digest(b"schedule", r)),
        (
            r.payload_digest,
            r.payload_size,
            r.partition_key,
            r.headers,
            r.destination,
            _encoder.encode(r.capability),
            r.producer_sub,
            r.encrypted,
        ),
        (deliver_at_ms, expire_at_ms, action_at_ms, timeline_key(action_at_ms, mid, 1)),
    )


def _message(
    r: Schedule,
    who: tuple[str, str, str, str, str, str],
    when: tuple[int, int, int, bytes],
    bp_ms: int,
    position: int,
) -> Message:
    """The message row Rust wrote, as a value: a first generation, as the reducer makes it."""
    deliver_at_ms, expire_at_ms, action_at_ms, _ = when
    return Message(
        who[0],
        r.tenant,
        r.queue,
        r.timer_key,
        1,
        1,
        _STATUS,
        r.txn,
        r.payload_digest,
        r.payload_size,
        r.partition_key,
        r.headers,
        r.destination,
        r.capability,
        r.producer_sub,
        r.encrypted,
        deliver_at_ms,
        expire_at_ms,
        action_at_ms,
        True,
        who[5],
        0,
        0,
        0,
        0,
        0,
        None,
        None,
        None,
        None,
        bp_ms,
        bp_ms,
        position,
        position,
        None,
    )


def fold(
    env: Env,
    txn: Any,
    meta: ShardMeta,
    entry: LogEntry,
    items: list[Schedule],
    *,
    config: KernelConfig,
) -> tuple[ShardMeta, tuple[Effect, ...], set[bytes]] | None:
    """Fold the entry into `txn` through the compiled path: the new meta, the effects and
    the payload digests released (none: a schedule only takes references). None (nothing
    written) when the compiled fold does not take the record."""
    fold_scheduled = native.fold_scheduled
    assert fold_scheduled is not None
    bp_ms = entry.persisted_at_ms
    prepared: list[Item] = []
    for r in items:
        item = _item(config, meta.shard_status, bp_ms, r)
        if item is None:
            return None
        prepared.append(item)
    grouped = fold_scheduled(reader(env, txn), prepared, entry.position, bp_ms)
    if grouped is None:
        return None
    put_by_table(env, txn, grouped)  # the rows and their index entries
    # Each item wrote one message and one timeline row, in item order.
    written = dict(grouped)
    messages, timeline = written["messages"], written["timeline"]
    effects: list[Effect] = []
    position = entry.position
    for index, (r, (who, _, when)) in enumerate(zip(items, prepared, strict=True)):
        mid = who[0]
        deliver_at_ms, expire_at_ms, action_at_ms, key = when
        work = TimelineWork(
            "deliver",
            r.tenant,
            r.queue,
            mid,
            1,
            1,
            deliver_at_ms,
            expire_at_ms,
            r.payload_size,
        )
        # Filed under the bytes Rust wrote, as the reducer's writes are (`storage.codec`):
        # discovery reads both rows again when the timer is due.
        remember(_TIMELINE, timeline[index][1], work)
        remember(_MESSAGES, messages[index][1], _message(r, who, when, bp_ms, position))
        effects.append(
            EntryOutcome(
                position,
                _TAG,
                True,
                _SCHEDULED,
                mid,
                1,
                1,
                r.txn,
                deliver_at_ms,
                None,
                None,
                index,
            )
        )
        effects.append(TimelinePut(key, action_at_ms, work))
    return next_meta(meta, entry, {"scheduled": len(items)}), tuple(effects), set()
