"""The fold of Admissions in compiled code, and when it may be used.

Theory of operation: a fire's first record is a PUBLISH_ADMISSIONS_V1 whose items admit
SCHEDULED timers. The Python kernel (`kernel.mutations.admission`) is the rule;
`kernel.native.fold_admitted` (Rust) does the row work of its common case without building
Python values: it reads the message row, checks that the attempt is new and that the
message is SCHEDULED with timeline work, of the named generation and version, pinned to the
named capability, and answers with the attempt, obligation and message rows, or None.

The rest of the rule is checked here with the kernel's own functions, on what Rust read,
before anything is written: the shard is active, the attempt id is the message's, the lane
is not closed, the clock evidence admits (`kernel.timing.decide`) with capacity granted,
and the persistence time lies in [actionAt, expireAt). A record any item of which fails
any of this goes to the reducer whole. `usable` switches the path off when the lifecycle
table no longer says what it does. `tests/storage/test_published_fold.py` folds generated
histories both ways and compares every byte of the store and every effect.
"""

from __future__ import annotations

from typing import Any, Final

import msgspec

from nereus.kernel import native
from nereus.kernel.codes import Code
from nereus.kernel.effects import Effect, EntryOutcome, Publish, TimelineRemove
from nereus.kernel.keys import attempt_prefix, lane_id, str_key, timeline_key
from nereus.kernel.model import Lane, ShardMeta, Status, Table
from nereus.kernel.records import (
    AdmissionItem,
    LogEntry,
    PublishAdmission,
    PublishAdmissions,
    record_type_of,
)
from nereus.kernel.timing import Decision, decide
from nereus.kernel.validation import visible_at
from nereus.storage.base import LmdbBase
from nereus.storage.compiled_rows import (
    may_fold,
    next_meta,
    put_rows,
    reader,
    rule_is,
)
from nereus.storage.env import Env
from nereus.storage.indexes import index_live_timer, unindex_lane

_TAG: Final = record_type_of(PublishAdmission)
_ADMITTED: Final = Code.ADMITTED
_ADMIT: Final = Decision.ADMIT
_LANES: Final = Table.LANES
_TIMELINE: Final = Table.TIMELINE
_encoder = msgspec.msgpack.Encoder()

Item = PublishAdmission | AdmissionItem
# Per item, from Rust: the message's new version, txn, deliverAt, actionAt, expireAt,
# destination, tenant, queue, timer key.
Read = tuple[int, str, int, int, int, str, str, str, str]


def usable() -> bool:
    """Whether the compiled fold exists, reads the rows as the model lays them out, and
    does what the lifecycle table says an Admission of a SCHEDULED timer does."""
    return native.fold_admitted is not None and rule_is(
        "admission",
        Status.SCHEDULED,
        "armed",
        code=_ADMITTED,
        to_status=Status.PUBLISHING,
        new_generation=False,
    )


_USABLE: Final = usable()


def candidate(meta: ShardMeta, entry: LogEntry) -> list[Item] | None:
    """The record's items when the compiled fold may try it: the entry is next in the log
    with a persistence time the reducer accepts, the shard is active, and every item's
    attempt id is its message's and its capacity granted."""
    if not may_fold(_USABLE, meta, entry):
        return None
    if meta.shard_status != "ACTIVE_FOR_COMMANDS":
        return None
    record = entry.record
    if isinstance(record, PublishAdmissions):
        items: list[Item] = list(record.items)
    elif isinstance(record, PublishAdmission):
        items = [record]
    else:
        return None
    if not items:
        return None
    for item in items:
        if not item.capacity.granted:
            return None
        if not item.attempt_id.startswith(attempt_prefix(item.message_id, item.generation)):
            return None
    return items


def fold(
    env: Env, txn: Any, meta: ShardMeta, entry: LogEntry, items: list[Item]
) -> tuple[ShardMeta, tuple[Effect, ...], set[bytes]] | None:
    """Fold the entry into `txn` through the compiled path: the new meta, the effects and
    the payload digests released (none: an Admission keeps its payload). None (nothing
    written) when the compiled fold does not take the record."""
    fold_admitted = native.fold_admitted
    assert fold_admitted is not None
    record = entry.record
    assert isinstance(record, PublishAdmission | PublishAdmissions)
    answer = fold_admitted(
        reader(env, txn),
        [
            (
                i.attempt_id,
                i.message_id,
                i.generation,
                i.version,
                i.claim_id,
                i.descriptor_hash,
                _encoder.encode(i.capability),
            )
            for i in items
        ],
        record.owner,
        record.fence_id,
        entry.position,
        entry.persisted_at_ms,
    )
    if answer is None:
        return None
    writes, read = answer
    if not _admits(env, txn, record, entry.persisted_at_ms, read):
        return None
    put_rows(env, txn, writes)
    effects: list[Effect] = []
    for index, (item, row) in enumerate(zip(items, read, strict=True)):
        key = _leave_timeline(env, txn, item, row)
        effects.extend(_item_effects(entry.position, index, item, row, key))
    return _meta(meta, entry, len(items)), tuple(effects), set()


def _admits(
    env: Env, txn: Any, record: PublishAdmission | PublishAdmissions, bp_ms: int, read: list[Read]
) -> bool:
    """The rest of the Admission rule (`kernel.mutations._admission_refusal`) for every
    item: the lane's gate, the clock evidence, the persistence time."""
    lanes = LmdbBase(txn, env.tables, env.data_file)
    for _, _, _, action_at_ms, expire_at_ms, _, tenant, queue, _ in read:
        lane = lanes.get(_LANES, str_key(lane_id(tenant, queue)))
        if isinstance(lane, Lane) and lane.gate == "CLOSED":
            return False
        if decide(record.interval, action_at_ms, expire_at_ms) is not _ADMIT:
            return False
        if not action_at_ms <= bp_ms < expire_at_ms:
            return False
    return True


def _leave_timeline(env: Env, txn: Any, item: Item, row: Read) -> bytes:
    """The admitted timer's timeline row and its lane index entry go; its timer index entry
    stays (PUBLISHING is live: storage.indexes). Returns the timeline key."""
    _, _, _, action_at_ms, _, _, tenant, queue, timer_key = row
    key = timeline_key(action_at_ms, item.message_id, item.generation)
    txn.delete(key, b"", env.tables[_TIMELINE])
    unindex_lane(env, txn, tenant, queue, key)
    index_live_timer(env, txn, tenant, queue, timer_key, message_key=item.message_id.encode())
    return key


def _item_effects(
    position: int, index: int, item: Item, row: Read, key: bytes
) -> tuple[Effect, ...]:
    """One item's outcome, timeline removal and Publish, as the reducer emits them."""
    version, txn_id, deliver_at_ms, action_at_ms, _, destination, _, _, _ = row
    outcome = EntryOutcome(
        position,
        _TAG,
        True,
        _ADMITTED,
        item.message_id,
        item.generation,
        version,
        txn_id,
        deliver_at_ms,
        item.attempt_id,
        None,
        index,
    )
    publish = Publish(
        position=position,
        attempt_id=item.attempt_id,
        message_id=item.message_id,
        generation=item.generation,
        claim_id=item.claim_id,
        descriptor_hash=item.descriptor_hash,
        destination=destination,
        action_at_ms=action_at_ms,
        deliver_at_ms=deliver_at_ms,
        visible_at_ms=visible_at(deliver_at_ms, item.capability),
    )
    return outcome, TimelineRemove(key), publish


def _meta(meta: ShardMeta, entry: LogEntry, n: int) -> ShardMeta:
    """The meta after `n` SCHEDULED timers were admitted, each with a PUBLISHING attempt."""
    return next_meta(meta, entry, {"scheduled": -n, "publishing": n, "attempts_publishing": n})
