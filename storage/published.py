"""The fold of PUBLISHED outcomes in compiled code, and when it may be used.

Theory of operation: every fire ends in a PUBLISH_OUTCOMES_V1 record whose items say
"published" for an attempt that is PUBLISHING, of a message that is PUBLISHING. The Python
kernel (`kernel.mutations.outcome`) is the rule for that; `kernel.native.fold_published`
(Rust) is a second implementation of its common case, working on the stored rows without
building Python values: it reads the attempt, message, payload-reference and usage rows,
and answers with the rows to write, or None for a record it does not take whole (any item
not the common case, any row not in the form msgspec writes). `fold` then writes those
rows into the fold's transaction with the timer index beside them, and builds the entry's
outcomes and claim releases, the meta and its counters, as the reducer would.

What is decided here is only what the reducer would decide before the rows are looked at:
the entry's position and persistence time are the expected ones, and the record holds only
PUBLISHED results. Anything else goes to the reducer. The lifecycle table must still say
what this path does (`usable`): a table that moves a PUBLISHED outcome somewhere else
switches the path off rather than disagreeing with it. `tests/storage/test_published_fold.py`
folds generated histories both ways and compares every byte of the store and every effect.
"""

from __future__ import annotations

from typing import Any, Final

import msgspec

from nereus.kernel import native
from nereus.kernel.codes import Code
from nereus.kernel.effects import Effect, EntryOutcome, RevokeClaim
from nereus.kernel.model import (
    AttemptStatus,
    ShardMeta,
    Status,
)
from nereus.kernel.records import (
    Evidence,
    LogEntry,
    OutcomeItem,
    Published,
    PublishOutcome,
    PublishOutcomes,
    record_type_of,
)
from nereus.kernel.rules import attempt_rule, rule
from nereus.storage.compiled_rows import (
    layout_matches,
    may_fold,
    next_meta,
    put_rows,
    reader,
)
from nereus.storage.env import Env
from nereus.storage.indexes import unindex_timer

_TAG: Final = record_type_of(PublishOutcome)
_RECORDED: Final = Code.OUTCOME_RECORDED
_encoder = msgspec.msgpack.Encoder()


def usable() -> bool:
    """Whether the compiled fold exists, reads the rows as the model lays them out, and
    does what the lifecycle table says a PUBLISHED outcome of a PUBLISHING attempt does."""
    if native.fold_published is None:
        return False
    message_rule = rule("outcome_published", Status.PUBLISHING, "-")
    attempt = attempt_rule(AttemptStatus.PUBLISHING, "PUBLISHED")
    return (
        layout_matches()
        and message_rule.code is _RECORDED
        and message_rule.to_status == Status.DELIVERED
        and not message_rule.new_generation
        and attempt.code is _RECORDED
        and attempt.to_status == AttemptStatus.PUBLISHED
    )


_USABLE: Final = usable()


def candidate(meta: ShardMeta, entry: LogEntry) -> list[PublishOutcome | OutcomeItem] | None:
    """The record's items when the compiled fold may try it: the entry is next in the log,
    its persistence time is one the reducer accepts, and every item is PUBLISHED."""
    if not may_fold(_USABLE, meta, entry):
        return None
    record = entry.record
    if isinstance(record, PublishOutcomes):
        items: list[PublishOutcome | OutcomeItem] = list(record.items)
    elif isinstance(record, PublishOutcome):
        items = [record]
    else:
        return None
    if not items:
        return None
    for item in items:
        if not isinstance(item.result, Published):
            return None
    return items


def fold(
    env: Env, txn: Any, meta: ShardMeta, entry: LogEntry, items: list[PublishOutcome | OutcomeItem]
) -> tuple[ShardMeta, tuple[Effect, ...], set[bytes]] | None:
    """Fold the entry into `txn` through the compiled path: the new meta, the effects and
    the payload digests whose reference row was deleted. None (nothing written) when the
    compiled fold does not take the record."""
    fold_published = native.fold_published
    assert fold_published is not None
    evidences = [item.result.evidence for item in items if isinstance(item.result, Published)]
    answer = fold_published(
        reader(env, txn),
        [
            (item.attempt_id, item.message_id, item.generation, _encoder.encode(evidence))
            for item, evidence in zip(items, evidences, strict=True)
        ],
        entry.position,
        entry.persisted_at_ms,
    )
    if answer is None:
        return None
    writes, folded = answer
    released = put_rows(env, txn, writes)
    for _, _, _, _, tenant, queue, timer_key in folded:
        unindex_timer(env, txn, tenant, queue, timer_key)  # DELIVERED is not live
    effects = _effects(entry.position, items, evidences, folded)
    return _meta(meta, entry, len(items)), effects, released


def _effects(
    position: int,
    items: list[PublishOutcome | OutcomeItem],
    evidences: list[Evidence],
    folded: list[tuple[str, int, str, int, str, str, str]],
) -> tuple[Effect, ...]:
    """Each item's outcome and claim release, as the reducer emits them."""
    effects: list[Effect] = []
    for index, (item, evidence, done) in enumerate(zip(items, evidences, folded, strict=True)):
        claim_id, version, txn_id, deliver_at_ms = done[:4]
        effects.append(
            EntryOutcome(
                position,
                _TAG,
                True,
                _RECORDED,
                item.message_id,
                item.generation,
                version,
                txn_id,
                deliver_at_ms,
                item.attempt_id,
                evidence,
                index,
            )
        )
        effects.append(RevokeClaim(item.message_id, item.generation, _RECORDED, claim_id))
    return tuple(effects)


def _meta(meta: ShardMeta, entry: LogEntry, n: int) -> ShardMeta:
    """The meta after `n` attempts and their messages went from PUBLISHING to delivered."""
    return next_meta(
        meta,
        entry,
        {
            "publishing": -n,
            "delivered": n,
            "attempts_publishing": -n,
            "attempts_published": n,
        },
    )
