"""The story index (`storage/story.py`): for each message, every record of the log that named
it, in log order, each with the verdict the shard answered for it.

The rule is stated from the log alone in `tests/support/story.py` (`rule_marks`): which
records name which message, each with the answer a caller is told for it, computed by the
kernel's reducer in memory, not by the store. The store's marks of a message must be
exactly those, and none other may exist. The crash loop holds a reopened store to the same
rule (`tests/support/crash_worker.py`). The service's side of the same rule, through the
embedded library, is `tests/service/test_story_answers.py`.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

import lmdb
import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from nereus import kernel as k
from nereus.storage.codec import encode_value, story_key
from nereus.storage.errors import CorruptRecord, StoreError
from nereus.storage.schema import (
    HEADER_KEY,
    SCHEMA_VERSION,
    SHARD_META_KEY,
    STORY_FLOOR_KEY,
    StoreOptions,
    StoryMarkRow,
)
from nereus.storage.snapshot import load_snapshot, write_snapshot
from nereus.storage.store import ShardStore
from nereus.storage.transfer import StateImport, export_state
from tests.support import strategies
from tests.support.builders import QUEUE, TENANT, Shard, mid, published, schedule
from tests.support.story import EVERY, Marks, rule_marks, story_problems
from tests.support.two_stores import SETTINGS, assert_same_stores, fold_into

CONFIG = strategies.CONFIG
KEYS = ["k0", "k1", "k2"]
GOLDEN = Path(__file__).resolve().parents[1] / "support" / "golden"
GOLDEN_V6 = GOLDEN / "2026-12-commands-v1-export-v3-schema-6" / "store"


def assert_marks(store: ShardStore, expected: Marks) -> None:
    """The store holds exactly the expected marks: per message, and none besides."""
    assert story_problems(store, expected) == []
    with store.read() as view:
        assert view.story_marks(mid("never-named"), EVERY) == ([], False)


def codes_of(rows: Sequence[StoryMarkRow]) -> list[str]:
    return [str(row.mark.code) for row in rows]


# Generated histories of commands ----------------------------------------------------------------


@st.composite
def commands(draw: st.DrawFn) -> k.Schedule | k.Reschedule | k.Cancel:
    """A command on one of a few keys, or now and then on an invalid one (an empty key: the
    refusal comes before any message is looked at)."""
    key = draw(st.sampled_from([*KEYS, *KEYS, ""]))
    txn = f"txn-{draw(st.integers(0, 2))}"
    delay_ms = draw(st.sampled_from([0, 500, 2_000, strategies.HORIZON_MS + 1]))
    op = draw(st.sampled_from(["schedule", "schedule", "reschedule", "cancel"]))
    if op == "schedule":
        return schedule(key, txn=txn, delay_ms=delay_ms)
    expected = draw(st.sampled_from([None, None, 1, 2]))
    if op == "reschedule":
        return k.Reschedule(TENANT, QUEUE, key, txn, delay_ms=delay_ms, expected_version=expected)
    return k.Cancel(TENANT, QUEUE, key, expected_version=expected, txn=txn)


def _fire(draw: st.DrawFn, shard: Shard) -> None:
    """Admit a scheduled timer once it is due, and record how its attempt went."""
    key = draw(st.sampled_from(KEYS))
    message = shard.message(key)
    if message is None or message.status is not k.Status.SCHEDULED:
        return
    shard.now_ms = max(shard.now_ms, message.action_at_ms + 10)
    admission = shard.admission(key)
    if shard.apply(admission).code is not k.Code.ADMITTED:
        return
    results: list[k.Published | k.NotPublished | k.Unknown] = [
        published(),
        published(),
        k.NotPublished("retriable", "down"),
        k.Unknown("timeout"),
    ]
    result = draw(st.sampled_from(results))
    shard.apply(shard.outcome(admission.attempt_id, result))


@st.composite
def histories(draw: st.DrawFn) -> list[k.LogEntry]:
    """Commands alone or in COMMANDS_V1 batches on a few keys, fires between them (so that
    cancels come too late and reschedules find delivered timers), and now and then a batch
    whose persistence time went back (refused as a whole)."""
    shard = Shard(config=CONFIG, check_invariants=False)
    for _ in range(draw(st.integers(1, 16))):
        shard.now_ms += draw(st.integers(0, 400))
        shape = draw(st.integers(0, 9))
        if shape < 6:
            items = draw(st.lists(commands(), min_size=1, max_size=4))
            single = len(items) == 1 and draw(st.booleans())
            shard.apply(items[0] if single else k.CommandBatch(tuple(items)))
        elif shape < 9:
            _fire(draw, shard)
        elif shard.position > 0:
            items = draw(st.lists(commands(), min_size=1, max_size=3))
            now_ms = shard.now_ms
            shard.apply(
                k.CommandBatch(tuple(items)), at_ms=shard.state.meta.last_persisted_at_ms - 1
            )
            shard.now_ms = now_ms
    return [entry for entry, _ in shard.history]


def _fold(path: Path, entries: Sequence[k.LogEntry], batch: int) -> ShardStore:
    store = ShardStore.open(str(path), config=CONFIG, options=StoreOptions(max_batch_entries=batch))
    for start in range(0, len(entries), batch):
        store.apply(list(entries[start : start + batch]))
    return store


@given(entries=histories(), batch=st.sampled_from([1, 3, 1_000]))
@SETTINGS
def test_each_message_is_marked_by_exactly_the_commands_that_named_it(
    tmp_path_factory: pytest.TempPathFactory, entries: list[k.LogEntry], batch: int
) -> None:
    path = tmp_path_factory.mktemp("story") / "store"
    with _fold(path, entries, batch) as store:
        assert_marks(store, rule_marks(entries, CONFIG))
        with store.read() as view:
            assert view.story_floor() == 1


@given(actions=strategies.action_lists(), batch=st.sampled_from([1, 3, 1_000]))
@SETTINGS
def test_histories_of_every_record_kind_mark_alike_with_and_without_the_compiled_folds(
    tmp_path_factory: pytest.TempPathFactory, actions: list[strategies.Action], batch: int
) -> None:
    """The simulator's histories (expiries, dead-letter copies, misplaced entries, shard
    states among the commands and the fire): the compiled folds and the reducer write the
    same story, byte for byte, and it is the rule's."""
    entries = strategies.drive(actions, check_invariants=False).entries
    root = tmp_path_factory.mktemp("story")
    reference = fold_into(root / "reference", entries, batch, on=False, config=CONFIG)
    compiled = fold_into(root / "compiled", entries, batch, on=True, config=CONFIG)
    assert_same_stores(reference, compiled)
    with ShardStore.open(str(root / "compiled"), config=CONFIG) as store:
        assert_marks(store, rule_marks(entries, CONFIG))


def test_a_fired_timers_story_holds_its_commands_and_none_of_the_fire(tmp_path: Path) -> None:
    """One timer's life, told by its marks: scheduled, rescheduled, delivered (no mark: the
    attempts table tells that), a cancel too late (with the attempt that crossed Admission),
    a reschedule of the delivered timer refused, a cancel of a key never scheduled refused
    before any message was found, and a batch refused as a whole by its persistence time."""
    shard = Shard(config=CONFIG, check_invariants=False)
    shard.apply(schedule("k0", txn="a", delay_ms=500))
    shard.apply(k.Reschedule(TENANT, QUEUE, "k0", "b", delay_ms=1_000))
    attempt_id = shard.admit("k0")
    shard.apply(shard.outcome(attempt_id, published()))
    late = shard.apply(k.CommandBatch((k.Cancel(TENANT, QUEUE, "k0"), schedule("k1"))))
    shard.apply(k.Reschedule(TENANT, QUEUE, "k0", "c", delay_ms=1_000))
    shard.apply(k.Cancel(TENANT, QUEUE, "absent", txn="z"))
    shard.apply(k.Cancel(TENANT, QUEUE, "k1"))
    shard.apply(k.Reschedule(TENANT, QUEUE, "k1", "d", delay_ms=1_000))
    regressed = k.CommandBatch((schedule("k2"), k.Cancel(TENANT, QUEUE, "k0")))
    shard.apply(regressed, at_ms=shard.now_ms - 1)
    entries = [entry for entry, _ in shard.history]
    with _fold(tmp_path / "store", entries, 1_000) as store:
        assert_marks(store, rule_marks(entries, CONFIG))
        with store.read() as view:
            k0, more = view.story_marks(mid("k0"), 10)
            k1, _ = view.story_marks(mid("k1"), 10)
            (absent,), _ = view.story_marks(mid("absent"), 10)
    assert not more
    assert codes_of(k0) == [
        "scheduled", "rescheduled", "too_late", "too_late", "persisted_at_regressed"
    ]  # fmt: skip
    assert [(row.position, row.index) for row in k0] == [(1, 0), (2, 0), (5, 0), (6, 0), (10, 1)]
    assert k0[2].mark.attempt_id == attempt_id == late.attempt_id
    assert k0[4].mark.record_type == "COMMANDS_V1"  # the batch's verdict, told to each item
    assert codes_of(k1) == ["scheduled", "canceled", "absent"]
    assert (absent.mark.code, absent.mark.txn, absent.mark.generation) == ("absent", "z", None)


def test_the_newest_marks_come_in_log_order_with_word_of_older_ones(tmp_path: Path) -> None:
    entries = [
        k.LogEntry(position, 1_000 + position, schedule("k0", txn=f"t{position}"))
        for position in range(1, 8)
    ]
    with _fold(tmp_path / "store", entries, 1_000) as store, store.read() as view:
        every, more = view.story_marks(mid("k0"), 7)
        assert ([row.position for row in every], more) == (list(range(1, 8)), False)
        newest, more = view.story_marks(mid("k0"), 3)
        assert ([row.position for row in newest], more) == ([5, 6, 7], True)
        assert [row.mark.txn for row in newest] == ["t5", "t6", "t7"]
        # The neighbours' keys are not this message's, on either side.
        assert view.story_marks(mid("k1"), 3) == ([], False)
        with pytest.raises(ValueError, match="limit"):
            view.story_marks(mid("k0"), 0)
        with pytest.raises(ValueError, match="not a message id"):
            view.story_marks(mid("k0")[:-1], 3)


def test_a_damaged_mark_is_refused_naming_the_file_and_the_key(tmp_path: Path) -> None:
    with _fold(tmp_path / "store", [k.LogEntry(1, 1_000, schedule("k0"))], 10) as store:
        env = store.env
        key = story_key(mid("k0"), 1, 0)
        with env.env.begin(write=True) as txn:
            raw = bytearray(txn.get(key, db=env.story))
            raw[-1] ^= 0xFF
            txn.put(key, bytes(raw), db=env.story)
        with store.read() as view, pytest.raises(CorruptRecord) as refused:
            view.story_marks(mid("k0"), 5)
    assert env.data_file in str(refused.value)
    assert key.hex() in str(refused.value)


# The floor: where the index begins --------------------------------------------------------------


def _history(path: Path) -> tuple[ShardStore, list[k.LogEntry]]:
    entries = [
        k.LogEntry(1, 1_000, schedule("k0", delay_ms=10_000)),
        k.LogEntry(2, 1_001, k.CommandBatch((schedule("k1"), k.Cancel(TENANT, QUEUE, "k2")))),
    ]
    return _fold(path, entries, 10), entries


def test_a_state_restored_from_a_snapshot_is_indexed_from_the_position_after_it(
    tmp_path: Path,
) -> None:
    """No log was folded into the restored store: its story begins after the snapshot, and
    every command folded from there on is marked."""
    source, _ = _history(tmp_path / "source")
    with source:
        snapshot, header = write_snapshot(source)
    with ShardStore.open(str(tmp_path / "restored"), config=CONFIG) as restored:
        load_snapshot(snapshot, restored)
        later = k.LogEntry(3, 1_002, k.Cancel(TENANT, QUEUE, "k0"))
        restored.apply([later])
        with restored.read() as view:
            assert view.story_floor() == header.position + 1 == 3
            assert [row.position for row in view.story_marks(mid("k0"), 9)[0]] == [3]
            assert view.story_marks(mid("k1"), 9) == ([], False)


def test_an_imported_state_is_indexed_from_the_position_after_it(tmp_path: Path) -> None:
    source, _ = _history(tmp_path / "source")
    with source, export_state(source) as export:
        chunks = list(export.chunks())
        manifest = export.manifest()
    with ShardStore.open(str(tmp_path / "target"), config=CONFIG) as target:
        into = StateImport(target)
        for chunk in chunks:
            into.add(chunk)
        into.finish(manifest)
        with target.read() as view:
            assert view.story_floor() == manifest.position + 1 == 3
            assert view.story_marks(mid("k0"), 9) == ([], False)
        target.discard_state()  # Kafka mode, before a snapshot replaces the state
        with target.read() as view:
            assert view.story_floor() == 1


def test_discarding_the_state_discards_its_story(tmp_path: Path) -> None:
    store, _ = _history(tmp_path / "store")
    with store:
        store.discard_state()
        with store.read() as view:
            assert view.story_floor() == 1
            assert view.story_marks(mid("k0"), 9) == ([], False)


# Schema 6 -> 7 ------------------------------------------------------------------------------------


def _names(path: Path) -> set[bytes]:
    env = lmdb.open(str(path), readonly=True, lock=False, max_dbs=32)
    try:
        with env.begin() as txn:
            return set(txn.cursor().iternext(values=False))
    finally:
        env.close()


def test_a_version_6_store_is_indexed_from_after_its_applied_position(tmp_path: Path) -> None:
    """The golden schema-6 store, as the older build left it: migrated at open, its story
    starts empty after its applied position, and the commands folded after are marked."""
    path = tmp_path / "store"
    shutil.copytree(GOLDEN_V6, path)
    assert b"story" not in _names(path)
    with ShardStore.open(str(path), create=False) as store:
        assert store.header.schema_version == SCHEMA_VERSION == 7
        applied = store.meta.position
        assert applied == store.log_last_position > 0
        with store.read() as view:
            assert view.story_floor() == applied + 1
        rows = list(store.iter_log())
        named = next(e.record for e in rows if isinstance(e.record, k.Schedule))
        assert isinstance(named, k.Schedule)
        cancel = k.Cancel(named.tenant, named.queue, named.timer_key)
        (entry,), _ = store.commit([(cancel, None)], rows[-1].persisted_at_ms)
        with store.read() as view:
            (mark,), more = view.story_marks(
                k.message_id(named.tenant, named.queue, named.timer_key), 9
            )
    assert not more and mark.position == entry.position == applied + 1
    with ShardStore.open(str(path), create=False) as store, store.read() as view:
        assert view.story_floor() == applied + 1  # written durably, once


def _as_version_6(store: ShardStore) -> None:
    """What a schema-6 build leaves: no story sub-database, no floor, header version 6."""
    env = store.env
    header = msgspec.structs.replace(store.header, schema_version=6)
    with env.env.begin(write=True) as txn:
        txn.drop(env.story, delete=True)
        txn.delete(STORY_FLOOR_KEY, db=env.meta)
        txn.put(HEADER_KEY, encode_value(header), db=env.meta)


def test_a_version_6_store_with_an_unfolded_tail_marks_the_tail(tmp_path: Path) -> None:
    """The floor is the applied position + 1, not the log's end + 1: entries the log holds
    but the state has not folded are folded by this build, and marked."""
    path = tmp_path / "store"
    with ShardStore.open(str(path), config=CONFIG) as store:
        store.commit([(schedule("k0"), None)], 1_000)
        store.append([(k.Cancel(TENANT, QUEUE, "k0"), None)], 1_001)
        _as_version_6(store)
    with ShardStore.open(str(path), config=CONFIG) as store:
        with store.read() as view:
            assert view.story_floor() == 2
        store.apply_pending()
        with store.read() as view:
            assert codes_of(view.story_marks(mid("k0"), 9)[0]) == ["canceled"]


def test_a_failed_migration_leaves_the_version_6_store_without_a_story(tmp_path: Path) -> None:
    """The story sub-database is created in the migration's own transaction: a migration that
    fails (here on a damaged shard meta) leaves no sub-database the older build would call
    foreign, and a reader never migrates."""
    path = tmp_path / "store"
    with ShardStore.open(str(path), config=CONFIG) as store:
        store.commit([(schedule("k0"), None)], 1_000)
        _as_version_6(store)
    with pytest.raises(StoreError, match="must be migrated"):
        ShardStore.open(str(path), create=False, read_only=True)
    assert b"story" not in _names(path)
    env = lmdb.open(str(path), max_dbs=32)
    try:
        with env.begin(write=True) as txn:
            meta = env.open_db(b"meta", txn=txn, create=False)
            txn.put(SHARD_META_KEY, b"\x00\x00\x00\x00damaged", db=meta)
    finally:
        env.close()
    with pytest.raises(CorruptRecord, match="shard meta"):
        ShardStore.open(
            str(path), config=CONFIG, options=StoreOptions(check_invariants_on_open=False)
        )
    assert b"story" not in _names(path)
