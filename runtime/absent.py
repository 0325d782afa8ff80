"""Cancels that would change nothing, answered from committed state without an entry.

Theory of operation: a cancel whose verdict changes no row (a key with no row, a finished
timer, a precondition that fails, a frozen shard) would add nothing to the log but its
length, and a caller with no grants could grow the log at will that way. `answer_committed`
answers such a unit of cancels without appending. It never decides a cancel itself: it runs
the kernel's reducer (`kernel.reducer.reduce`, the very code that folds the log) on the
record the runtime would append, at the next position, over ONE read snapshot of the store,
and takes the verdict only if the fold wrote nothing — no row, no counter, no shard state,
no effect but the outcomes — so the appended entry would have moved only the log position.
Before that: the runtime runs (not halted, not lost, it takes client commands), and no
command for any of the keys, nor any record that is not a client command, is in flight in
the intake (`Intake.in_flight`); in the snapshot every entry of the log is folded. Anything
else goes through the log as before.

Why the answer is one the log could have given (specs/http.md, "DELETE without an entry"):
the snapshot is the fold of the log up to its applied position P, and a cancel appended
right after P would have been decided by the same reducer on exactly that state. The
snapshot is taken after the request arrived and before it is answered, so P is a point
inside the request's own interval: every command answered before the request arrived
committed at or before P (a commit is visible before its future completes); a command
committed after P is ordered after this cancel, as it would be had the cancel been appended
and won the race. The intake check comes first and keeps the submission order of one caller
as well: a command for the key submitted before this cancel is either still counted (then
the cancel is appended behind it) or complete, and so inside the snapshot. The order of the
two steps matters: read first and check second, and a schedule committed in between would
be neither in the snapshot nor counted.

`submit_drained` is the path of a caller whose appends are rate limited and who has no
token left (specs/http.md, "Rate limit"): a unit the snapshot answers is answered; one whose
verdict changes state (a pending timer's cancel) is appended, never refused; one with
something for its keys in flight is neither, and the caller waits and asks again. A lock
makes the question and the append one step, so two such callers cancelling one pending
timer append once between them: the second finds the first in flight, waits, and is then
answered from the snapshot.

Only the embedded runtime, whose intake sees every command of the shard, can know that
nothing is in flight. In Kafka mode commands reach the shard through the commands topic
from any process and are folded later, so the service keeps appending every cancel there.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

import msgspec

from nereus.kernel.effects import EntryOutcome
from nereus.kernel.records import Appendable, Cancel, LogEntry
from nereus.kernel.reducer import reduce
from nereus.kernel.state import State
from nereus.runtime.batching import MAX_BATCH_ITEMS, command_record
from nereus.runtime.guard import guarded
from nereus.runtime.intake import CommandFuture
from nereus.storage.store import ShardStore

if TYPE_CHECKING:
    from nereus.runtime.shard import ShardRuntime


class Unanswered(enum.Enum):
    """Why a unit was not answered from the snapshot."""

    NOT_CANCELS = "not_cancels"  # not a unit of plain cancels
    UNAVAILABLE = "unavailable"  # the runtime is halted or lost, or takes no commands
    PENDING = "pending"  # something for the keys is in flight, or the log is not all folded
    CHANGES = "changes"  # the kernel's verdict changes state: a pending timer's cancel


def answer_committed(
    runtime: ShardRuntime, items: Sequence[Appendable]
) -> CommandFuture | Unanswered:
    """A completed future with the kernel's verdict on every item, when appending the unit
    would change nothing but the log position (see the module); else why not."""
    cancels = _plain_cancels(items)
    if cancels is None:
        return Unanswered.NOT_CANCELS
    if runtime.halted is not None or runtime.lost is not None:
        return Unanswered.UNAVAILABLE
    if not runtime.shard_log.accepts_commands:
        return Unanswered.UNAVAILABLE
    # The intake first, then the store: see the module for why this order.
    if runtime.intake.in_flight([c.timer_key for c in cancels]):
        return Unanswered.PENDING
    outcomes = committed_verdict(runtime.store, cancels)
    if isinstance(outcomes, Unanswered):
        return outcomes
    future = CommandFuture(len(cancels))
    future._set(outcomes)
    return future


def submit_drained(
    runtime: ShardRuntime, items: Sequence[Appendable], lock: threading.Lock
) -> CommandFuture | None:
    """For a caller with no token left: the unit's future (answered from the snapshot, or
    appended because its verdict changes state), or None while something for its keys is in
    flight (ask again later). Nothing is refused here: a unit that cannot be judged
    (halted, not cancels) is submitted, and `runtime.submit` raises as it would."""
    with lock:
        answered = answer_committed(runtime, items)
        if isinstance(answered, CommandFuture):
            return answered
        if answered is Unanswered.PENDING:
            return None
        return runtime.submit(items)


def _plain_cancels(items: Sequence[Appendable]) -> list[Cancel] | None:
    """The items as cancels that travel as one record, or None. An item the log could not
    carry raises here as it would at submit (`runtime.guard`)."""
    if not items or len(items) > MAX_BATCH_ITEMS:
        return None
    if not all(
        isinstance(item, tuple) and len(item) == 2 and type(item[0]) is Cancel for item in items
    ):
        return None
    cancels: list[Cancel] = []
    for record, payload in guarded(items):
        if not isinstance(record, Cancel) or payload is not None:
            return None
        cancels.append(record)
    return cancels


def committed_verdict(
    store: ShardStore, cancels: Sequence[Cancel]
) -> list[EntryOutcome] | Unanswered:
    """The reducer's outcomes for `cancels` appended as one record right after the applied
    position P of one read snapshot, each carrying P, if that fold would change nothing but
    the log position; else why not."""
    with store.folded_state() as before:
        if before is None:
            return Unanswered.PENDING
        record, _payloads = command_record([(c, None) for c in cancels])
        # The log's time never goes backwards, and a cancel's verdict does not read it.
        meta = before.meta
        entry = LogEntry(meta.position + 1, meta.last_persisted_at_ms, record)
        after, effects = reduce(before, entry)
    if not changes_nothing(before, after, effects, len(cancels)):
        return Unanswered.CHANGES
    position = meta.position
    return [
        msgspec.structs.replace(e, position=position)
        for e in effects
        if isinstance(e, EntryOutcome)
    ]


def changes_nothing(before: State, after: State, effects: Sequence[object], count: int) -> bool:
    """Whether a fold from `before` to `after` moved only the log position: no row written
    (the overlay is the very same object), the counters, shard status and persistence time
    as they were, and no effect but one outcome per item."""
    return (
        after.overlay is before.overlay
        and after.meta.position == before.meta.position + 1
        and after.meta.counters == before.meta.counters
        and after.meta.shard_status == before.meta.shard_status
        and after.meta.last_persisted_at_ms == before.meta.last_persisted_at_ms
        and len(effects) == count
        and all(isinstance(e, EntryOutcome) for e in effects)
    )
