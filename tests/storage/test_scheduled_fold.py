"""The compiled fold of first schedules against the Python kernel.

The rule (specs/compiled.md): a record of schedules the compiled fold takes must leave every
row of the store, byte for byte, and every effect exactly as the reducer leaves them, and a
record it cannot take whole goes to the reducer untouched. A first schedule writes four
rows (the message, its timeline row, the payload reference, the tenant's usage), and the
command's own checks decide whether it is one at all. So the histories here mix first
schedules in every string and integer form with what must fall back: a key scheduled
before or twice in one batch, each kind of invalid command, a precondition, a reschedule
or cancel in the same batch, a frozen shard.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from nereus import kernel as k
from nereus.kernel import native
from nereus.kernel.model import Table
from nereus.kernel.records import IMMEDIATE
from nereus.storage.codec import frame, remembered
from nereus.storage.store import ShardStore
from tests.support import strategies
from tests.support.two_stores import SETTINGS, Calls, Dump, assert_same_stores, dump, fold_into

pytestmark = pytest.mark.skipif(
    native.fold_scheduled is None, reason="the source build has no compiled fold to compare"
)


CONFIG = strategies.CONFIG
T0_MS = 1_800_000_000_000
HORIZON_MS = strategies.HORIZON_MS
LIFETIME_MS = strategies.LIFETIME_MS
DIGESTS = ["a" * 64, "b" * 64]

# Strings across msgspec's forms (fixstr, str8, str16) and a few the checks refuse.
texts = st.text(min_size=1, max_size=40) | st.text(min_size=200, max_size=300)
names = st.sampled_from(["acme", "globex", "a/b", "", "x" * 151]) | st.text(max_size=12)
sizes = st.sampled_from([0, 1, 127, 128, 255, 256, 65_535, 65_536, 300_000, -1])
headers = st.lists(
    st.tuples(st.sampled_from(["h", "nereus-x", ""]) | texts, texts), max_size=3
).map(tuple)
valid_capabilities = st.sampled_from(
    [IMMEDIATE, k.Capability("delayed_handoff", 1_000, 50), k.Capability("delayed_handoff", 0, 0)]
)
capabilities = valid_capabilities | st.sampled_from(
    [
        k.Capability("delayed_handoff", 3_000, 0),  # refused: a lead beyond the limit
        k.Capability("immediate", 5, 0),  # refused: an immediate capability has no lead
    ]
)


def _fits(limit: int) -> Callable[[str], bool]:
    return lambda text: "\x00" not in text and "/" not in text and len(text.encode()) <= limit


# What a valid schedule may hold, in every string and integer form msgspec has.
valid_keys = texts.filter(_fits(CONFIG.max_identity_bytes))
valid_sizes = st.sampled_from([0, 1, 127, 128, 255, 256, 65_535, 65_536])
valid_headers = st.lists(
    st.tuples(texts.filter(lambda t: not t.lower().startswith("nereus-")), texts), max_size=3
).map(tuple)


@st.composite
def schedules(draw: st.DrawFn, keys: list[str]) -> k.Schedule:
    """A schedule, three times in four one whose checks all pass; its key from a small set
    most of the time, so that keys repeat across and within records."""
    if draw(st.integers(0, 3)) == 0:
        return draw(invalid_schedules(keys))
    absolute = draw(st.booleans())
    offset_ms = draw(st.sampled_from([0, 1_000, 15_000, -5_000]))
    return k.Schedule(
        tenant=draw(st.sampled_from(["acme", "globex"])),
        queue=draw(st.just("reminders") | valid_keys),
        timer_key=draw(st.sampled_from(keys) | valid_keys),
        txn=draw(texts.filter(_fits(CONFIG.max_txn_bytes))),
        payload_digest=draw(st.sampled_from(DIGESTS)),
        payload_size=draw(valid_sizes),
        deliver_at_ms=T0_MS + offset_ms if absolute else None,
        delay_ms=None if absolute else max(offset_ms, 0),
        lifetime_ms=draw(st.sampled_from([None, None, 5_000])),
        partition_key=draw(st.none() | texts),
        headers=draw(valid_headers),
        destination=draw(st.just("default") | texts),
        capability=draw(valid_capabilities),
        expected_version=draw(st.sampled_from([None, None, 0])),
        producer_sub=draw(st.none() | texts),
        encrypted=draw(st.booleans()),
    )


@st.composite
def invalid_schedules(draw: st.DrawFn, keys: list[str]) -> k.Schedule:
    """A schedule any field of which may break a check (or all may pass)."""
    absolute = draw(st.booleans())
    # Within the test limits (strategies.CONFIG), and past them.
    offset_ms = draw(st.sampled_from([0, 1_000, 15_000, HORIZON_MS + 1, -5_000]))
    lifetime = draw(st.sampled_from([None, None, 10, 5_000, LIFETIME_MS + 1]))
    return k.Schedule(
        tenant=draw(st.sampled_from(["acme", "globex"]) | names),
        queue=draw(st.just("reminders") | names),
        timer_key=draw(st.sampled_from(keys) | texts),
        txn=draw(texts | st.just("")),
        payload_digest=draw(st.sampled_from([*DIGESTS, "not-hex"])),
        payload_size=draw(sizes),
        deliver_at_ms=T0_MS + offset_ms if absolute else None,
        delay_ms=None if absolute else max(offset_ms, 0),
        lifetime_ms=lifetime,
        partition_key=draw(st.none() | texts),
        headers=draw(headers),
        destination=draw(st.just("default") | texts),
        capability=draw(capabilities),
        expected_version=draw(st.sampled_from([None, None, None, 0, 1])),
        producer_sub=draw(st.none() | texts),
        encrypted=draw(st.booleans()),
    )


@st.composite
def schedule_histories(draw: st.DrawFn) -> list[k.LogEntry]:
    """Records of schedules, alone or in COMMANDS_V1 batches, with now and then a
    reschedule, a cancel or a shard state record among them."""
    keys = [f"k{i}" for i in range(draw(st.integers(1, 8)))]
    entries: list[k.LogEntry] = []
    at_ms = T0_MS
    for position in range(1, draw(st.integers(1, 12)) + 1):
        at_ms += draw(st.integers(0, 5))
        shape = draw(st.integers(0, 9))
        record: k.Record
        if shape == 0:
            record = draw(schedules(keys))
        elif shape == 1:
            record = k.ShardState(draw(st.sampled_from(["FROZEN", "ACTIVE_FOR_COMMANDS"])))
        else:
            items: list[k.Schedule | k.Reschedule | k.Cancel] = list(
                draw(st.lists(schedules(keys), min_size=1, max_size=6))
            )
            if shape == 2:
                key = draw(st.sampled_from(keys))
                other: k.Reschedule | k.Cancel = (
                    k.Cancel("acme", "reminders", key)
                    if draw(st.booleans())
                    else k.Reschedule("acme", "reminders", key, "txn-r", delay_ms=5_000)
                )
                items.insert(draw(st.integers(0, len(items))), other)
            record = k.CommandBatch(tuple(items))
        entries.append(k.LogEntry(position, at_ms, record))
    return entries


@given(entries=schedule_histories(), batch=st.sampled_from([1, 3, 1_000]))
@SETTINGS
def test_schedule_histories_fold_to_the_same_store_with_and_without_the_compiled_fold(
    tmp_path_factory: pytest.TempPathFactory, entries: list[k.LogEntry], batch: int
) -> None:
    root = tmp_path_factory.mktemp("scheduled")
    reference = fold_into(root / "reference", entries, batch, on=False, config=CONFIG)
    compiled = fold_into(root / "compiled", entries, batch, on=True, config=CONFIG)
    assert_same_stores(reference, compiled)
    _, expected_effects = k.fold(k.State.initial(CONFIG), entries)
    assert [effects for _, effects in compiled[0]] == expected_effects
    _assert_filed_values_are_the_rows(compiled[1])


def _assert_filed_values_are_the_rows(rows: Dump) -> None:
    """A row the compiled fold filed in the codec's memo (so that it is not decoded when
    read) is filed under a value that encodes to exactly its bytes."""
    for table in (Table.MESSAGES, Table.TIMELINE):
        for data in rows[table.value.encode()].values():
            value = remembered(table, data)
            if value is not None:
                assert frame(msgspec.msgpack.encode(msgspec.structs.astuple(value))) == data


def _first_schedules(n: int, *, tenant: str = "acme") -> k.CommandBatch:
    return k.CommandBatch(
        tuple(
            k.Schedule(
                tenant,
                "reminders",
                f"t{i}",
                f"txn-{i}",
                DIGESTS[i % 2],
                100 + i,
                delay_ms=10_000,
                headers=(("trace", f"{i}"),),
            )
            for i in range(n)
        )
    )


def _taken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, entries: list[k.LogEntry]
) -> tuple[int, int]:
    """How many records the compiled fold took with it off and on; the stores must agree."""
    calls = Calls(native.fold_scheduled)
    monkeypatch.setattr(native, "fold_scheduled", calls)
    reference = fold_into(tmp_path / "reference", entries, 1_000, on=False, config=CONFIG)
    off = calls.taken
    compiled = fold_into(tmp_path / "compiled", entries, 1_000, on=True, config=CONFIG)
    assert_same_stores(reference, compiled)
    return off, calls.taken


def test_a_batch_of_first_schedules_takes_the_compiled_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The shape an HTTP batch is made of takes the path: if it fell back, the path would
    be dead code the comparison above passes trivially."""
    entries = [
        k.LogEntry(1, T0_MS, _first_schedules(5)),
        k.LogEntry(2, T0_MS + 1, _first_schedules(3, tenant="globex")),
    ]
    assert _taken(tmp_path, monkeypatch, entries) == (0, 2)
    with ShardStore.open(str(tmp_path / "compiled"), config=CONFIG) as store:
        rows = dump(store)
    _assert_filed_values_are_the_rows(rows)
    filed = [remembered(Table.MESSAGES, data) for data in rows[b"messages"].values()]
    assert len(filed) == 8
    for message in filed:
        # Discovery compares the status by identity: the member, not an equal string.
        assert isinstance(message, k.Message) and message.status is k.Status.SCHEDULED


@pytest.mark.parametrize(
    "spoiler",
    [
        pytest.param(k.Schedule("acme", "reminders", "t0", "txn-9", "a" * 64, 1), id="same-key"),
        pytest.param(k.Schedule("acme", "a/b", "t9", "txn-9", "a" * 64, 1), id="bad-identity"),
        pytest.param(
            k.Schedule("acme", "reminders", "t9", "txn-9", "a" * 64, 1, delay_ms=HORIZON_MS + 1),
            id="beyond-horizon",
        ),
        pytest.param(
            k.Schedule("acme", "reminders", "t9", "txn-9", "a" * 64, 1, expected_version=2),
            id="precondition",
        ),
        pytest.param(k.Cancel("acme", "reminders", "t9"), id="a-cancel"),
    ],
)
def test_a_batch_with_one_item_that_is_not_a_first_schedule_goes_to_the_reducer_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spoiler: k.Schedule | k.Cancel
) -> None:
    batch = _first_schedules(3)
    entries = [k.LogEntry(1, T0_MS, k.CommandBatch((*batch.items, spoiler)))]
    assert _taken(tmp_path, monkeypatch, entries) == (0, 0)


def test_a_frozen_shard_leaves_schedules_to_the_reducer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    entries = [
        k.LogEntry(1, T0_MS, k.ShardState("FROZEN")),
        k.LogEntry(2, T0_MS, _first_schedules(2)),
    ]
    assert _taken(tmp_path, monkeypatch, entries) == (0, 0)


def _stored_pair(tmp_path: Path, table: Table, key: bytes, body: bytes) -> ShardStore:
    """A store after one schedule, with one of its two-integer rows rewritten as `body`."""
    store = ShardStore.open(str(tmp_path / "store"), config=CONFIG)
    store.apply([k.LogEntry(1, T0_MS, _first_schedules(1))])
    with store.env.env.begin(write=True) as txn:
        txn.put(key, frame(body), db=store.env.tables[table])
    return store


@pytest.mark.parametrize(
    ("table", "key"),
    [(Table.PAYLOADS, DIGESTS[0].encode()), (Table.USAGE, b"acme")],
    ids=["payload-ref", "usage"],
)
def test_a_row_not_in_msgspecs_form_is_left_to_the_reducer(
    tmp_path: Path, table: Table, key: bytes
) -> None:
    """Counts of 1 and 100 written with a wider integer than msgspec uses: the reducer reads
    them as the same numbers; the crate declines to copy what msgspec would not write."""
    store = _stored_pair(tmp_path, table, key, b"\x92\xcc\x01\xcc\x64")
    try:
        with store.env.env.begin(write=True) as txn:
            dbs = {t.value: store.env.tables[t] for t in Table}
            get = lambda name, row: txn.get(row, None, dbs[name])  # noqa: E731
            item = (
                (k.message_id("acme", "reminders", "n1"), "acme", "reminders", "n1", "x", "d"),
                (DIGESTS[0], 5, None, (), "default", b"\x80", None, False),
                (T0_MS, T0_MS + 5_000, T0_MS, b"key"),
            )
            fold_scheduled = native.fold_scheduled
            assert fold_scheduled is not None
            assert fold_scheduled(get, [item], 2, T0_MS) is None
            canonical = b"\x92\x01\x64"
            txn.put(key, frame(canonical), db=store.env.tables[table])
            assert fold_scheduled(get, [item], 2, T0_MS) is not None
    finally:
        store.close()
