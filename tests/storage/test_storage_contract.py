"""Contract tests every storage implementation must pass, run against each of them.

`StateBaseContract` is what the reducer relies on when it reads through `kernel.StateBase`:
exact gets, absent keys, rows of one table never leaking into another, and `items()` in
ascending key order, which for the timeline means ascending actionAt even for negative and
huge times. It runs over `MappingBase` (plain dicts) and `LmdbBase` (a read transaction of a
real LMDB store) with identical assertions.

`StoreContract` is the apply contract: folding a log through a store, in batches of any size,
gives the state and the effects of `kernel.reduce` folded with no storage at all. It runs over
`MemoryStore` and the LMDB `ShardStore`.
"""

from __future__ import annotations

import abc
import itertools
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nereus import kernel as k
from nereus.kernel.effects import Effect
from nereus.kernel.keys import parse_timeline_key, timeline_key
from nereus.kernel.model import TABLES, PayloadRef, Table, TimelineWork, Value
from nereus.kernel.state import MappingBase, StateBase
from nereus.storage.codec import encode_row
from nereus.storage.memory import MemoryStore
from nereus.storage.schema import StoreOptions
from nereus.storage.store import ShardStore
from tests.support import strategies
from tests.support.builders import (
    DIGEST,
    OTHER_DIGEST,
    T0_MS,
    Shard,
    interval_at,
    mid,
    not_published,
    published,
    schedule,
    unknown,
)

Rows = dict[Table, dict[bytes, Value]]
Applied = list[tuple[k.LogEntry, tuple[Effect, ...]]]

PROPERTY_SETTINGS = settings(
    max_examples=strategies.max_examples(25),
    deadline=None,
    # The property lives on an abstract class run once per store; `self` holds no state.
    suppress_health_check=(
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.differing_executors,
    ),
)

# Times a timeline key must order correctly: the extremes the key encoding allows, around
# zero, and ordinary epoch milliseconds.
EXTREME_TIMES_MS = (
    k.UNBOUNDED.earliest_ms,
    k.UNBOUNDED.earliest_ms + 1,
    -(10**15),
    -256,
    -1,
    0,
    1,
    255,
    256,
    T0_MS,
    10**15,
    k.UNBOUNDED.latest_ms,
    2**63 - 1 + k.UNBOUNDED.earliest_ms,  # the largest time the key encoding can hold
)


def _scenario_rows() -> Rows:
    """Real rows of every table, made by the kernel: a delivered, an uncertain, a publishing,
    a canceled, a dead-lettered (its copy owed) and a scheduled timer, a closed lane and
    shared payload references."""
    shard = Shard(config=k.KernelConfig(max_attempts=1))
    for key in ("k1", "k2", "k3", "k4", "k5", "k6"):
        shard.apply(schedule(key, digest=OTHER_DIGEST if key == "k5" else DIGEST))
    dead = shard.admit("k6")
    shard.apply(shard.outcome(dead, not_published("permanent", "record_too_large")))
    shard.apply(k.Cancel("acme", "reminders", "k4"))
    delivered = shard.admit("k1")
    shard.apply(shard.outcome(delivered, published()))
    uncertain = shard.admit("k2")
    shard.apply(shard.outcome(uncertain, unknown()))
    shard.admit("k3")
    shard.apply(k.LaneGate("acme", "other-queue", "CLOSED"))
    rows: Rows = {table: dict(shard.state.items(table)) for table in TABLES}
    work = rows[Table.TIMELINE][next(iter(rows[Table.TIMELINE]))]
    assert isinstance(work, TimelineWork)
    for i, at_ms in enumerate(EXTREME_TIMES_MS):
        extra = msgspec.structs.replace(work, generation=100 + i)
        rows[Table.TIMELINE][timeline_key(at_ms, work.message_id, 100 + i)] = extra
    # Keys that are prefixes of each other, and the byte extremes, must sort bytewise.
    for raw in (b"\x00", b"a", b"a\x00", b"ab", b"b", b"\xff", b"\xff\xff"):
        rows[Table.PAYLOADS][raw] = PayloadRef(1, len(raw))
    return rows


ROWS = _scenario_rows()


class StateBaseContract(abc.ABC):
    """Identical assertions for every StateBase implementation."""

    @abc.abstractmethod
    def base(self, rows: Rows, tmp_path: Path) -> AbstractContextManager[StateBase]:
        """A base holding exactly `rows`."""

    @pytest.mark.parametrize("table", TABLES, ids=str)
    def test_get_returns_every_stored_row(self, table: Table, tmp_path: Path) -> None:
        assert ROWS[table], f"the scenario has no {table} rows"
        with self.base(ROWS, tmp_path) as base:
            for key, value in ROWS[table].items():
                assert base.get(table, key) == value

    @pytest.mark.parametrize("table", TABLES, ids=str)
    def test_get_of_an_absent_key_is_none(self, table: Table, tmp_path: Path) -> None:
        with self.base(ROWS, tmp_path) as base:
            assert base.get(table, b"no such key") is None
            for key in ROWS[table]:
                assert base.get(table, key + b"#absent") is None
            # A key present in another table is absent in this one.
            for other in TABLES:
                for key in ROWS[other]:
                    if key not in ROWS[table]:
                        assert base.get(table, key) is None

    @pytest.mark.parametrize("table", TABLES, ids=str)
    def test_items_are_all_rows_in_ascending_key_order(self, table: Table, tmp_path: Path) -> None:
        with self.base(ROWS, tmp_path) as base:
            got = list(base.items(table))
        assert [key for key, _ in got] == sorted(ROWS[table])
        assert dict(got) == ROWS[table]

    def test_empty_base_has_no_rows(self, tmp_path: Path) -> None:
        with self.base({}, tmp_path) as base:
            for table in TABLES:
                assert list(base.items(table)) == []
                assert base.get(table, b"k") is None

    def test_timeline_items_are_ordered_by_action_time(self, tmp_path: Path) -> None:
        with self.base(ROWS, tmp_path) as base:
            keys = [key for key, _ in base.items(Table.TIMELINE)]
        parsed = [parse_timeline_key(key) for key in keys]
        assert parsed == sorted(parsed)
        times = [at_ms for at_ms, _, _ in parsed]
        assert set(EXTREME_TIMES_MS) <= set(times)
        assert times == sorted(times)
        assert times[0] == k.UNBOUNDED.earliest_ms

    def test_a_state_over_the_base_reads_and_digests_like_the_rows(self, tmp_path: Path) -> None:
        reference = k.State(k.KernelConfig(), k.ShardMeta(position=7), MappingBase(ROWS))
        with self.base(ROWS, tmp_path) as base:
            state = k.State(k.KernelConfig(), k.ShardMeta(position=7), base)
            assert k.state_digest(state) == k.state_digest(reference)
            for table in TABLES:
                assert list(state.items(table)) == list(reference.items(table))


class TestMappingBase(StateBaseContract):
    @contextmanager
    def base(self, rows: Rows, tmp_path: Path) -> Iterator[StateBase]:
        yield MappingBase({table: dict(table_rows) for table, table_rows in rows.items()})


class TestLmdbBase(StateBaseContract):
    @contextmanager
    def base(self, rows: Rows, tmp_path: Path) -> Iterator[StateBase]:
        with ShardStore.open(str(tmp_path / "store"), options=_no_walk()) as store:
            env = store.env
            with env.env.begin(write=True) as txn:
                for table, table_rows in rows.items():
                    for key, value in table_rows.items():
                        txn.put(key, encode_row(table, value), db=env.tables[table])
            with store.read() as base:
                yield base


def _no_walk() -> StoreOptions:
    # The contract rows are deliberately not a consistent shard (extra timeline rows).
    return StoreOptions(check_invariants_on_open=False)


# The apply contract --------------------------------------------------------------------------


class StoreUnderTest(abc.ABC):
    @abc.abstractmethod
    def apply(self, entries: Sequence[k.LogEntry]) -> Applied: ...

    @abc.abstractmethod
    def digest(self) -> str: ...

    @abc.abstractmethod
    def position(self) -> int: ...


class StoreContract(abc.ABC):
    @abc.abstractmethod
    def store(
        self, path: Path, config: k.KernelConfig, batch_entries: int
    ) -> AbstractContextManager[StoreUnderTest]:
        """A new, empty store at `path` (which may not exist yet)."""

    def check_log(self, path: Path, entries: list[k.LogEntry], batch_sizes: Sequence[int]) -> None:
        config = strategies.CONFIG
        expected_state, expected_effects = k.fold(k.State.initial(config), entries)
        expected = list(zip(entries, expected_effects, strict=True))
        got: Applied = []
        sizes = itertools.cycle(batch_sizes)
        with self.store(path, config, max(batch_sizes)) as store:
            index = 0
            while index < len(entries):
                batch = entries[index : index + next(sizes)]
                got.extend(store.apply(batch))
                index += len(batch)
            assert got == expected
            assert store.position() == expected_state.meta.position
            assert store.digest() == k.state_digest(expected_state)

    @given(
        actions=strategies.action_lists(),
        batch_sizes=st.lists(st.integers(1, 12) | st.just(1_000), min_size=1, max_size=4),
    )
    @PROPERTY_SETTINGS
    def test_batched_apply_equals_a_plain_fold(
        self,
        tmp_path_factory: pytest.TempPathFactory,
        actions: list[strategies.Action],
        batch_sizes: list[int],
    ) -> None:
        driver = strategies.drive(actions, check_invariants=False)
        path = tmp_path_factory.mktemp("contract") / "store"
        self.check_log(path, driver.entries, batch_sizes)

    @pytest.mark.parametrize("batch", [1, 2, 3, 1_000])
    def test_a_full_lifecycle_in_batches(self, tmp_path: Path, batch: int) -> None:
        self.check_log(tmp_path / "store", _lifecycle_entries(), [batch])

    def test_reapplying_applied_entries_changes_nothing(self, tmp_path: Path) -> None:
        entries = _lifecycle_entries()
        with self.store(tmp_path / "store", strategies.CONFIG, 4) as store:
            store.apply(entries)
            digest = store.digest()
            again = store.apply(entries[:3])
            assert [effects[0] for _, effects in again] == [
                k.EntryOutcome(e.position, _tag(e), False, k.Code.POSITION_DUPLICATE)
                for e in entries[:3]
            ]
            assert store.digest() == digest
            assert store.position() == len(entries)


def _tag(entry: k.LogEntry) -> str:
    tag = type(entry.record).__struct_config__.tag
    assert isinstance(tag, str)
    return tag


def _lifecycle_entries() -> list[k.LogEntry]:
    """Schedule, supersede, admit, retry, publish, cancel, expire, dead-letter: one of each."""
    shard = Shard(config=strategies.CONFIG)
    shard.apply(schedule("a"))
    shard.apply(schedule("b", digest=OTHER_DIGEST, size=13))
    shard.apply(schedule("b", txn="txn-2", digest=OTHER_DIGEST, size=13))
    shard.apply(schedule("c", delay_ms=0))
    shard.apply(schedule("d", delay_ms=0))
    first = shard.admit("a")
    shard.apply(shard.outcome(first, not_published()))
    second = shard.admit("a")
    shard.apply(shard.outcome(second, published()))
    shard.apply(k.Cancel("acme", "reminders", "b"))
    uncertain = shard.admit("c")
    shard.apply(shard.outcome(uncertain, unknown()))
    for _ in range(strategies.CONFIG.max_attempts):
        attempt = shard.admit("d")
        shard.apply(shard.outcome(attempt, not_published("permanent", "record_too_large")))
    message = shard.message("d")
    assert message is not None and message.status is k.Status.DEAD_LETTERED
    shard.apply(schedule("e", delay_ms=0))
    e = shard.message("e")
    assert e is not None
    shard.now_ms = e.expire_at_ms + 10
    shard.apply(k.Expire(mid("e"), e.generation, e.version, interval_at(shard.now_ms)))
    shard.apply(k.ShardState("PAUSED"))
    return [entry for entry, _ in shard.history]


class MemoryUnderTest(StoreUnderTest):
    def __init__(self, store: MemoryStore) -> None:
        self.store = store

    def apply(self, entries: Sequence[k.LogEntry]) -> Applied:
        return self.store.apply(entries)

    def digest(self) -> str:
        return k.state_digest(self.store.state)

    def position(self) -> int:
        return self.store.meta.position


class LmdbUnderTest(StoreUnderTest):
    def __init__(self, store: ShardStore) -> None:
        self.store = store

    def apply(self, entries: Sequence[k.LogEntry]) -> Applied:
        return self.store.apply(entries)

    def digest(self) -> str:
        with self.store.state_view() as state:
            return k.state_digest(state)

    def position(self) -> int:
        with self.store.state_view() as state:
            assert state.meta == self.store.meta
            return state.meta.position


class TestMemoryStore(StoreContract):
    @contextmanager
    def store(
        self, path: Path, config: k.KernelConfig, batch_entries: int
    ) -> Iterator[StoreUnderTest]:
        yield MemoryUnderTest(MemoryStore(config, batch_entries=batch_entries))


class TestShardStore(StoreContract):
    @contextmanager
    def store(
        self, path: Path, config: k.KernelConfig, batch_entries: int
    ) -> Iterator[StoreUnderTest]:
        options = StoreOptions(max_batch_entries=batch_entries)
        with ShardStore.open(str(path), config=config, options=options) as store:
            yield LmdbUnderTest(store)
