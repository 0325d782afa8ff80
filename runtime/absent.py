"""Cancels of timers that do not exist, answered `absent` from committed state.

Theory of operation: a cancel of a key with no row changes nothing but the log's length,
so appending it buys no history worth its cost, and a caller with no grants could grow the
log at will that way. `answer_absent` answers such a unit of cancels without appending,
when all of this holds: every item is a well-formed cancel the kernel would decide by its
row alone (identity valid, no version precondition other than 0); the runtime runs (a
halted or lost runtime keeps answering as before, with an error); no command for any of the
keys, and no record that is not a client command, is in flight in the intake
(`Intake.in_flight`, by timer key); and then, in ONE read snapshot of the store, the shard
accepts commands (not FROZEN), every entry of the log is folded, and none of the keys has a
row. Anything else goes through the log as before.

Why the answer is one the log could have given (specs/http.md, "DELETE without an entry"):
the snapshot is the fold of the log up to its applied position P, and a cancel appended
right after P would have been decided on exactly that state, found no row and answered
`absent`, changing nothing. The snapshot is taken after the request arrived and before it
is answered, so P is a point inside the request's own interval: every command answered
before the request arrived committed before P (a commit is visible before its future
completes); a schedule committed after P is ordered after this cancel, as an appended
cancel that won the race would have been. The intake check comes first and keeps the
submission order of one caller as well: a command for the key submitted before this cancel
is either still counted (then the cancel is appended behind it) or complete, and so inside
the snapshot. The order of the two steps matters: read first and check second, and a
schedule committed in between would be neither in the snapshot nor counted.

Only the embedded runtime, whose intake sees every command of the shard, can know that
nothing is in flight. In Kafka mode commands reach the shard through the commands topic
from any process and are folded later, so the service keeps appending every cancel there.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from nereus.kernel.codes import Code
from nereus.kernel.config import KernelConfig
from nereus.kernel.effects import EntryOutcome
from nereus.kernel.keys import message_id
from nereus.kernel.model import ShardMeta, Table
from nereus.kernel.records import Cancel, record_type_of
from nereus.kernel.validation import check_identity
from nereus.runtime.guard import guarded
from nereus.runtime.intake import CommandFuture
from nereus.storage.codec import decode_struct, key_position
from nereus.storage.errors import lmdb_refusal
from nereus.storage.schema import SHARD_META_KEY
from nereus.storage.store import Appendable, ShardStore

if TYPE_CHECKING:
    from nereus.runtime.shard import ShardRuntime

_CANCEL_TAG = record_type_of(Cancel)


def answer_absent(runtime: ShardRuntime, items: Sequence[Appendable]) -> CommandFuture | None:
    """A completed future answering every item `absent` without appending, or None when
    the unit must go through the log (see the module's conditions)."""
    cancels = _plain_cancels(items, runtime.store.config)
    if cancels is None:
        return None
    if runtime.halted is not None or runtime.lost is not None:
        return None
    if not runtime.shard_log.accepts_commands:
        return None
    if runtime.intake.in_flight([c.timer_key for c in cancels]):
        return None
    position = committed_absent(
        runtime.store, [message_id(c.tenant, c.queue, c.timer_key) for c in cancels]
    )
    if position is None:
        return None
    several = len(cancels) > 1
    future = CommandFuture(len(cancels))
    future._set(
        [
            EntryOutcome(
                position, _CANCEL_TAG, False, Code.ABSENT, txn=c.txn, index=i if several else 0
            )
            for i, c in enumerate(cancels)
        ]
    )
    return future


def _plain_cancels(items: Sequence[Appendable], config: KernelConfig) -> list[Cancel] | None:
    """The items as cancels whose verdict on a missing row is `absent`, or None. An item
    the log could not carry raises here as it would at submit (`runtime.guard`)."""
    if not items or not all(
        isinstance(item, tuple) and len(item) == 2 and type(item[0]) is Cancel for item in items
    ):
        return None
    cancels: list[Cancel] = []
    for record, payload in guarded(items):
        if not isinstance(record, Cancel) or payload is not None:
            return None
        # A precondition other than "no row yet" is version_mismatch on a missing row.
        if record.expected_version not in (None, 0):
            return None
        if check_identity(record.tenant, record.queue, record.timer_key, config) is not None:
            return None
        cancels.append(record)
    return cancels


def committed_absent(store: ShardStore, message_ids: Sequence[str]) -> int | None:
    """The applied position of one read snapshot in which the shard accepts commands, the
    whole log is folded and none of the messages has a row; None otherwise."""
    env = store.env
    with lmdb_refusal(env.data_file), env.env.begin() as txn:
        meta = decode_struct(
            ShardMeta, txn.get(SHARD_META_KEY, db=env.meta), env.data_file, "shard meta"
        )
        if meta.shard_status == "FROZEN":
            return None
        with txn.cursor(db=env.log) as cursor:
            # An entry appended but not folded (an import's tail) may hold a schedule.
            if cursor.last() and key_position(cursor.key()) != meta.position:
                return None
        messages = env.tables[Table.MESSAGES]
        for mid in message_ids:
            if txn.get(mid.encode(), None, messages) is not None:
                return None
        return meta.position
