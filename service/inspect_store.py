"""The console's reads (`service.inspect.Inspection`) over shard stores in this process.

    inspection = StoreInspection(lambda: {0: opened(store, runtime)})

Theory of operation: the shards come from a callable, asked afresh by every read, giving each
shard's `Access`: a context manager that holds the shard open for the read (Kafka mode takes
the shard's lock, so a shard being closed by a rebalance is never read) and yields its store
and runtime, or None when it is not open here now.


Every read opens one LMDB read snapshot of the shard it needs, so a
page is consistent with itself and takes no lock the runtime's tick could wait on. A timer's
story is assembled from what the store already keeps for other reasons (the message row, its
attempts with their admission and resolution positions) and the story index of the commands
that named it (`StoreView.story_marks`); each position found is looked up in the shard log
for its persistence time and what the record said (`service.story`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager

from nereus.kernel.keys import message_id, parse_timeline_key
from nereus.kernel.model import Attempt, DeadLetterPending, Message, Obligation, Status, Table
from nereus.kernel.records import (
    Cancel,
    DeadLetterWritten,
    Evidence,
    Published,
    PublishOutcome,
    Reschedule,
    Schedule,
    members,
)
from nereus.runtime.shard import ShardRuntime
from nereus.service.inspect import (
    LIVE_COUNT_CAP,
    OBLIGATIONS_SORT_CAP,
    RECENT_WINDOW_ENTRIES,
    RECENT_WINDOW_RECORDS,
    TXN_WINDOW_ENTRIES,
    TXN_WINDOW_RECORDS,
    DeadLetter,
    Delivery,
    ObligationRow,
    QueueRow,
    ShardHealth,
    Story,
)
from nereus.service.story import build_story
from nereus.storage import inspect as reads
from nereus.storage.base import StoreView
from nereus.storage.store import ShardStore

Shard = tuple[ShardStore, ShardRuntime]
Access = Callable[[], AbstractContextManager[Shard | None]]


def opened(store: ShardStore, runtime: ShardRuntime) -> Access:
    """The access to a shard that is always open (the embedded service's one shard)."""

    @contextmanager
    def access() -> Iterator[Shard | None]:
        yield store, runtime

    return access


class StoreInspection:
    """`Inspection` over the shards this process holds (see the module)."""

    def __init__(
        self,
        shards: Callable[[], Mapping[int, Access]],
        *,
        owner: str = "",
        snapshot_age_s: Callable[[int], float | None] = lambda _shard: None,
    ) -> None:
        self._shards = shards
        self._owner = owner or f"this process (pid {os.getpid()})"
        self._snapshot_age_s = snapshot_age_s

    def _open(self) -> Iterator[tuple[int, ShardStore, ShardRuntime]]:
        """Each shard open here, in shard order, held open while the caller reads it."""
        for n, access in sorted(self._shards().items()):
            with access() as shard:
                if shard is not None:
                    yield n, shard[0], shard[1]

    def shard_stores(self) -> Mapping[int, ShardStore]:
        return {n: store for n, store, _ in self._open()}

    def shards(self) -> list[ShardHealth]:
        return [self._health(n, s, r) for n, s, r in self._open()]

    def _health(self, shard: int, store: ShardStore, runtime: ShardRuntime) -> ShardHealth:
        status = runtime.clock.describe()
        meta = store.meta
        c = meta.counters
        state, reason = _state(runtime)
        return ShardHealth(
            shard=shard,
            owner=self._owner,
            state=state,
            reason=reason,
            clock_source=status.source,
            clock_bound_ms=status.error_bound_ms if runtime.clock.interval().bounded else None,
            log_position=store.log_last_position,
            applied_position=meta.position,
            snapshot_age_s=self._snapshot_age_s(shard),
            open_obligations=c.attempts_publishing + c.attempts_unknown,
            unknown_attempts=c.attempts_unknown,
            live_timers=c.scheduled + c.publishing + c.uncertain,
            dead_letters_pending=c.dead_letters_pending,
            delivered=c.delivered,
            canceled=c.canceled,
            expired=c.expired,
            dead_lettered=c.dead_lettered,
        )

    def queues(self, tenant: str, limit: int) -> tuple[list[QueueRow], bool]:
        found: dict[str, QueueRow] = {}
        more = False
        for _, store, _ in self._open():
            with store.read() as view:
                names, truncated = reads.tenant_queues(view, tenant, limit)
                more = more or truncated
                for q in names:
                    found[q] = merge_rows(found.get(q), _queue_row(view, tenant, q))
        rows = [found[q] for q in sorted(found, key=lambda q: q.encode())]
        return rows[:limit], more or len(rows) > limit

    def recent_deliveries(self, tenant: str, queue: str | None, limit: int) -> list[Delivery]:
        out: list[Delivery] = []
        for _, store, _ in self._open():
            with store.read() as view:
                out.extend(_deliveries(view, tenant, queue, limit))
        out.sort(key=lambda d: d.persisted_at_ms, reverse=True)
        return out[:limit]

    def dead_letters(self, tenant: str, queue: str | None, limit: int) -> list[DeadLetter]:
        owed: list[DeadLetter] = []
        written: list[DeadLetter] = []
        for _, store, _ in self._open():
            with store.read() as view:
                owed.extend(_owed(view, tenant, queue, limit))
                written.extend(_written(view, tenant, queue, limit))
        written.sort(key=lambda d: d.persisted_at_ms or 0, reverse=True)
        return (owed + written)[:limit]

    def story(self, tenant: str, message_id: str) -> Story | None:
        for _, store, _ in self._open():
            with store.read() as view:
                story = build_story(view, tenant, message_id)
            if story is not None:
                return story
        return None

    def message_of_attempt(self, tenant: str, attempt_id: str) -> str | None:
        for _, store, _ in self._open():
            with store.read() as view:
                attempt = view.get(Table.ATTEMPTS, attempt_id.encode())
                if not isinstance(attempt, Attempt):
                    continue
                m = view.get(Table.MESSAGES, attempt.message_id.encode())
                if isinstance(m, Message) and m.tenant == tenant:
                    return m.message_id
        return None

    def message_of_txn(self, tenant: str, txn: str) -> str | None:
        for _, store, _ in self._open():
            with store.read() as view:
                window = reads.newest_entries(view, TXN_WINDOW_ENTRIES, TXN_WINDOW_RECORDS)
                for entry in window:
                    for record in reversed(members(entry.record)):
                        if (
                            isinstance(record, Schedule | Reschedule | Cancel)
                            and record.txn == txn
                            and record.tenant == tenant
                        ):
                            return message_id(tenant, record.queue, record.timer_key)
        return None

    def obligations(self, tenant: str | None, limit: int) -> tuple[list[ObligationRow], bool]:
        rows: list[ObligationRow] = []
        more = False
        now_ms = int(time.time() * 1000)
        for shard, store, _ in self._open():
            with store.read() as view:
                # Oldest first over all of them, then the tenant's: a page taken before the
                # sort would be the first by attempt id, not the oldest.
                open_now, capped = _open_attempts(view)
                more = more or capped
                found = 0
                for attempt_id, ob in open_now:
                    row = _obligation(
                        view,
                        shard=shard,
                        attempt_id=attempt_id,
                        ob=ob,
                        tenant=tenant,
                        now_ms=now_ms,
                    )
                    if row is None:
                        continue
                    if found == limit:
                        more = True
                        break
                    rows.append(row)
                    found += 1
        rows.sort(key=lambda r: r.admitted_at_ms)
        return rows[:limit], more or len(rows) > limit


def _open_attempts(view: StoreView) -> tuple[list[tuple[str, Obligation]], bool]:
    """The shard's open attempts, oldest admission first (ties by attempt id), at most
    `OBLIGATIONS_SORT_CAP`; and whether more were left unread."""
    out: list[tuple[str, Obligation]] = []
    capped = False
    for key, value in view.items(Table.OBLIGATIONS):
        if len(out) == OBLIGATIONS_SORT_CAP:
            capped = True
            break
        if isinstance(value, Obligation):
            out.append((key.decode(), value))
    out.sort(key=lambda item: (item[1].admitted_at_ms, item[0]))
    return out, capped


def _state(runtime: ShardRuntime) -> tuple[str, str | None]:
    if runtime.halted is not None:
        return "halted", repr(runtime.halted)
    if not runtime.is_recovered():
        return "recovering", "catching up on its log and resolving the attempts open at start"
    if runtime.waiting_for_clock:
        return "waiting for clock", "the clock cannot bound true time: nothing is admitted"
    return "active", None


def _queue_row(view: StoreView, tenant: str, queue: str) -> QueueRow:
    live = reads.count_live(view, tenant, queue, LIVE_COUNT_CAP)
    first = reads.first_lane_key(view, tenant, queue)
    due = parse_timeline_key(first)[0] if first is not None else None
    return QueueRow(queue, live, live >= LIVE_COUNT_CAP, due)


def merge_rows(a: QueueRow | None, b: QueueRow) -> QueueRow:
    """One queue's rows from two shards: counts add, the earlier due wins."""
    if a is None:
        return b
    live = min(a.live + b.live, LIVE_COUNT_CAP)
    dues = [d for d in (a.next_due_ms, b.next_due_ms) if d is not None]
    capped = a.live_capped or b.live_capped or live >= LIVE_COUNT_CAP
    return QueueRow(a.queue, live, capped, min(dues) if dues else None)


def _deliveries(view: StoreView, tenant: str, queue: str | None, limit: int) -> list[Delivery]:
    out: list[Delivery] = []
    for entry in reads.newest_entries(view, RECENT_WINDOW_ENTRIES, RECENT_WINDOW_RECORDS):
        for record in members(entry.record):
            if not isinstance(record, PublishOutcome) or not isinstance(record.result, Published):
                continue
            m = _tenants_message(view, record.message_id, tenant, queue)
            if m is None:
                continue
            ev = record.result.evidence
            out.append(
                Delivery(
                    entry.position,
                    entry.persisted_at_ms,
                    m.queue,
                    m.timer_key,
                    m.message_id,
                    record.attempt_id,
                    m.deliver_at_ms,
                    ev.destination,
                    ev.partition,
                    ev.offset,
                    ev.timestamp_ms,
                )
            )
            if len(out) >= limit:
                return out
    return out


def _tenants_message(view: StoreView, mid: str, tenant: str, queue: str | None) -> Message | None:
    """The message row, if it is the tenant's (and of `queue`, if given)."""
    m = view.get(Table.MESSAGES, mid.encode())
    if not isinstance(m, Message) or m.tenant != tenant:
        return None
    return m if queue is None or m.queue == queue else None


def _owed(view: StoreView, tenant: str, queue: str | None, limit: int) -> list[DeadLetter]:
    """Dead-letter copies still owed (at most `LIVE_COUNT_CAP` read: the table holds only
    copies not yet written, a handful unless the destination refuses them)."""
    out: list[DeadLetter] = []
    for n, (_, value) in enumerate(view.items(Table.DEAD_LETTERS)):
        if n == LIVE_COUNT_CAP or len(out) == limit:
            break
        if not isinstance(value, DeadLetterPending):
            continue
        m = _tenants_message(view, value.message_id, tenant, queue)
        if m is not None:
            out.append(
                DeadLetter(
                    m.queue,
                    m.timer_key,
                    m.message_id,
                    value.generation,
                    value.attempts_spent,
                    value.last_error,
                    None,
                    None,
                    None,
                )
            )
    return out


def _written(view: StoreView, tenant: str, queue: str | None, limit: int) -> list[DeadLetter]:
    out: list[DeadLetter] = []
    for entry in reads.newest_entries(view, RECENT_WINDOW_ENTRIES, RECENT_WINDOW_RECORDS):
        for record in members(entry.record):
            if not isinstance(record, DeadLetterWritten):
                continue
            m = _tenants_message(view, record.message_id, tenant, queue)
            if m is None:
                continue
            out.append(
                DeadLetter(
                    m.queue,
                    m.timer_key,
                    m.message_id,
                    record.generation,
                    m.attempts_admitted if m.generation == record.generation else 0,
                    m.last_error if m.generation == record.generation else None,
                    entry.position,
                    entry.persisted_at_ms,
                    _at(record.evidence),
                )
            )
            if len(out) >= limit:
                return out
    return out


def _at(ev: Evidence) -> str:
    return f"{ev.destination}[{ev.partition}]@{ev.offset}"


def _obligation(
    view: StoreView,
    *,
    shard: int,
    attempt_id: str,
    ob: Obligation,
    tenant: str | None,
    now_ms: int,
) -> ObligationRow | None:
    m = view.get(Table.MESSAGES, ob.message_id.encode())
    if not isinstance(m, Message) or (tenant is not None and m.tenant != tenant):
        return None
    attempt = view.get(Table.ATTEMPTS, attempt_id.encode())
    status = attempt.status.value if isinstance(attempt, Attempt) else "PUBLISHING"
    return ObligationRow(
        shard=shard,
        attempt_id=attempt_id,
        message_id=m.message_id,
        queue=m.queue,
        timer_key=m.timer_key,
        generation=ob.generation,
        status=status,
        admitted_at_ms=ob.admitted_at_ms,
        age_ms=max(0, now_ms - ob.admitted_at_ms),
        waiting_for=_waiting_for(status, m),
    )


def _waiting_for(status: str, m: Message) -> str:
    if status == "UNKNOWN":
        return (
            "proof either way: recovery fences the producer that made the attempt and "
            "searches the destination for it (a restart of the owner runs it)"
        )
    if m.status is Status.PUBLISHING:
        return "the producer's answer; if the owner dies first, recovery searches for it"
    return "the outcome record of this attempt"
