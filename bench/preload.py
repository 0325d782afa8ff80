"""Pending timers preloaded in bulk: the exact rows N delayed schedules leave, without folding
N log entries one by one.

Theory of operation: folding ten million schedules through the reducer takes longer than the
rest of the suite, but the rows they leave are regular. Per timer: one message row and one
timeline row (in LMDB also a lane-index row, a timer-index row and the log entry itself);
shared: the payload reference count, the tenant's usage and the shard counters. So the
reducer folds ONE schedule, its rows are the template (and its outcome the template of the
story index's one mark a timer has in LMDB), and timer i's rows are the template with i's
identity (message id, queue, timer key, request digest, position) put in. Every
preload first checks the shortcut on a small count: the same schedules folded for real
(`MemoryStore.feed`, or `ShardStore.commit` for LMDB) must give byte-identical tables, so a
kernel or storage change the shortcut would misrepresent stops the bench with a message
instead of measuring a state the product never builds.

Timer i is `live-{i}` in queue `q{i % 16}` of tenant `t`, scheduled at `t0_ms` (default
`T0_MS`; a store a live runtime will open needs the present, or its timers are all due), due
one day later, payload `PAYLOAD`, written at log position i + 1.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Callable
from typing import Any

import msgspec

from bench.common import PAYLOAD, T0_MS
from nereus.kernel.commands import request_digest
from nereus.kernel.config import KernelConfig
from nereus.kernel.effects import EntryOutcome
from nereus.kernel.keys import message_id, timeline_key
from nereus.kernel.model import (
    TABLES,
    Message,
    PayloadRef,
    ShardMeta,
    Table,
    TenantUsage,
    TimelineWork,
)
from nereus.kernel.records import LogEntry, Schedule
from nereus.storage.codec import (
    encode_entry,
    encode_row,
    encode_value,
    lane_index_key,
    position_key,
    story_key,
    timer_index_key,
)
from nereus.storage.memory import MemoryStore
from nereus.storage.schema import HEADER_KEY, SHARD_META_KEY, PayloadBlob, StoreOptions
from nereus.storage.store import ShardStore
from nereus.storage.story import encode_mark

TENANT = "t"
QUEUES = 16
TXN = "preload"
DUE_AFTER_MS = 86_400_000
DIGEST = hashlib.sha256(PAYLOAD).hexdigest()
VERIFY_COUNT = 64
_PER_TIMER = {Table.MESSAGES, Table.TIMELINE}
_SHARED = {Table.PAYLOADS, Table.USAGE}

OnProgress = Callable[[int], None]


class PreloadMismatch(RuntimeError):
    """The bulk rows differ from what the product writes: fix bench/preload.py."""


def queue_of(i: int) -> str:
    return f"q{i % QUEUES}"


def key_of(i: int) -> str:
    return f"live-{i}"


def schedule(i: int, t0_ms: int = T0_MS) -> Schedule:
    return Schedule(
        TENANT,
        queue_of(i),
        key_of(i),
        TXN,
        DIGEST,
        len(PAYLOAD),
        deliver_at_ms=t0_ms + DUE_AFTER_MS,
    )


def entry(i: int, t0_ms: int = T0_MS) -> LogEntry:
    return LogEntry(i + 1, t0_ms, schedule(i, t0_ms))


class Template:
    """The rows of schedule 0 as the reducer writes them, and how to make timer i's."""

    def __init__(self, config: KernelConfig, t0_ms: int = T0_MS) -> None:
        self.t0_ms = t0_ms
        store = MemoryStore(config)
        outcomes: list[EntryOutcome] = []
        store.feed(
            [entry(0, t0_ms)],
            lambda _entry, effects: outcomes.extend(
                e for e in effects if isinstance(e, EntryOutcome)
            ),
        )
        # Every timer's mark says the same (its id and position are in the key).
        self.mark = encode_mark(outcomes[0], t0_ms)
        written = {table for table, rows in store.tables.items() if rows}
        if written != _PER_TIMER | _SHARED or any(
            len(store.tables[t]) != 1 for t in _PER_TIMER | _SHARED
        ):
            raise PreloadMismatch(
                f"a delayed schedule now writes the tables {sorted(t.value for t in written)}; "
                "bench/preload.py knows how to replicate only messages, timeline, payloads, "
                "usage"
            )

        def only(table: Table) -> tuple[bytes, Any]:
            return next(iter(store.tables[table].items()))

        _, self.message = only(Table.MESSAGES)
        _, self.work = only(Table.TIMELINE)
        self.payload_key, self.ref = only(Table.PAYLOADS)
        self.usage_key, self.usage = only(Table.USAGE)
        self.meta: ShardMeta = store.meta
        assert isinstance(self.message, Message) and isinstance(self.work, TimelineWork)
        assert isinstance(self.ref, PayloadRef) and isinstance(self.usage, TenantUsage)

    def timer(self, i: int) -> tuple[bytes, Message, bytes, TimelineWork, Schedule]:
        """(message key, message, timeline key, timeline work, the schedule) of timer i."""
        record = schedule(i, self.t0_ms)
        mid = message_id(TENANT, record.queue, record.timer_key)
        message = msgspec.structs.replace(
            self.message,
            message_id=mid,
            queue=record.queue,
            timer_key=record.timer_key,
            request_digest=request_digest(b"schedule", record),
            created_position=i + 1,
            updated_position=i + 1,
        )
        work = msgspec.structs.replace(self.work, queue=record.queue, message_id=mid)
        tkey = timeline_key(message.action_at_ms, mid, message.generation)
        return mid.encode(), message, tkey, work, record

    def shared(self, live: int) -> tuple[PayloadRef, TenantUsage, ShardMeta]:
        """The rows every timer adds to: payload reference, tenant usage, shard meta."""
        ref = msgspec.structs.replace(self.ref, count=live)
        usage = msgspec.structs.replace(
            self.usage, live=live, bytes=live * self.usage.bytes // self.usage.live
        )
        counters = msgspec.structs.replace(self.meta.counters, scheduled=live)
        meta = msgspec.structs.replace(self.meta, position=live, counters=counters)
        return ref, usage, meta


# In memory --------------------------------------------------------------------------------


def _memory_tables(
    template: Template, live: int, on_progress: OnProgress | None
) -> tuple[dict[Table, dict[bytes, Any]], ShardMeta]:
    tables: dict[Table, dict[bytes, Any]] = {t: {} for t in TABLES}
    messages, timeline = tables[Table.MESSAGES], tables[Table.TIMELINE]
    for i in range(live):
        mkey, message, tkey, work, _ = template.timer(i)
        messages[mkey] = message
        timeline[tkey] = work
        if on_progress is not None and (i + 1) % 100_000 == 0:
            on_progress(i + 1)
    if on_progress is not None:
        on_progress(live)
    ref, usage, meta = template.shared(live)
    tables[Table.PAYLOADS][template.payload_key] = ref
    tables[Table.USAGE][template.usage_key] = usage
    return tables, meta


def memory_store(
    live: int,
    *,
    config: KernelConfig | None = None,
    batch_entries: int = 1000,
    on_progress: OnProgress | None = None,
) -> MemoryStore:
    """A `MemoryStore` holding `live` pending timers (checked against a real fold first)."""
    config = config or KernelConfig()
    template = Template(config)
    folded = MemoryStore(config)
    folded.feed(entry(i) for i in range(VERIFY_COUNT))
    tables, meta = _memory_tables(template, VERIFY_COUNT, None)
    if tables != folded.tables or meta != folded.meta:
        bad = [t.value for t in TABLES if tables[t] != folded.tables[t]]
        raise PreloadMismatch(f"bulk rows differ from the reducer's in {bad or ['shard meta']}")
    tables, meta = _memory_tables(template, live, on_progress)
    return MemoryStore(config, meta=meta, tables=tables, batch_entries=batch_entries)


# In an LMDB shard store -------------------------------------------------------------------


def _append(cursor: Any, key: bytes, value: bytes, db: str) -> None:
    if not cursor.put(key, value, append=True):
        raise PreloadMismatch(f"{db}: keys not generated in order")


def _write_lmdb(path: str, live: int, t0_ms: int, on_progress: OnProgress | None) -> None:
    """Every sub-database is written in its key order (LMDB's append mode), so each page is
    filled once and written once: inserting ten million random message ids in batches
    rewrites the same leaf pages over and over (3 GB and a minute per million timers). The
    pages come out full, where random inserts leave them about two thirds full."""
    # No sync per batch: one at the end. A preload is not a durability claim.
    store = ShardStore.open(path, options=StoreOptions(sync=False, check_invariants_on_open=False))
    done = 0
    total = 4 * live

    def step(n: int = 1) -> None:
        nonlocal done
        done += n
        if on_progress is not None and (done % 200_000 == 0 or done == total):
            on_progress(done)

    try:
        if store.log_last_position or store.meta.position:
            raise ValueError(f"{path}: not a fresh store")
        env = store.env
        template = Template(store.config, t0_ms)
        batch = 200_000
        # The log, in position order.
        for start in range(0, live, batch):
            with env.env.begin(write=True) as txn, txn.cursor(db=env.log) as log:
                for i in range(start, min(start + batch, live)):
                    _append(log, position_key(i + 1), encode_entry(entry(i, t0_ms)), "log")
                    step()
        # Messages and timeline, in message id order (every timer is due at the same time,
        # so the timeline's keys sort as their message ids do).
        mids = [message_id(TENANT, queue_of(i), key_of(i)).encode() for i in range(live)]
        by_mid = sorted(range(live), key=mids.__getitem__)
        buckets: dict[str, list[int]] = {}
        for start in range(0, live, batch):
            with (
                env.env.begin(write=True) as txn,
                txn.cursor(db=env.tables[Table.MESSAGES]) as messages,
                txn.cursor(db=env.tables[Table.TIMELINE]) as timeline,
                txn.cursor(db=env.story) as story,
            ):
                for i in by_mid[start : start + batch]:
                    mkey, message, tkey, work, record = template.timer(i)
                    _append(messages, mkey, encode_row(Table.MESSAGES, message), "messages")
                    _append(timeline, tkey, encode_row(Table.TIMELINE, work), "timeline")
                    _append(story, story_key(mkey.decode(), i + 1, 0), template.mark, "story")
                    buckets.setdefault(record.queue, []).append(i)
                    step()
        del by_mid
        # The two indexes, lane by lane.
        lanes = sorted(buckets, key=lambda q: lane_index_key(TENANT, q, b""))
        for queue in lanes:
            at = template.message.action_at_ms
            generation = template.message.generation
            lane_keys = sorted(
                lane_index_key(TENANT, queue, timeline_key(at, mids[i].decode(), generation))
                for i in buckets[queue]
            )
            timer_keys = sorted(
                (timer_index_key(TENANT, queue, key_of(i)), mids[i]) for i in buckets[queue]
            )
            with (
                env.env.begin(write=True) as txn,
                txn.cursor(db=env.lane_timeline) as lane_index,
                txn.cursor(db=env.timer_index) as timer_index,
            ):
                for key in lane_keys:
                    _append(lane_index, key, b"", "lane index")
                    step()
                for key, mkey in timer_keys:
                    _append(timer_index, key, mkey, "timer index")
                    step()
        ref, usage, meta = template.shared(live)
        with env.env.begin(write=True) as txn:
            txn.put(DIGEST.encode(), encode_value(PayloadBlob(live, PAYLOAD)), db=env.payload_bytes)
            for table, key, value in (
                (Table.PAYLOADS, template.payload_key, ref),
                (Table.USAGE, template.usage_key, usage),
            ):
                txn.put(key, encode_row(table, value), db=env.tables[table])
            txn.put(SHARD_META_KEY, encode_value(meta), db=env.meta)
        env.env.sync(True)
    finally:
        store.close()


def _dump(path: str) -> dict[str, dict[bytes, bytes]]:
    store = ShardStore.open(path, options=StoreOptions(check_invariants_on_open=False))
    env = store.env
    dbs: dict[str, Any] = {f"table {t.value}": db for t, db in env.tables.items()}
    dbs.update(
        log=env.log,
        payload_bytes=env.payload_bytes,
        claims=env.claims,
        meta=env.meta,
        lane_timeline=env.lane_timeline,
        timer_index=env.timer_index,
        story=env.story,
    )
    out: dict[str, dict[bytes, bytes]] = {}
    try:
        with env.env.begin() as txn:
            for name, db in dbs.items():
                with txn.cursor(db=db) as cursor:
                    out[name] = {k: v for k, v in cursor if k != HEADER_KEY}
    finally:
        store.close()
    return out


def verify_lmdb(root: str, t0_ms: int = T0_MS) -> None:
    """Raise PreloadMismatch unless the bulk writer and `ShardStore.commit` of the same
    schedules leave identical sub-databases (the store header, with its random id, aside)."""
    with tempfile.TemporaryDirectory(dir=root) as scratch:
        real = ShardStore.open(os.path.join(scratch, "real"))
        try:
            for start in range(0, VERIFY_COUNT, 16):
                items = [(schedule(i, t0_ms), PAYLOAD) for i in range(start, start + 16)]
                real.commit(items, t0_ms)
        finally:
            real.close()
        _write_lmdb(os.path.join(scratch, "bulk"), VERIFY_COUNT, t0_ms, None)
        want, got = _dump(os.path.join(scratch, "real")), _dump(os.path.join(scratch, "bulk"))
        bad = [name for name in want if want[name] != got.get(name)]
        if bad:
            raise PreloadMismatch(f"bulk rows differ from ShardStore.commit's in {bad}")
        # And the product's own audit at open: invariants and derived indexes.
        ShardStore.open(os.path.join(scratch, "bulk")).close()


def lmdb_store(
    path: str, live: int, *, t0_ms: int = T0_MS, on_progress: OnProgress | None = None
) -> None:
    """Create a shard store at `path` holding `live` pending timers, with the log entries
    that scheduled them (checked against real commits first)."""
    verify_lmdb(os.path.dirname(os.path.abspath(path)), t0_ms)
    _write_lmdb(path, live, t0_ms, on_progress)
