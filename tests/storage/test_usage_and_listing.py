"""Per-tenant usage (the quota input) and the per-queue key-ordered listing of live timers.

Usage is kernel state (`Table.USAGE`, kept by `Step.put_message`, audited by INV-12); the
listing reads the store's timer index, a derived sub-database written in the same
transaction as the message rows. The properties: usage and listing equal a recount of the
messages after any history, in LMDB and in memory; both survive reopen, snapshot, compaction
and import; and paging with the key cursor while other keys come and go between pages never
skips or repeats a key that stayed live the whole time.
"""

from __future__ import annotations

import hashlib
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lmdb
import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from nereus import kernel as k
from nereus.adapters.kafka.service import KafkaService, KafkaServiceConfig
from nereus.kernel.model import LIVE_STATUSES
from nereus.service.errors import ShardNotLocal
from nereus.storage.codec import encode_value, timer_index_key
from nereus.storage.errors import StoreError
from nereus.storage.jsonl import export_log, import_log
from nereus.storage.memory import MemoryStore
from nereus.storage.schema import HEADER_KEY, SCHEMA_VERSION, StoreOptions
from nereus.storage.snapshot import compact_log, read_snapshot, write_snapshot
from nereus.storage.store import ShardStore
from tests.support import strategies
from tests.support.builders import DIGEST, OTHER_DIGEST, T0_MS, interval_at, published, schedule

PAYLOADS = {DIGEST: b"payload", OTHER_DIGEST: b"other payload"}
FAST = StoreOptions(sync=False)


def recount(state: k.State) -> dict[str, k.TenantUsage]:
    live: Counter[str] = Counter()
    size: Counter[str] = Counter()
    for _key, m in state.items(k.Table.MESSAGES):
        assert isinstance(m, k.Message)
        if m.status in LIVE_STATUSES:
            live[m.tenant] += 1
            size[m.tenant] += m.payload_size
    return {t: k.TenantUsage(live[t], size[t]) for t in live}


def usage_rows(state: k.State) -> dict[str, k.TenantUsage]:
    rows = {key.decode(): v for key, v in state.items(k.Table.USAGE)}
    assert all(isinstance(v, k.TenantUsage) for v in rows.values())
    return rows  # type: ignore[return-value]


def live_keys(state: k.State, tenant: str, queue: str) -> list[str]:
    keys = [
        m.timer_key
        for _key, m in state.items(k.Table.MESSAGES)
        if isinstance(m, k.Message)
        and (m.tenant, m.queue) == (tenant, queue)
        and m.status in LIVE_STATUSES
    ]
    return sorted(keys, key=str.encode)


def page_through(view: Any, tenant: str, queue: str, limit: int) -> list[str]:
    keys: list[str] = []
    after: str | None = None
    for _page in range(1_000):  # bounded: a cursor that does not advance must fail, not hang
        rows, truncated = view.list_timers(tenant, queue, after, limit)
        assert len(rows) <= limit
        assert not truncated or len(rows) == limit
        keys.extend(m.timer_key for m in rows)
        if not truncated:
            return keys
        after = rows[-1].timer_key
    raise AssertionError("paging did not end")


def assert_reads_match(store: ShardStore, state: k.State) -> None:
    """The store's usage and listing answers equal a recount of `state`'s messages."""
    expected = recount(state)
    with store.read() as view:
        for tenant in strategies.TENANTS:
            assert view.tenant_usage(tenant) == expected.get(tenant, k.TenantUsage(0, 0))
        for tenant, queue in strategies.LANES:
            want = live_keys(state, tenant, queue)
            for limit in (1, 2, 1_000):
                assert page_through(view, tenant, queue, limit) == want
    store.check_indexes()


# Usage in the kernel -----------------------------------------------------------------------


@given(actions=strategies.action_lists())
@strategies.props(100)
def test_usage_equals_a_recount_after_every_step(actions: list[strategies.Action]) -> None:
    driver = strategies.drive(actions, check_invariants=False)
    for step in driver.steps:
        assert usage_rows(step.after) == recount(step.after)
        assert all(u.live > 0 for u in usage_rows(step.after).values())
    assert not [v for v in k.invariants.check(driver.state) if v.invariant == "INV-12"]


def test_usage_follows_schedule_content_change_cancel_and_delivery() -> None:
    shard = strategies.Driver(check_invariants=True)

    def usage() -> k.TenantUsage | None:
        return shard.state.usage(b"acme")

    shard.append(schedule("a", size=7), at_ms=T0_MS)
    shard.append(schedule("b", size=7), at_ms=T0_MS)
    assert usage() == k.TenantUsage(2, 14)
    shard.append(schedule("a", txn="txn-2", digest=OTHER_DIGEST, size=13), at_ms=T0_MS)
    assert usage() == k.TenantUsage(2, 20), "a content change moves the bytes, not the count"
    shard.append(k.Cancel("acme", "reminders", "b"), at_ms=T0_MS)
    assert usage() == k.TenantUsage(1, 13)
    m = shard.state.message(k.message_id("acme", "reminders", "a").encode())
    assert m is not None
    admission = k.PublishAdmission(
        m.message_id,
        m.generation,
        m.version,
        f"{k.attempt_prefix(m.message_id, m.generation)}1",
        "claim-1",
        "node-a",
        "d" * 16,
        m.capability,
        interval_at(m.action_at_ms + 10),
        k.Capacity(True),
    )
    shard.append(admission, at_ms=m.action_at_ms + 10)
    assert usage() == k.TenantUsage(1, 13), "PUBLISHING is still live"
    shard.append(
        k.PublishOutcome(admission.attempt_id, m.message_id, m.generation, published()),
        at_ms=m.action_at_ms + 20,
    )
    assert usage() is None, "the row goes when nothing is live"
    assert shard.state.get(k.Table.USAGE, b"globex") is None


def test_a_wrong_usage_row_is_an_invariant_violation() -> None:
    shard = strategies.Driver()
    shard.append(schedule("a"), at_ms=T0_MS)
    state = shard.state
    for wrong in (k.TenantUsage(2, 7), k.TenantUsage(1, 8)):
        broken = state.with_changes(state.meta, state.overlay.set((k.Table.USAGE, b"acme"), wrong))
        assert [v.invariant for v in k.invariants.check(broken)] == ["INV-12"]
    stray = state.with_changes(
        state.meta, state.overlay.set((k.Table.USAGE, b"globex"), k.TenantUsage(1, 1))
    )
    assert [v.invariant for v in k.invariants.check(stray)] == ["INV-12"]


# The store: usage and listing equal the recount -------------------------------------------


def fold_into(store: ShardStore, entries: list[k.LogEntry], batch: int) -> None:
    for start in range(0, len(entries), batch):
        store.apply(entries[start : start + batch])


@given(actions=strategies.action_lists(), batch=st.sampled_from((1, 3, 1_000)), data=st.data())
@strategies.props(30)
def test_store_usage_and_listing_equal_a_recount(
    tmp_path_factory: pytest.TempPathFactory,
    actions: list[strategies.Action],
    batch: int,
    data: st.DataObject,
) -> None:
    driver = strategies.drive(actions, check_invariants=False)
    path = tmp_path_factory.mktemp("usage") / "shard"
    entries = driver.entries
    cut = data.draw(st.integers(0, len(entries)))
    with ShardStore.open(str(path), config=strategies.CONFIG, options=FAST) as store:
        fold_into(store, entries[:cut], batch)
        with store.state_view() as state:
            assert_reads_match(store, state)
        fold_into(store, entries[cut:], batch)
        with store.state_view() as state:
            assert_reads_match(store, state)
        memory = MemoryStore(strategies.CONFIG)
        memory.apply(entries)
        with store.read() as view:
            for tenant, queue in strategies.LANES:
                for after in (None, "k1", "k2", "k0", ""):
                    assert memory.list_timers(tenant, queue, after, 2) == view.list_timers(
                        tenant, queue, after, 2
                    )
                assert memory.tenant_usage(tenant) == view.tenant_usage(tenant)
    # Reopening checks the indexes against the tables (and they agree).
    with (
        ShardStore.open(str(path), config=strategies.CONFIG) as store,
        store.state_view() as state,
    ):
        assert_reads_match(store, state)


# Listing semantics ----------------------------------------------------------------------------

# Byte order of UTF-8, which is not the order of Python's str for every pair (surrogates
# aside they agree), nor case-insensitive, nor "natural".
KEYS = ["B", "a", "a-b", "a0", "ab", "k10", "k2", "z", "é", "ü", "日本"]


@pytest.fixture
def listed(tmp_path: Path) -> Iterator[ShardStore]:
    with ShardStore.open(str(tmp_path / "shard"), options=FAST) as store:
        items: list[tuple[k.Record, bytes | None]] = [
            (schedule(key, txn=f"t-{key}"), PAYLOADS[DIGEST]) for key in reversed(KEYS)
        ]
        items += [
            (schedule("a", queue="other", txn="o"), PAYLOADS[DIGEST]),
            (schedule("a", tenant="globex", txn="g"), PAYLOADS[DIGEST]),
            (schedule("dead", txn="d"), PAYLOADS[DIGEST]),
            (k.Cancel("acme", "reminders", "dead"), None),
        ]
        store.commit(items, T0_MS)
        yield store


def test_listing_is_in_utf8_byte_order_of_the_key_and_only_live(listed: ShardStore) -> None:
    with listed.read() as view:
        rows, truncated = view.list_timers("acme", "reminders", None, 1_000)
    assert [m.timer_key for m in rows] == sorted(KEYS, key=str.encode)
    assert not truncated
    assert all(m.tenant == "acme" and m.queue == "reminders" for m in rows)
    assert all(m.status is k.Status.SCHEDULED for m in rows)


def test_the_cursor_is_exclusive_and_truncated_says_whether_more_follow(
    listed: ShardStore,
) -> None:
    ordered = sorted(KEYS, key=str.encode)
    with listed.read() as view:
        for i, after in enumerate(ordered):
            rows, truncated = view.list_timers("acme", "reminders", after, 3)
            assert [m.timer_key for m in rows] == ordered[i + 1 : i + 4]
            assert truncated == (len(ordered) > i + 4)
        # Exactly `limit` rows left: not truncated.
        rows, truncated = view.list_timers("acme", "reminders", ordered[-4], 3)
        assert ([m.timer_key for m in rows], truncated) == (ordered[-3:], False)
        rows, truncated = view.list_timers("acme", "reminders", None, len(KEYS) - 1)
        assert (len(rows), truncated) == (len(KEYS) - 1, True)
        # A cursor that is not a key, or sorts before or after every key.
        rows, _ = view.list_timers("acme", "reminders", "a-", 2)
        assert [m.timer_key for m in rows] == ["a-b", "a0"]
        assert view.list_timers("acme", "reminders", "", 1)[0][0].timer_key == "B"
        assert view.list_timers("acme", "reminders", "\U0010ffff", 5) == ([], False)
        # Another queue, another tenant, an empty queue, and the prefix boundary.
        assert [m.timer_key for m in view.list_timers("acme", "other", None, 5)[0]] == ["a"]
        assert [m.timer_key for m in view.list_timers("globex", "reminders", None, 5)[0]] == ["a"]
        assert view.list_timers("acme", "remind", None, 5) == ([], False)
        assert view.list_timers("nobody", "reminders", None, 5) == ([], False)
        with pytest.raises(ValueError):
            view.list_timers("acme", "reminders", None, 0)
        assert view.tenant_usage("acme") == k.TenantUsage(len(KEYS) + 1, 7 * (len(KEYS) + 1))
        assert view.tenant_usage("globex") == k.TenantUsage(1, 7)
        assert view.tenant_usage("nobody") == k.TenantUsage(0, 0)


def test_the_index_holds_the_message_id_under_the_lane_prefix(listed: ShardStore) -> None:
    env = listed.env
    with env.env.begin() as txn:
        raw = txn.get(timer_index_key("acme", "reminders", "é"), db=env.timer_index)
        dead = txn.get(timer_index_key("acme", "reminders", "dead"), db=env.timer_index)
    assert raw == k.message_id("acme", "reminders", "é").encode()
    assert dead is None


def test_map_usage_is_a_fraction_of_the_map(tmp_path: Path) -> None:
    with ShardStore.open(
        str(tmp_path / "shard"), options=StoreOptions(map_size_bytes=4 * 1024**2, sync=False)
    ) as store:
        before = store.map_usage()
        assert 0 < before < 0.2
        big = b"x" * 500_000
        digest = hashlib.sha256(big).hexdigest()
        store.commit([(schedule("big", digest=digest, size=len(big)), big)], T0_MS)
        assert store.map_usage() > before + 0.1
        assert store.map_usage() <= 1.0


# Reopen, snapshot, compaction, import ---------------------------------------------------------


def snapshot_of_a_history(path: Path) -> tuple[ShardStore, list[k.LogEntry]]:
    actions: list[strategies.Action] = [
        strategies.DoSchedule(strategies.At(), i, txn=i % 3, content=i % 2)
        for i in range(len(strategies.IDENTITIES))
    ]
    actions += [
        strategies.DoCancel(strategies.At(), 3, raw=True),
        strategies.DoAdmit(strategies.At(), 0, source="worker", raw=True),
        strategies.DoOutcome(strategies.At(), 0, "published"),
        strategies.DoAdmit(strategies.At(), 1, source="worker", raw=True),
        strategies.DoOutcome(strategies.At(), 1, "unknown"),
        strategies.DoCancel(strategies.At(), 7, raw=True),
    ]
    driver = strategies.drive(actions)
    store = ShardStore.open(str(path), config=strategies.CONFIG, options=FAST)
    store.apply(driver.entries)
    return store, driver.entries


def test_reads_survive_reopen_snapshot_compaction_and_import(tmp_path: Path) -> None:
    store, _entries = snapshot_of_a_history(tmp_path / "shard")
    with store:
        with store.state_view() as state:
            expected = {lane: live_keys(state, *lane) for lane in strategies.LANES}
            usage = recount(state)
            assert_reads_match(store, state)
        assert any(expected.values()) and usage
        exported = tmp_path / "log.jsonl"
        with exported.open("w") as out:
            export_log(store, out)
        _path, header = write_snapshot(store)
        # As far as the open obligation (the UNKNOWN attempt's Admission) lets it.
        with store.read() as view:
            admitted = [
                ob.admitted_position
                for _key, ob in view.items(k.Table.OBLIGATIONS)
                if isinstance(ob, k.Obligation)
            ]
        assert admitted
        assert compact_log(store, min(admitted)) == min(admitted) - 1
        with store.state_view() as state:
            assert_reads_match(store, state)
    # Reopen after compaction: the indexes are checked at open.
    with ShardStore.open(str(tmp_path / "shard"), config=strategies.CONFIG) as reopened:
        with reopened.read() as view:
            for lane, keys in expected.items():
                assert page_through(view, *lane, 2) == keys
            for tenant in strategies.TENANTS:
                assert view.tenant_usage(tenant) == usage.get(tenant, k.TenantUsage(0, 0))
        snapshot = tmp_path / "shard" / "snapshots" / f"snapshot-{header.position:016d}.bin"
        _header, memory = read_snapshot(str(snapshot), reopened.config)
    for lane, keys in expected.items():
        assert page_through(memory, *lane, 2) == keys
    assert recount(memory.state) == usage_rows(memory.state) == usage
    with import_log(str(exported), str(tmp_path / "imported")) as imported:
        imported.check_indexes()
        with imported.read() as view:
            for lane, keys in expected.items():
                assert page_through(view, *lane, 3) == keys
            for tenant in strategies.TENANTS:
                assert view.tenant_usage(tenant) == usage.get(tenant, k.TenantUsage(0, 0))


def test_a_damaged_timer_index_is_refused_at_open(tmp_path: Path) -> None:
    store, _ = snapshot_of_a_history(tmp_path / "shard")
    with store:
        env = store.env
        with env.env.begin(write=True) as txn:
            txn.put(timer_index_key("acme", "q1", "ghost"), b"0" * 32, db=env.timer_index)
    with pytest.raises(StoreError, match=r"timer index disagrees with the tables \(a stray row"):
        ShardStore.open(str(tmp_path / "shard"), config=strategies.CONFIG)
    with ShardStore.open(
        str(tmp_path / "shard"),
        config=strategies.CONFIG,
        options=StoreOptions(check_invariants_on_open=False),
    ) as store:
        with store.read() as view, pytest.raises(StoreError, match="absent message"):
            view.list_timers("acme", "q1", None, 5)
        env = store.env
        with env.env.begin(write=True) as txn:
            txn.delete(timer_index_key("acme", "q1", "ghost"), db=env.timer_index)
            txn.delete(timer_index_key("acme", "q1", "k2"), db=env.timer_index)
    with pytest.raises(StoreError, match="a missing row"):
        ShardStore.open(str(tmp_path / "shard"), config=strategies.CONFIG)


# The sub-databases each older layout lacked (version 1: no index; 2: no dead letters).
LATER_DBS = {1: [b"usage", b"timer_index", b"dead_letters"], 2: [b"dead_letters"]}


@pytest.mark.parametrize("version", [1, 2])
def test_an_older_store_is_refused_with_how_to_rebuild_it(tmp_path: Path, version: int) -> None:
    store, _ = snapshot_of_a_history(tmp_path / "shard")
    with store:
        header = msgspec.structs.replace(store.header, schema_version=version)
        env = store.env.env
        with env.begin(write=True) as txn:
            txn.put(HEADER_KEY, encode_value(header), db=store.env.meta)
            for name in LATER_DBS[version]:
                txn.drop(env.open_db(name, txn=txn), delete=True)
    with pytest.raises(
        StoreError,
        match=rf"version {version} has no migration path to {SCHEMA_VERSION}: .*`nereus import`",
    ):
        ShardStore.open(str(tmp_path / "shard"))
    # The refusal wrote nothing: the older build that can export the store still reads it.
    raw = lmdb.open(str(tmp_path / "shard"), max_dbs=32, readonly=True)
    with raw.begin() as txn:
        present = set(txn.cursor().iternext(values=False))
    raw.close()
    assert not present & set(LATER_DBS[version])


# Paging while other keys come and go -----------------------------------------------------------

POOL = [f"k{i:02d}" for i in range(24)] + ["a", "é", "z9"]


@dataclass(frozen=True)
class Change:
    key: str
    schedule: bool  # else cancel


changes = st.builds(Change, st.sampled_from(POOL), st.booleans())


@given(
    initial=st.sets(st.sampled_from(POOL), max_size=len(POOL)),
    limit=st.integers(1, 5),
    between=st.lists(st.lists(changes, max_size=6), max_size=30),
)
@strategies.props(150)
def test_paging_never_skips_or_repeats_a_key_live_throughout(
    tmp_path_factory: pytest.TempPathFactory,
    initial: set[str],
    limit: int,
    between: list[list[Change]],
) -> None:
    path = tmp_path_factory.mktemp("paging") / "shard"
    payload = PAYLOADS[DIGEST]
    now = T0_MS
    with ShardStore.open(str(path), options=FAST) as store:
        if initial:
            store.commit(
                [(schedule(key, txn="t0", delay_ms=60_000), payload) for key in sorted(initial)],
                now,
            )
        live = set(initial)
        throughout = set(initial)
        seen: list[str] = []
        after: str | None = None
        pages = iter(between)
        for _page in range(len(POOL) + 2):  # each page advances the cursor past a key
            with store.read() as view:
                rows, truncated = view.list_timers("acme", "reminders", after, limit)
            page = [m.timer_key for m in rows]
            assert set(page) <= live, "a page shows only keys live when it was read"
            seen.extend(page)
            if not truncated:
                break
            after = page[-1]
            batch = next(pages, [])
            items: list[tuple[k.Record, bytes | None]] = []
            for change in batch:
                if change.schedule:
                    items.append((schedule(change.key, txn=f"t{now}", delay_ms=60_000), payload))
                    live.add(change.key)
                else:
                    items.append((k.Cancel("acme", "reminders", change.key), None))
                    live.discard(change.key)
                    throughout.discard(change.key)
            if items:
                now += 1
                store.commit(items, now)
        else:
            raise AssertionError("paging did not end")
        encoded = [key.encode() for key in seen]
        assert encoded == sorted(set(encoded)), "keys come strictly ascending: no repeats"
        assert throughout <= set(seen), "no key that stayed live was skipped"


# The Kafka-mode facade, over stub shards (no broker) --------------------------------------------


class _Runtime:
    def __init__(self, recovered: bool = True) -> None:
        self.recovered = recovered

    def is_recovered(self) -> bool:
        return self.recovered


@dataclass
class _StubShard:
    partition: int
    store: ShardStore
    runtime: _Runtime
    lock: threading.Lock
    closed: bool = False


def test_the_service_merges_every_shard_in_key_order(tmp_path: Path) -> None:
    service = KafkaService(
        KafkaServiceConfig(bootstrap="unused:1", data_dir=str(tmp_path)),
        clock=None,  # type: ignore[arg-type]
    )
    service.shards = 3
    keys = [f"key-{i:02d}" for i in range(20)]
    stores = [
        ShardStore.open(str(tmp_path / f"shard-{p}"), options=FAST) for p in range(service.shards)
    ]
    try:
        for i, key in enumerate(keys):
            stores[i % 3].commit([(schedule(key, txn=key, size=7), PAYLOADS[DIGEST])], T0_MS)
        stores[0].commit([(schedule("x", tenant="globex"), PAYLOADS[DIGEST])], T0_MS)
        with pytest.raises(ShardNotLocal):
            service.list_timers("reminders", None, 5, tenant="acme")
        for p, store in enumerate(stores[:2]):
            service.ownership.owned[p] = _StubShard(p, store, _Runtime(), threading.Lock())  # type: ignore[assignment]
        with pytest.raises(ShardNotLocal, match=r"\[2\]"):
            service.list_timers("reminders", None, 5, tenant="acme")
        assert service.tenant_usage("acme") == k.TenantUsage(14, 98), "owned shards only"
        service.ownership.owned[2] = _StubShard(2, stores[2], _Runtime(), threading.Lock())  # type: ignore[assignment]
        assert service.tenant_usage("acme") == k.TenantUsage(20, 140)
        assert service.tenant_usage("globex") == k.TenantUsage(1, 7)
        for limit in (1, 3, 7, 20, 50):
            got: list[str] = []
            after: str | None = None
            for _page in range(len(keys) + 1):
                rows, truncated = service.list_timers("reminders", after, limit, tenant="acme")
                got.extend(m.timer_key for m in rows)
                assert len(rows) == limit or not truncated
                if not truncated:
                    break
                after = rows[-1].timer_key
            else:
                raise AssertionError("paging did not end")
            assert got == keys
        rows, truncated = service.list_timers("reminders", "key-16", 3, tenant="acme")
        assert ([m.timer_key for m in rows], truncated) == (["key-17", "key-18", "key-19"], False)
        assert 0 < service.map_usage() < 1
        service.ownership.owned[1].runtime.recovered = False  # type: ignore[attr-defined]
        with pytest.raises(ShardNotLocal, match="shard 1"):
            service.list_timers("reminders", None, 5, tenant="acme")
    finally:
        for store in stores:
            store.close()
