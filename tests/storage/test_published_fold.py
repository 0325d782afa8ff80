"""The compiled folds of Admissions and PUBLISHED outcomes against the Python kernel.

The rule (specs/compiled.md): a record the compiled fold takes must leave every row, every
byte of the store and every effect exactly as the kernel's reducer leaves them, and a record
it cannot take whole must be left to the reducer untouched. Three checks:

* generated rows (every size of string and integer msgspec has a form for, old rows without
  their later fields, neighbouring states that are not the common case) folded by the
  reducer over a mapping and by `kernel.native.fold_published` over their stored bytes;
* generated histories folded into two LMDB stores, one with the compiled fold and one
  without, compared table by table, byte by byte, effect by effect;
* the fire's own shape (a batch of PUBLISHED outcomes) takes the compiled path.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nereus import kernel as k
from nereus.kernel import native
from nereus.kernel.model import Attempt, Message, PayloadRef, Table, TenantUsage, Value
from nereus.kernel.records import PublishResult
from nereus.kernel.state import MappingBase
from nereus.storage import published
from nereus.storage.codec import encode_row
from tests.support import strategies
from tests.support.builders import Shard, schedule
from tests.support.builders import published as published_result
from tests.support.two_stores import SETTINGS, Calls, assert_same_stores, fold_into

pytestmark = pytest.mark.skipif(
    native.fold_published is None, reason="the source build has no compiled fold to compare"
)


# Strings and integers across msgspec's forms: fixstr / str8 / str16, and every integer width.
texts = st.text(min_size=1, max_size=40) | st.text(min_size=200, max_size=300)
ints = st.sampled_from([0, 1, 127, 128, 255, 256, 65_535, 65_536, 2**32 - 1, 2**32, 2**53 - 1])
small = st.integers(0, 5)
evidences = st.builds(
    k.Evidence,
    destination=texts,
    partition=st.integers(-1, 2**31 - 1),
    offset=st.integers(-1, 2**53),
    timestamp_ms=ints,
    broker_message_id=st.none() | texts,
)


@st.composite
def cases(draw: st.DrawFn) -> tuple[k.State, k.LogEntry]:
    """A state holding one attempt and its message (most often in the common case, else
    one field away from it), and an entry with a PUBLISHED outcome for the attempt."""
    near = draw(st.sampled_from(["common"] * 6 + ["status", "work", "generation", "open", "gone"]))
    generation = draw(st.integers(1, 3))
    message_id = k.message_id("acme", "q", draw(texts))
    attempt_id = f"{k.attempt_prefix(message_id, generation)}{draw(ints)}"
    size = draw(ints)
    tenant = draw(texts)
    digest = "a" * 64
    message = Message(
        message_id=message_id,
        tenant=tenant,
        queue=draw(texts),
        timer_key=draw(texts),
        generation=generation + (1 if near == "generation" else 0),
        version=draw(ints),
        status=k.Status.UNCERTAIN if near == "status" else k.Status.PUBLISHING,
        txn=draw(texts),
        payload_digest=digest,
        payload_size=size,
        partition_key=draw(st.none() | texts),
        headers=tuple(draw(st.lists(st.tuples(texts, texts), max_size=3))),
        destination=draw(texts),
        capability=draw(st.sampled_from([k.Capability(), strategies.HANDOFF])),
        producer_sub=draw(st.none() | texts),
        encrypted=draw(st.booleans()),
        deliver_at_ms=draw(ints),
        expire_at_ms=draw(ints),
        action_at_ms=draw(ints),
        has_work=near == "work",
        request_digest=draw(texts),
        attempts_admitted=draw(small),
        attempts_spent=draw(small),
        failures=draw(small),
        open_attempts=0 if near == "open" else draw(st.integers(1, 3)),
        uncertain_retries=draw(small),
        last_error=draw(st.none() | texts),
        last_attempt_id=attempt_id,
        delivered_attempt_id=None,
        evidence=None,
        created_at_ms=draw(ints),
        updated_at_ms=draw(ints),
        created_position=draw(ints),
        updated_position=draw(ints),
    )
    attempt = Attempt(
        attempt_id=attempt_id,
        message_id=message_id,
        generation=generation,
        status=k.AttemptStatus.PUBLISHING,
        destination=message.destination,
        descriptor_hash="b" * 64,
        claim_id=draw(texts),
        owner=draw(texts),
        admitted_position=draw(ints),
        admitted_at_ms=draw(ints),
        fence_id=draw(st.none() | texts),
    )
    rows: dict[Table, dict[bytes, Value]] = {
        Table.ATTEMPTS: {attempt_id.encode(): attempt},
        Table.MESSAGES: {} if near == "gone" else {message_id.encode(): message},
        Table.PAYLOADS: {digest.encode(): PayloadRef(draw(st.integers(1, 3)), size)},
        Table.USAGE: {tenant.encode(): TenantUsage(draw(st.integers(1, 3)), size + draw(ints))},
    }
    position = draw(ints) + 1
    # Persistence times the reducer accepts (below 2**53, never going back): the entry is
    # one `storage.published.candidate` lets through, so only the rows decide.
    last_ms = draw(ints) // 2
    meta = k.ShardMeta(position - 1, last_ms, counters=k.Counters(publishing=9, delivered=9))
    state = k.State(strategies.CONFIG, meta, MappingBase(rows))
    result = k.Published(draw(evidences))
    entry = k.LogEntry(
        position,
        last_ms + draw(ints) // 2,
        k.PublishOutcome(attempt_id, message_id, generation, result),
    )
    return state, entry


def _stored(state: k.State) -> Callable[[str, bytes], bytes | None]:
    """The rows of `state` as the store keeps them, by table name and key."""

    def get(table: str, key: bytes) -> bytes | None:
        value = state.get(Table(table), key)
        return None if value is None else encode_row(Table(table), value)

    return get


@given(case=cases())
@SETTINGS
def test_generated_rows_fold_to_the_reducers_bytes_or_are_left_to_it(
    case: tuple[k.State, k.LogEntry],
) -> None:
    state, entry = case
    record = entry.record
    assert isinstance(record, k.PublishOutcome) and isinstance(record.result, k.Published)
    assert published.candidate(state.meta, entry) == [record]
    fold_published = native.fold_published
    assert fold_published is not None
    answer = fold_published(
        _stored(state),
        [
            (
                record.attempt_id,
                record.message_id,
                record.generation,
                msgspec.msgpack.encode(record.result.evidence),
            )
        ],
        entry.position,
        entry.persisted_at_ms,
    )
    message = state.message(record.message_id.encode())
    common = (
        message is not None
        and message.status is k.Status.PUBLISHING
        and not message.has_work
        and message.generation == record.generation
        and message.open_attempts >= 1
    )
    if not common:
        assert answer is None
        return
    assert answer is not None, "the common case must take the compiled path"
    after, effects = k.reduce(state, entry)
    writes, folded = answer
    expected = {
        (table.value, key): None if value is None else encode_row(table, value)
        for table, key, value in after.changes()
    }
    assert {(table, key): value for table, key, value in writes} == expected
    assert len(writes) == len(expected)
    outcome = effects[0]
    assert isinstance(outcome, k.EntryOutcome) and outcome.code is k.Code.OUTCOME_RECORDED
    assert message is not None
    claim_id, version, txn, deliver_at_ms, tenant, queue, timer_key = folded[0]
    assert (version, txn, deliver_at_ms) == (outcome.version, outcome.txn, outcome.deliver_at_ms)
    assert (tenant, queue, timer_key) == (message.tenant, message.queue, message.timer_key)
    attempt = state.attempt(record.attempt_id.encode())
    assert attempt is not None and claim_id == attempt.claim_id


@given(case=cases())
@settings(SETTINGS, max_examples=strategies.max_examples(20))
def test_a_row_with_a_bad_checksum_is_left_to_the_reducer(
    case: tuple[k.State, k.LogEntry],
) -> None:
    """The reference refuses a damaged row by name (CorruptRecord); the compiled fold must
    not read past it."""
    state, entry = case
    record = entry.record
    assert isinstance(record, k.PublishOutcome) and isinstance(record.result, k.Published)
    intact = _stored(state)

    def damaged(table: str, key: bytes) -> bytes | None:
        raw = intact(table, key)
        if raw is None or table != "messages":
            return raw
        return raw[:4] + bytes([raw[4] ^ 1]) + raw[5:]

    fold_published = native.fold_published
    assert fold_published is not None
    evidence = msgspec.msgpack.encode(record.result.evidence)
    item = (record.attempt_id, record.message_id, record.generation, evidence)
    assert fold_published(damaged, [item], entry.position, entry.persisted_at_ms) is None


# Whole histories, two stores ------------------------------------------------------------


def _batched_outcomes(entries: list[k.LogEntry]) -> list[k.LogEntry]:
    """The same history with each run of consecutive outcome records made one
    PUBLISH_OUTCOMES_V1 batch (the fire's shape), positions renumbered."""
    records: list[k.Record] = []
    for is_outcome, run in itertools.groupby(
        (e.record for e in entries), key=lambda r: isinstance(r, k.PublishOutcome)
    ):
        group = list(run)
        if is_outcome and len(group) > 1:
            records.append(
                k.PublishOutcomes(
                    tuple(
                        k.OutcomeItem(r.attempt_id, r.message_id, r.generation, r.result)
                        for r in group
                        if isinstance(r, k.PublishOutcome)
                    )
                )
            )
        else:
            records.extend(group)
    times = [e.persisted_at_ms for e in entries]
    return [k.LogEntry(i + 1, times[i], r) for i, r in enumerate(records)]


@given(
    actions=strategies.action_lists(),
    batch=st.sampled_from([1, 3, 1_000]),
    merge=st.booleans(),
)
@SETTINGS
def test_histories_fold_to_the_same_store_with_and_without_the_compiled_fold(
    tmp_path_factory: pytest.TempPathFactory,
    actions: list[strategies.Action],
    batch: int,
    merge: bool,
) -> None:
    entries = strategies.drive(actions, check_invariants=False).entries
    if merge:
        entries = _batched_outcomes(entries)
    root = tmp_path_factory.mktemp("published")
    reference = fold_into(root / "reference", entries, batch, on=False, config=strategies.CONFIG)
    compiled = fold_into(root / "compiled", entries, batch, on=True, config=strategies.CONFIG)
    assert_same_stores(reference, compiled)
    _, expected_effects = k.fold(k.State.initial(strategies.CONFIG), entries)
    assert [effects for _, effects in compiled[0]] == expected_effects


@st.composite
def fire_histories(draw: st.DrawFn) -> list[k.LogEntry]:
    """Rounds of the fire's shape over a few timers of two tenants sharing two payloads:
    schedules (new generations of timers in flight too), Admissions, sometimes a cancel,
    then one batch of outcomes, mostly PUBLISHED, sometimes another result or an attempt
    named twice. Most batches are the compiled fold's common case; the others must fall
    back whole."""
    shard = Shard(config=strategies.CONFIG, check_invariants=False)
    keys = [f"k{i}" for i in range(draw(st.integers(1, 6)))]
    # The worker's names in every string form msgspec has (the attempt rows Rust writes).
    owner = draw(texts.filter(lambda t: "\x00" not in t))
    fence_id = draw(st.none() | texts)
    for _ in range(draw(st.integers(1, 6))):
        for key in draw(st.lists(st.sampled_from(keys), max_size=4)):
            tenant = "acme" if key < "k3" else "globex"
            shard.apply(
                schedule(
                    key,
                    tenant=tenant,
                    txn=f"txn-{draw(st.integers(0, 3))}",
                    delay_ms=0,
                    digest=draw(st.sampled_from(["a" * 64, "b" * 64])),
                    size=draw(st.sampled_from([0, 7, 300, 70_000])),
                )
            )
        attempts: list[str] = []
        for key in draw(st.lists(st.sampled_from(keys), max_size=4, unique=True)):
            tenant = "acme" if key < "k3" else "globex"
            message = shard.state.message(k.message_id(tenant, "reminders", key).encode())
            if message is None or message.status is not k.Status.SCHEDULED:
                continue
            shard.now_ms = max(shard.now_ms, message.action_at_ms + 10)
            sequence = len(shard.history)
            admission = k.PublishAdmission(
                message_id=message.message_id,
                generation=message.generation,
                version=message.version,
                attempt_id=f"{k.attempt_prefix(message.message_id, message.generation)}{sequence}",
                claim_id=f"{draw(texts)}:{sequence}",
                owner=owner,
                descriptor_hash=draw(st.sampled_from(["d" * 16, "e" * 64])),
                capability=message.capability,
                interval=k.TrustedInterval(shard.now_ms - 5, shard.now_ms + 5),
                capacity=k.Capacity(True),
                fence_id=fence_id,
            )
            if shard.apply(admission).code is k.Code.ADMITTED:
                attempts.append(admission.attempt_id)
        if attempts and draw(st.integers(0, 3)) == 0:
            shard.apply(k.Cancel("acme", "reminders", draw(st.sampled_from(keys))))
        if not attempts:
            continue
        if draw(st.integers(0, 4)) == 0:
            attempts.append(draw(st.sampled_from(attempts)))
        results = st.sampled_from(["published"] * 8 + ["not_published", "unknown"])
        items = []
        for attempt_id in attempts:
            attempt = shard.state.attempt(attempt_id.encode())
            assert attempt is not None
            kind = draw(results)
            result: PublishResult = (
                published_result(draw(st.integers(0, 2**40)))
                if kind == "published"
                else k.NotPublished("retriable", "broker_down")
                if kind == "not_published"
                else k.Unknown("timeout")
            )
            items.append(k.OutcomeItem(attempt_id, attempt.message_id, attempt.generation, result))
        shard.now_ms += draw(st.integers(0, 5))
        shard.apply(k.PublishOutcomes(tuple(items)))
    return [entry for entry, _ in shard.history]


@given(entries=fire_histories(), batch=st.sampled_from([1, 2, 1_000]))
@SETTINGS
def test_fire_histories_fold_to_the_same_store_with_and_without_the_compiled_fold(
    tmp_path_factory: pytest.TempPathFactory, entries: list[k.LogEntry], batch: int
) -> None:
    root = tmp_path_factory.mktemp("fires")
    reference = fold_into(root / "reference", entries, batch, on=False, config=strategies.CONFIG)
    compiled = fold_into(root / "compiled", entries, batch, on=True, config=strategies.CONFIG)
    assert_same_stores(reference, compiled)


def test_the_fires_outcome_batch_takes_the_compiled_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The shapes a fire is made of are the ones the compiled folds are for: if they fell
    back to the reducer, the paths would be dead code that the comparisons above pass
    trivially."""
    entries = _fire_history()
    outcomes = Calls(native.fold_published)
    admissions = Calls(native.fold_admitted)
    monkeypatch.setattr(native, "fold_published", outcomes)
    monkeypatch.setattr(native, "fold_admitted", admissions)
    reference = fold_into(
        tmp_path / "reference", entries, 1_000, on=False, config=strategies.CONFIG
    )
    assert (admissions.taken, outcomes.taken) == (0, 0)
    compiled = fold_into(tmp_path / "compiled", entries, 1_000, on=True, config=strategies.CONFIG)
    assert (admissions.taken, outcomes.taken) == (3, 1)
    assert compiled == reference


def _fire_history() -> list[k.LogEntry]:
    """Three timers scheduled, admitted in one batch and published in one batch."""
    shard = Shard(config=strategies.CONFIG)
    attempts = []
    for key in ("a", "b", "c"):
        shard.apply(schedule(key, delay_ms=0))
    for key in ("a", "b", "c"):
        attempts.append(shard.admit(key))
    outcomes = [shard.outcome(a, published_result()) for a in attempts]
    items = tuple(
        k.OutcomeItem(o.attempt_id, o.message_id, o.generation, o.result) for o in outcomes
    )
    shard.apply(k.PublishOutcomes(items))
    return [entry for entry, _ in shard.history]
