"""The LMDB shard store: the embedded log, durable write batches and payload bytes.

Every test runs against a real LMDB environment in a pytest tmp_path. Where a test found a
storage bug it stays, asserting the correct behaviour, marked xfail(strict=True).
"""

from __future__ import annotations

import hashlib
import random
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import lmdb
import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.migration import rows_as_maps
from nereus import kernel as k
from nereus.kernel.codes import POSITION_CODES
from nereus.kernel.effects import EntryOutcome, Publish
from nereus.kernel.keys import timeline_key
from nereus.kernel.model import AttemptStatus, Table, TimelineWork
from nereus.kernel.records import Appendable
from nereus.replay.fold import replay
from nereus.storage.base import LmdbBase
from nereus.storage.claims import ClaimRows
from nereus.storage.codec import decode_struct, encode_value, frame
from nereus.storage.errors import CorruptRecord, StoreError
from nereus.storage.schema import (
    HEADER_KEY,
    SCHEMA_VERSION,
    SHARD_META_KEY,
    LogInfo,
    StoreHeader,
    StoreOptions,
)
from nereus.storage.snapshot import compact_log, write_snapshot
from nereus.storage.store import Applied, ShardStore
from tests.support import strategies
from tests.support.builders import (
    DIGEST,
    OTHER_DIGEST,
    T0_MS,
    interval_at,
    mid,
    published,
    schedule,
)
from tests.support.crash_worker import CONFIG, Workload, store_problems

ROOT = Path(__file__).resolve().parents[2]
PAYLOAD = b"payload"
OTHER_PAYLOAD = b"other payload"
BYTES_BY_DIGEST = {DIGEST: PAYLOAD, OTHER_DIGEST: OTHER_PAYLOAD}
assert hashlib.sha256(PAYLOAD).hexdigest() == DIGEST
assert hashlib.sha256(OTHER_PAYLOAD).hexdigest() == OTHER_DIGEST


@pytest.fixture
def store(tmp_path: Path) -> Iterator[ShardStore]:
    with ShardStore.open(str(tmp_path / "shard")) as opened:
        yield opened


def live_digest(store: ShardStore) -> str:
    with store.state_view() as state:
        return k.state_digest(state)


def replay_digest(store: ShardStore) -> str:
    _, result = replay(store.iter_log(1, store.meta.position), store.config)
    assert result.position == store.meta.position
    return result.digest


def outcome_of(applied: Applied) -> EntryOutcome:
    first = applied[1][0]
    assert isinstance(first, EntryOutcome)
    return first


def codes(results: list[Applied]) -> list[k.Code]:
    return [outcome_of(result).code for result in results]


def admission_for(store: ShardStore, key: str, now_ms: int, seq: int = 1) -> k.PublishAdmission:
    with store.read() as base:
        message = base.get(Table.MESSAGES, mid(key).encode())
    assert isinstance(message, k.Message)
    return k.PublishAdmission(
        message_id=message.message_id,
        generation=message.generation,
        version=message.version,
        attempt_id=f"{k.attempt_prefix(message.message_id, message.generation)}{seq}",
        claim_id=f"claim-{seq}",
        owner="node-a",
        descriptor_hash="d" * 16,
        capability=message.capability,
        interval=interval_at(now_ms),
        capacity=k.Capacity(True),
    )


# The embedded log --------------------------------------------------------------------------


def test_append_stamps_dense_positions_and_clamps_a_clock_that_goes_back(
    store: ShardStore,
) -> None:
    first = store.append([(schedule("a"), PAYLOAD), (schedule("b"), PAYLOAD)], T0_MS + 100)
    back = store.append([(k.Cancel("acme", "reminders", "a"), None)], T0_MS + 40)
    later = store.append([(k.Cancel("acme", "reminders", "b"), None)], T0_MS + 200)
    entries = [*first, *back, *later]
    assert [e.position for e in entries] == [1, 2, 3, 4]
    assert [e.persisted_at_ms - T0_MS for e in entries] == [100, 100, 100, 200]
    assert list(store.iter_log()) == entries
    assert list(store.iter_log(2, 3)) == entries[1:3]
    assert store.log_last_position == 4
    assert store.meta.position == 0, "appending folds nothing"


def test_positions_and_the_clamp_survive_close_and_reopen(tmp_path: Path) -> None:
    path = str(tmp_path / "shard")
    with ShardStore.open(path) as store:
        store.append([(schedule("a"), PAYLOAD)], T0_MS + 500)
        store.apply_pending()
        store.append([(k.Cancel("acme", "reminders", "zz"), None)], T0_MS + 900)
    with ShardStore.open(path) as store:
        assert (store.meta.position, store.log_last_position) == (1, 2)
        assert store.log_last_persisted_at_ms == T0_MS + 900
        [entry] = store.append([(schedule("b"), PAYLOAD)], T0_MS)
        assert (entry.position, entry.persisted_at_ms) == (3, T0_MS + 900)
        assert codes(store.apply_pending()) == [k.Code.ABSENT, k.Code.SCHEDULED]
        times = [e.persisted_at_ms for e in store.iter_log()]
        assert times == sorted(times)


def test_the_clamp_survives_a_reopen_after_the_whole_log_was_compacted(tmp_path: Path) -> None:
    path = str(tmp_path / "shard")
    with ShardStore.open(path) as store:
        store.append([(schedule("a"), PAYLOAD)], T0_MS + 5_000)
        store.apply_pending()
        write_snapshot(store)
        assert compact_log(store, 2) == 1
    with ShardStore.open(path) as store:
        [entry] = store.append([(schedule("b"), PAYLOAD)], T0_MS)
        assert entry.persisted_at_ms >= T0_MS + 5_000
        assert codes(store.apply_pending()) == [k.Code.SCHEDULED]


# Durable write batches ---------------------------------------------------------------------


def test_apply_pending_folds_in_batches_bounded_by_the_options(tmp_path: Path) -> None:
    options = StoreOptions(max_batch_entries=3)
    with ShardStore.open(str(tmp_path / "shard"), options=options) as store:
        store.append([(schedule(f"k{i}"), PAYLOAD) for i in range(10)], T0_MS)
        sizes = []
        while batch := store.apply_pending():
            sizes.append(len(batch))
            assert [e.position for e, _ in batch] == list(
                range(store.meta.position - len(batch) + 1, store.meta.position + 1)
            )
        assert sizes == [3, 3, 3, 1]
        assert store.meta.position == 10
        assert store.apply_pending(2) == []
        store.append([(schedule(f"x{i}"), PAYLOAD) for i in range(4)], T0_MS)
        assert len(store.apply_pending(2)) == 2, "a smaller explicit bound is honoured"


def test_apply_pending_never_exceeds_the_configured_bound(tmp_path: Path) -> None:
    options = StoreOptions(max_batch_entries=3)
    with ShardStore.open(str(tmp_path / "shard"), options=options) as store:
        store.append([(schedule(f"k{i}"), PAYLOAD) for i in range(10)], T0_MS)
        assert len(store.apply_pending(8)) == 3


_SECOND_HANDLE = """
import sys
from nereus.runtime import compiled
compiled.from_environment()
from nereus.kernel.model import Table
from nereus.storage.base import LmdbBase
from nereus.storage.codec import decode_struct
from nereus.storage.schema import SHARD_META_KEY, StoreOptions
from nereus.storage.store import ShardStore
with ShardStore.open(sys.argv[1], create=False, read_only=True) as store, store.read() as base:
    attempt = base.get(Table.ATTEMPTS, sys.argv[2].encode())
    print(store.meta.position, attempt.status if attempt else None)
"""


def test_effects_are_returned_only_after_the_batch_is_committed(tmp_path: Path) -> None:
    path = str(tmp_path / "shard")
    with ShardStore.open(path) as store:
        store.append([(schedule("a", delay_ms=0), PAYLOAD)], T0_MS)
        store.apply_pending()
        admission = admission_for(store, "a", T0_MS + 10)
        store.append([(admission, None)], T0_MS + 10)
        [(entry, effects)] = store.apply_pending()
        publishes = [e for e in effects if isinstance(e, Publish)]
        assert [p.attempt_id for p in publishes] == [admission.attempt_id]
        # A separate read transaction sees the attempt PUBLISHING and the position...
        env = store.env
        with env.env.begin() as txn:
            base = LmdbBase(txn, env.tables, env.data_file)
            attempt = base.get(Table.ATTEMPTS, admission.attempt_id.encode())
            assert isinstance(attempt, k.Attempt)
            assert attempt.status is AttemptStatus.PUBLISHING
            raw_meta = txn.get(SHARD_META_KEY, db=env.meta)
            meta = decode_struct(k.ShardMeta, raw_meta, env.data_file, "shard meta")
            assert meta.position == entry.position
        # ...and so does a second handle in another process, which can only see what is
        # committed to the file.
        seen = subprocess.run(
            [sys.executable, "-c", _SECOND_HANDLE, path, admission.attempt_id],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        )
        assert seen.stdout.split() == [str(entry.position), "PUBLISHING"]


@contextmanager
def corrupt_message_row(store: ShardStore, key: str) -> Iterator[None]:
    """Garbage in the messages row of `key` while the block runs: the reducer's read of it
    raises in the middle of a fold, as a damaged page would. (The fold calls the reducer
    natively once compiled, so a failure cannot be patched in.)"""
    row = mid(key).encode()
    db = store.env.tables[Table.MESSAGES]
    with store.env.env.begin(write=True) as txn:
        assert txn.get(row, db=db) is None
        txn.put(row, b"\x00\x00\x00\x00garbage", db=db)
    try:
        yield
    finally:
        with store.env.env.begin(write=True) as txn:
            txn.delete(row, db=db)


def test_an_exception_in_the_fold_aborts_the_whole_batch(store: ShardStore) -> None:
    store.append([(schedule("a"), PAYLOAD)], T0_MS)
    store.apply_pending()
    before = live_digest(store)
    meta_before = store.meta
    store.append(
        [(schedule(f"k{i}", digest=OTHER_DIGEST, size=13), OTHER_PAYLOAD) for i in range(5)], T0_MS
    )
    # The third entry's read fails after two were folded into the batch.
    with corrupt_message_row(store, "k2"), pytest.raises(CorruptRecord, match="messages"):
        store.apply_pending()
    assert store.meta == meta_before
    assert live_digest(store) == before
    with store.state_view() as state:
        assert state.meta.position == 1
        assert state.message(mid("k0").encode()) is None
        assert state.payload(OTHER_DIGEST.encode()) is None
    # Entries that were not in the local log yet are not written to it either.
    extra = k.LogEntry(7, T0_MS, schedule("late"))
    with corrupt_message_row(store, "k2"), pytest.raises(CorruptRecord):
        store.apply([*store.iter_log(2), extra])
    assert store.log_last_position == 6
    assert [e.position for e in store.iter_log()] == [1, 2, 3, 4, 5, 6]
    assert codes(store.apply_pending()) == [k.Code.SCHEDULED] * 5
    assert live_digest(store) == replay_digest(store)


def test_commit_appends_and_folds_everything_pending_in_one_transaction(
    store: ShardStore,
) -> None:
    store.append([(schedule("a"), PAYLOAD), (schedule("b"), PAYLOAD)], T0_MS)

    def claim(rows: ClaimRows) -> None:
        rows.write({7: LogInfo()}, (), 7)  # any row: the claims port stores what it is given

    entries, results = store.commit([(k.Cancel("acme", "reminders", "a"), None)], T0_MS + 5, claim)
    assert [e.position for e in entries] == [3]
    assert codes(results) == [k.Code.SCHEDULED, k.Code.SCHEDULED, k.Code.CANCELED]
    assert (store.meta.position, store.log_last_position) == (3, 3)
    assert store.read_claims() == (7, 1)  # the claim sequence, and one claim row
    assert live_digest(store) == replay_digest(store)
    assert store_problems(store) == []


def test_the_claims_port_writes_in_the_commit_and_reads_back_rows_and_sequence(
    store: ShardStore,
) -> None:
    assert store.read_claims() == (0, 0)
    store.commit([], T0_MS, lambda rows: rows.write({1: LogInfo(), 2: LogInfo()}, (), 2))
    assert store.read_claims() == (2, 2)
    store.commit([], T0_MS, lambda rows: rows.write({3: LogInfo()}, (1,), 3))
    assert store.read_claims() == (3, 2)  # claim 1 deleted, claim 3 added
    store.commit([], T0_MS, lambda rows: rows.write({}, (), 5, wipe=True))
    assert store.read_claims() == (5, 0)  # every claim row gone, the sequence kept


def test_a_failed_commit_writes_nothing_at_all(store: ShardStore) -> None:
    store.append([(schedule("a"), PAYLOAD)], T0_MS)
    store.apply_pending()
    digest = live_digest(store)

    def claim(rows: ClaimRows) -> None:
        rows.write({7: LogInfo()}, (), 7)

    with corrupt_message_row(store, "b"), pytest.raises(CorruptRecord):
        store.commit([(schedule("b", digest=OTHER_DIGEST, size=13), OTHER_PAYLOAD)], T0_MS, claim)
    assert (store.meta.position, store.log_last_position) == (1, 1)
    assert [e.position for e in store.iter_log()] == [1]
    assert store.payload(OTHER_DIGEST) is None
    assert store.read_claims() == (0, 0)  # no claim sequence, no claim row
    assert live_digest(store) == digest
    entries, results = store.commit([(schedule("b"), PAYLOAD)], T0_MS)
    assert [e.position for e in entries] == [2]
    assert codes(results) == [k.Code.SCHEDULED]


def test_apply_of_a_misplaced_entry_leaves_the_log_dense(store: ShardStore) -> None:
    e1 = k.LogEntry(1, T0_MS, schedule("a"))
    e2 = k.LogEntry(2, T0_MS, schedule("b"))
    gap = k.LogEntry(3, T0_MS, k.ShardState("FROZEN"))
    assert codes(store.apply([e1])) == [k.Code.SCHEDULED]
    assert codes(store.apply([gap])) == [k.Code.POSITION_GAP]
    assert codes(store.apply([e2])) == [k.Code.SCHEDULED]
    assert list(store.iter_log()) == [e1, e2]
    assert live_digest(store) == replay_digest(store)


LONGEST = k.KernelConfig().max_identity_bytes


@pytest.mark.parametrize(
    ("record", "code"),
    [
        (k.LaneGate("t" * LONGEST, "q" * LONGEST, "CLOSED"), k.Code.GATE_CHANGED),
        (schedule("k" * LONGEST, tenant="t" * LONGEST, queue="q" * LONGEST), k.Code.SCHEDULED),
        (k.LaneGate("t" * (LONGEST + 1), "q", "CLOSED"), k.Code.INVALID_IDENTITY),
        (schedule("a", tenant="t" * 600), k.Code.INVALID_IDENTITY),
    ],
    ids=["longest_lane_gate", "longest_schedule", "lane_gate_too_long", "tenant_too_long"],
)
def test_every_kernel_valid_identity_fits_the_storage_keys(
    store: ShardStore, record: k.Record, code: k.Code
) -> None:
    """The kernel's identity limit keeps every LMDB key within 511 bytes, so a valid log entry
    can never wedge the shard; a too-long identity is a rejected entry, not an exception."""
    store.append([(record, _payload_for(record))], T0_MS)
    assert codes(store.apply_pending()) == [code]


def test_a_config_whose_identities_cannot_fit_is_refused(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="511-byte"):
        ShardStore.open(str(tmp_path / "s"), config=k.KernelConfig(max_identity_bytes=200))


def test_a_schedule_far_in_the_past_gets_an_outcome(store: ShardStore) -> None:
    store.append([(schedule("a", deliver_at_ms=-(2**63)), PAYLOAD)], T0_MS)
    # Whatever the verdict, it must be an outcome: an exception would wedge the shard.
    [result] = store.apply_pending()
    assert outcome_of(result).position == 1
    assert store.meta.position == 1


def test_the_timeline_range_scan_yields_due_work_in_order(store: ShardStore) -> None:
    delays = [5_000, 0, 2_000, 1_000, 3_000]
    store.append([(schedule(f"k{i}", delay_ms=d), PAYLOAD) for i, d in enumerate(delays)], T0_MS)
    store.apply_pending()
    start = timeline_key(k.UNBOUNDED.earliest_ms, "00" * 16, 0)
    with store.read() as base:
        everything = list(base.range(Table.TIMELINE, start))
        due = list(base.range(Table.TIMELINE, start, timeline_key(T0_MS + 2_001, "00" * 16, 0)))
    assert [w.deliver_at_ms - T0_MS for _, w in everything if isinstance(w, TimelineWork)] == [
        0,
        1_000,
        2_000,
        3_000,
        5_000,
    ]
    assert [w.deliver_at_ms - T0_MS for _, w in due if isinstance(w, TimelineWork)] == [
        0,
        1_000,
        2_000,
    ]


# Payload bytes -----------------------------------------------------------------------------


def test_payload_bytes_are_stored_by_digest(store: ShardStore) -> None:
    store.append([(schedule("a"), PAYLOAD)], T0_MS)
    assert store.payload(DIGEST) == PAYLOAD
    assert store.payload(OTHER_DIGEST) is None


@pytest.mark.parametrize(
    ("item", "problem"),
    [
        ((schedule("a"), b"not the payload"), "digest"),
        ((schedule("a", size=8), PAYLOAD), "size"),
        ((k.Cancel("acme", "reminders", "a"), PAYLOAD), "no payload"),
    ],
    ids=["digest_mismatch", "size_mismatch", "bytes_on_a_cancel"],
)
def test_bad_payload_bytes_refuse_the_whole_append(
    store: ShardStore, item: Appendable, problem: str
) -> None:
    with pytest.raises(ValueError, match=problem):
        store.append([(schedule("ok", digest=OTHER_DIGEST, size=13), OTHER_PAYLOAD), item], T0_MS)
    assert store.log_last_position == 0
    assert list(store.iter_log()) == []
    assert store.payload(OTHER_DIGEST) is None, "the good record of the batch is not kept"
    assert store.payload(DIGEST) is None


def test_schedule_then_cancel_drops_the_bytes(store: ShardStore) -> None:
    store.append([(schedule("a"), PAYLOAD)], T0_MS)
    store.apply_pending()
    assert store.payload(DIGEST) == PAYLOAD
    store.append([(k.Cancel("acme", "reminders", "a"), None)], T0_MS)
    assert codes(store.apply_pending()) == [k.Code.CANCELED]
    assert store.payload(DIGEST) is None
    assert store_problems(store) == []


def test_shared_bytes_are_kept_until_both_holders_finish(store: ShardStore) -> None:
    store.append([(schedule("a", delay_ms=0), PAYLOAD), (schedule("b"), PAYLOAD)], T0_MS)
    store.apply_pending()
    store.append([(k.Cancel("acme", "reminders", "b"), None)], T0_MS)
    store.apply_pending()
    assert store.payload(DIGEST) == PAYLOAD, "a still holds it"
    admission = admission_for(store, "a", T0_MS + 10)
    store.append([(admission, None)], T0_MS + 10)
    store.apply_pending()
    assert store.payload(DIGEST) == PAYLOAD, "a publishing message still needs its bytes"
    outcome = k.PublishOutcome(admission.attempt_id, mid("a"), 1, published())
    store.append([(outcome, None)], T0_MS + 20)
    assert codes(store.apply_pending()) == [k.Code.OUTCOME_RECORDED]
    assert store.payload(DIGEST) is None
    assert store_problems(store) == []


def test_bytes_named_by_an_unfolded_schedule_survive_their_last_release(
    store: ShardStore,
) -> None:
    store.append([(schedule("a"), PAYLOAD)], T0_MS)
    store.apply_pending()
    # b shares a's payload and does not resend bytes the store already holds.
    store.append([(k.Cancel("acme", "reminders", "a"), None), (schedule("b"), None)], T0_MS)
    assert codes(store.apply_pending(1)) == [k.Code.CANCELED]
    assert store.payload(DIGEST) == PAYLOAD, "position 3 still names these bytes"
    assert codes(store.apply_pending()) == [k.Code.SCHEDULED]
    assert store.payload(DIGEST) == PAYLOAD
    assert store_problems(store) == []


def test_bytes_of_a_rejected_or_superseded_schedule_are_dropped(store: ShardStore) -> None:
    store.append([(schedule("a", delay_ms=-1), PAYLOAD)], T0_MS)
    assert codes(store.apply_pending()) == [k.Code.INVALID_TIMING]
    assert store.payload(DIGEST) is None
    store.append([(schedule("b"), PAYLOAD)], T0_MS)
    store.append([(schedule("b", txn="t2", digest=OTHER_DIGEST, size=13), OTHER_PAYLOAD)], T0_MS)
    assert codes(store.apply_pending()) == [k.Code.SCHEDULED, k.Code.RESCHEDULED]
    assert store.payload(DIGEST) is None, "the superseded generation released it"
    assert store.payload(OTHER_DIGEST) == OTHER_PAYLOAD
    assert store_problems(store) == []


# Live state equals replay ------------------------------------------------------------------


def _payload_for(record: k.Record) -> bytes | None:
    if not isinstance(record, k.Schedule):
        return None
    data = BYTES_BY_DIGEST.get(record.payload_digest)
    return data if data is not None and len(data) == record.payload_size else None


@given(
    actions=strategies.action_lists(),
    apply_every=st.lists(st.integers(1, 6), min_size=1, max_size=5),
    bound=st.sampled_from((1, 2, 5, 1_000)),
)
@settings(
    max_examples=strategies.max_examples(25),
    deadline=None,
    suppress_health_check=(HealthCheck.too_slow, HealthCheck.data_too_large),
)
def test_live_digest_equals_replay_at_every_checkpoint_of_a_generated_workload(
    tmp_path_factory: pytest.TempPathFactory,
    actions: list[strategies.Action],
    apply_every: list[int],
    bound: int,
) -> None:
    driver = strategies.drive(actions, check_invariants=False)
    steps = [s for s in driver.steps if s.outcome.code not in POSITION_CODES]
    path = str(tmp_path_factory.mktemp("live") / "shard")
    options = StoreOptions(max_batch_entries=bound)
    with ShardStore.open(path, config=strategies.CONFIG, options=options) as store:
        pending_checks = 0
        cadence = iter(apply_every * (len(steps) + 1))
        due = next(cadence)
        for step in steps:
            record = step.entry.record
            store.append([(record, _payload_for(record))], step.entry.persisted_at_ms)
            pending_checks += 1
            if pending_checks >= due:
                store.apply_pending()
                assert live_digest(store) == replay_digest(store)
                pending_checks, due = 0, next(cadence)
        while store.apply_pending():
            assert live_digest(store) == replay_digest(store)
        assert store.meta.position == len(steps)
        with store.state_view() as state:
            k.assert_invariants(state)
        assert store_problems(store) == []


def test_live_digest_equals_replay_through_a_seeded_random_workload(tmp_path: Path) -> None:
    seed = 20_240_601
    with ShardStore.open(str(tmp_path / "shard"), config=CONFIG) as store:
        workload = Workload(random.Random(seed))
        for step in range(120):
            workload.step(store)
            where = f"seed {seed}, step {step}, position {store.meta.position}"
            assert live_digest(store) == replay_digest(store), where
        while store.apply_pending():
            pass
        assert live_digest(store) == replay_digest(store)
        with store.state_view() as state:
            counters = state.meta.counters
        # The workload must reach the interesting states, or the check proves little.
        assert counters.attempts_published > 0
        assert counters.attempts_not_published > 0
        assert counters.expired + counters.canceled > 0
        assert store_problems(store) == []


# Schema versions ----------------------------------------------------------------------------


def test_a_version_3_store_is_migrated_in_place_and_its_rows_still_read(tmp_path: Path) -> None:
    """A store written before attempts carried their fence id: its header says version 3 and
    its attempt rows have no `fence_id` key. Opening it rewrites the header to the current
    version in the same transaction as the check, and every row reads as before (an attempt
    of a version-3 store was admitted unfenced)."""
    path = str(tmp_path / "shard")
    with ShardStore.open(path) as store:
        store.commit([(schedule("a", delay_ms=0), PAYLOAD)], T0_MS)
        store.commit([(admission_for(store, "a", T0_MS + 10), None)], T0_MS + 10)
        digest = replay_digest(store)
        env = store.env
        header = msgspec.structs.replace(store.header, schema_version=3)
        with env.env.begin(write=True) as txn:
            txn.put(HEADER_KEY, encode_value(header), db=env.meta)
            rows_as_maps(txn, env)
            db = env.tables[Table.ATTEMPTS]
            for key, raw in list(txn.cursor(db=db)):
                row = msgspec.msgpack.decode(raw[4:])
                del row["fence_id"]
                txn.put(key, frame(msgspec.msgpack.encode(row)), db=db)
    with ShardStore.open(path) as store:
        assert store.header.schema_version == SCHEMA_VERSION == 7
        with store.read() as view:
            (attempt,) = [a for _, a in view.items(Table.ATTEMPTS)]
        assert isinstance(attempt, k.Attempt) and attempt.fence_id is None
        assert attempt.status is AttemptStatus.PUBLISHING
        assert replay_digest(store) == digest
    with ShardStore.open(path) as store:  # the header was rewritten durably
        assert store.header.schema_version == SCHEMA_VERSION


def test_a_version_5_store_gets_positional_rows_and_reads_as_before(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Schema 6 stores each table row as an array of its fields. Opening a version-5 store
    (rows as maps of field names) rewrites every row in place, in the open's one write
    transaction: the rows read back equal, the state digest is unchanged, the message rows
    shrink, and the rewrite says how many rows it did."""
    path = str(tmp_path / "shard")
    with ShardStore.open(path) as store:
        for key in ("a", "b", "c"):
            store.commit([(schedule(key, delay_ms=0), PAYLOAD)], T0_MS)
        store.commit([(admission_for(store, "a", T0_MS + 10), None)], T0_MS + 10)
        digest = replay_digest(store)
        with store.read() as view:
            before = {t: list(view.items(t)) for t in Table}
        env = store.env
        with env.env.begin(write=True) as txn:
            positional = txn.get(mid("a").encode(), db=env.tables[Table.MESSAGES])
            header = msgspec.structs.replace(store.header, schema_version=5)
            txn.put(HEADER_KEY, encode_value(header), db=env.meta)
            rows_as_maps(txn, env)
            as_map = txn.get(mid("a").encode(), db=env.tables[Table.MESSAGES])
    assert len(positional) * 2 < len(as_map)
    with caplog.at_level("INFO", logger="nereus.storage"), ShardStore.open(path) as store:
        assert store.header.schema_version == SCHEMA_VERSION == 7
        with store.read() as view:
            assert {t: list(view.items(t)) for t in Table} == before
        assert replay_digest(store) == digest
        env = store.env
        with env.env.begin() as txn:
            assert txn.get(mid("a").encode(), db=env.tables[Table.MESSAGES]) == positional
    (done,) = [r for r in caplog.records if r.getMessage() == "store_migration_rows_done"]
    rows = sum(len(v) for v in before.values())
    assert done.__dict__["fields"] == {"store": env.data_file, "to_version": 6, "rows": rows}


def test_a_version_5_row_that_does_not_decode_refuses_the_migration(tmp_path: Path) -> None:
    """The migration reads every row: a damaged one refuses the open, naming the table and
    key, and leaves the version-5 store as it was."""
    path = str(tmp_path / "shard")
    with ShardStore.open(path) as store:
        store.commit([(schedule("a", delay_ms=0), PAYLOAD)], T0_MS)
        env = store.env
        with env.env.begin(write=True) as txn:
            header = msgspec.structs.replace(store.header, schema_version=5)
            txn.put(HEADER_KEY, encode_value(header), db=env.meta)
            rows_as_maps(txn, env)
            txn.put(mid("a").encode(), frame(b"\x93\x01\x02\x03"), db=env.tables[Table.MESSAGES])
    with pytest.raises(CorruptRecord, match=rf"table messages, key {mid('a').encode().hex()}"):
        ShardStore.open(path)
    lmdb_env = lmdb.open(path, readonly=True, lock=False, max_dbs=32)
    try:
        with lmdb_env.begin() as txn:
            raw = txn.get(HEADER_KEY, db=lmdb_env.open_db(b"meta", txn=txn, create=False))
    finally:
        lmdb_env.close()
    assert raw is not None
    assert decode_struct(StoreHeader, raw, path, "header").schema_version == 5
