"""The `ShardLog` contract: what every shard log promises the runtime, run against each of
them (the embedded log in LMDB, and the Kafka log on the real broker at
NEREUS_KAFKA_BOOTSTRAP, every test on topics of its own).

Theory of operation: `runtime.shardlog.ShardLog` is the port between the runtime and a
shard's log. Each test states one promise of the port's docstrings and runs, unchanged, over
each log through a kit (`tests/support/shardlogs.py`) that only makes, feeds and reopens
it; everything else goes through the port's methods, and the folded result is read from the
store (`state_view`, `payload`). The two logs differ in when they fold (the embedded log in
the call that wrote the records, the Kafka log in a later call, once the records come back
from the broker), so the tests drive a log as the runtime's tick does: commit, and while it is
not settled, wait and commit again. The promises:

* records are folded in the order they were committed, each once, at consecutive positions
  from 1, with persistence times that never go back; a call's entries are among its folds;
* `settled()` holds only when every record this owner wrote has been folded (a record not
  folded in the call that wrote it leaves the log unsettled), and implies `caught_up()`;
* the folded state, and every effect returned, is the kernel's fold of the folded entries;
* what was folded is durable: the log read alone holds exactly those entries, and the owner
  that takes over after a crash folds to the same state and goes on at the next position;
* a client command's payload bytes are stored with its fold (a batch's item by item) and
  survive the takeover; bytes that do not belong to the schedules one for one are never
  stored (refused at commit, or folded without them);
* one writer per shard: a second owner is refused (the embedded log: its directory's lock)
  or fences the first, whose next commit raises `ShardLost` and lands nothing;
* `open()` is idempotent, `wait()` returns at once when woken, and a live owner may send.
"""

from __future__ import annotations

import hashlib
import itertools
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nereus.kernel.digest import state_digest
from nereus.kernel.records import Cancel, CommandBatch, LogEntry, Record, ShardState, ShardStatus
from nereus.runtime.batching import command_record
from nereus.runtime.shardlog import ShardLost
from nereus.service.arguments import schedule_record
from nereus.storage.lock import StoreLocked
from nereus.storage.memory import MemoryStore
from nereus.storage.store import ShardStore
from tests.support import kafka_env, strategies
from tests.support.shardlogs import EmbeddedKit, KafkaKit, Kit, Owner, records_of

kafka_bootstrap = kafka_env.kafka_bootstrap
KITS = ("embedded", "kafka")
FAR_MS = 600_000  # a delay no test waits for: the schedules stay live


@pytest.fixture(params=KITS)
def make_kit(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], Kit]]:
    """Makes kits of one implementation, each on a shard (and, for Kafka, topics) of its own;
    every one is closed when the test ends."""
    made: list[Kit] = []
    numbers = itertools.count()

    def make() -> Kit:
        where = tmp_path / f"kit{next(numbers)}"
        where.mkdir()
        if request.param == "embedded":
            kit: Kit = EmbeddedKit(where)
        else:
            kit = KafkaKit(where, request.getfixturevalue("kafka_bootstrap"))
        made.append(kit)
        return kit

    yield make
    for kit in made:
        kit.close()


@pytest.fixture
def kit(make_kit: Callable[[], Kit]) -> Kit:
    return make_kit()


def state(reason: str, status: ShardStatus = "PAUSED") -> tuple[Record, None]:
    return ShardState(status, reason), None


def reasons(entries: list[LogEntry]) -> list[str]:
    return [e.record.reason for e in entries if isinstance(e.record, ShardState)]


def digest_of(store: ShardStore | MemoryStore) -> str:
    if isinstance(store, MemoryStore):
        return state_digest(store.state)
    with store.state_view() as view:
        return state_digest(view)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


SYSTEM_RECORDS = st.one_of(
    st.builds(
        ShardState,
        st.sampled_from(["ACTIVE_FOR_COMMANDS", "PAUSED", "FROZEN"]),
        st.text("abcxyz", max_size=4),
    ),
    st.builds(Cancel, st.just("default"), st.just("q"), st.sampled_from(["a", "b", "c"])),
)


@settings(
    strategies.props(8),
    suppress_health_check=(HealthCheck.function_scoped_fixture, HealthCheck.too_slow),
    deadline=None,
)
@given(calls=st.lists(st.lists(SYSTEM_RECORDS, max_size=4), min_size=1, max_size=4))
def test_records_fold_in_commit_order_each_once_at_consecutive_positions(
    make_kit: Callable[[], Kit], calls: list[list[Record]]
) -> None:
    owner = make_kit().owner()
    for records in calls:
        call = owner.commit(*[(record, None) for record in records])
        assert set(call.entries) <= {entry for entry, _effects in call.folded}
    owner.drive()
    entries = [entry for entry, _effects in owner.folded]
    assert [e.record for e in entries] == [record for records in calls for record in records]
    assert [e.position for e in entries] == list(range(1, len(entries) + 1))
    times = [e.persisted_at_ms for e in entries]
    assert times == sorted(times)


def test_settled_only_once_every_record_written_is_folded(kit: Kit) -> None:
    owner = kit.owner()
    owner.drive()
    assert owner.log.caught_up()
    for items in ([state("one")], [state("two"), (Cancel("default", "q", "k"), None)], []):
        call = owner.commit(*items)
        if items and not call.entries:
            # Written but not folded in this call (the Kafka log folds them when they come
            # back from the broker): not settled until then.
            assert not owner.log.settled()
        deadline = time.monotonic() + 30
        while not owner.log.settled():
            assert time.monotonic() < deadline, "the log never settled"
            owner.log.wait(0.05, threading.Event())
            owner.commit()
        # Settled: this owner's proposals are all in the store, so it may propose again.
        assert records_of(owner.folded) == owner.written
        assert owner.log.caught_up()


def test_the_folded_state_is_the_kernels_fold_of_the_folded_entries(kit: Kit) -> None:
    owner = kit.owner()
    kit.command(owner, schedule_record("q", "later", b"alpha", delay_ms=FAR_MS, txn="t1"))
    kit.command(owner, schedule_record("q", "now", b"beta", delay_ms=0))
    owner.commit((Cancel("default", "q", "later"), None), state("operator"))
    pair = [schedule_record("q", f"b{n}", f"item {n}".encode(), delay_ms=FAR_MS) for n in (1, 2)]
    kit.command(owner, command_record(pair))
    owner.drive_to(5)
    entries = [entry for entry, _effects in owner.folded]
    kernel = MemoryStore()
    assert owner.folded == kernel.apply(entries)  # the entries and every effect
    assert digest_of(owner.store) == digest_of(kernel)
    assert any(isinstance(e.record, CommandBatch) for e in entries)


def test_what_was_folded_survives_a_crash_and_the_heir_goes_on(kit: Kit) -> None:
    first = kit.owner()
    kit.command(first, schedule_record("q", "kept", b"kept bytes", delay_ms=FAR_MS))
    first.commit(state("before the crash"), (Cancel("default", "q", "gone"), None))
    first.drive_to(3)
    folded = [entry for entry, _effects in first.folded]
    before = digest_of(first.store)
    assert kit.durable_entries(first) == folded  # the log alone holds what was folded
    kit.crash(first)

    heir = kit.heir(first)
    heir.drive()  # caught up on the log the first owner left
    assert digest_of(heir.store) == before
    assert heir.store.payload(sha(b"kept bytes")) == b"kept bytes"
    heir.commit(state("after the crash", "ACTIVE_FOR_COMMANDS"))
    heir.drive(lambda: "after the crash" in reasons([e for e, _ in heir.folded]))
    (entry, _effects) = heir.folded[-1]
    assert entry.position == len(folded) + 1
    assert kit.durable_entries(heir) == [*folded, entry]
    kernel = MemoryStore()
    kernel.apply([*folded, entry])
    assert digest_of(heir.store) == digest_of(kernel)


def test_a_commands_payload_bytes_are_stored_with_its_fold(kit: Kit) -> None:
    owner = kit.owner()
    kit.command(owner, schedule_record("q", "single", b"single bytes", delay_ms=FAR_MS))
    items = [
        schedule_record("q", f"item{n}", data, delay_ms=FAR_MS)
        for n, data in enumerate((b"first item", b"second item"))
    ]
    kit.command(owner, command_record(items))
    owner.drive_to(2)
    for data in (b"single bytes", b"first item", b"second item"):
        assert owner.store.payload(sha(data)) == data


def test_bytes_that_are_not_the_schedules_one_for_one_are_never_stored(kit: Kit) -> None:
    owner = kit.owner()
    owner.commit(state("first"))
    owner.drive_to(1)
    items = [
        schedule_record("q", f"odd{n}", data, delay_ms=FAR_MS)
        for n, data in enumerate((b"odd one", b"odd two"))
    ]
    record, _payloads = command_record(items)
    short = (record, (b"odd one",))  # one payload slot for two schedules
    try:
        kit.command(owner, short)
        refused = False
    except ValueError:
        refused = True  # refused at commit: nothing of it is in the log
    owner.commit(state("last"))
    owner.drive(lambda: "last" in reasons([e for e, _ in owner.folded]))
    entries = [entry for entry, _effects in owner.folded]
    assert [e.position for e in entries] == list(range(1, len(entries) + 1))
    assert (record in [e.record for e in entries]) is not refused
    assert owner.store.payload(sha(b"odd one")) is None
    assert owner.store.payload(sha(b"odd two")) is None


def test_a_shard_has_one_writer(kit: Kit) -> None:
    first = kit.owner()
    first.commit(state("first"))
    first.drive_to(1)
    try:
        second: Owner | None = kit.rival(first)
    except StoreLocked:
        second = None
    if second is None:
        # Refused: the first owner stays the shard's one writer.
        first.commit(state("still first"))
        first.drive_to(2)
        assert reasons(kit.durable_entries(first)) == ["first", "still first"]
        return
    # The second owner fenced the first: its next write is refused and lands nothing.
    with pytest.raises(ShardLost):
        first.commit(state("zombie", "FROZEN"))
    second.commit(state("second", "ACTIVE_FOR_COMMANDS"))
    second.drive(lambda: "second" in reasons([e for e, _ in second.folded]))
    logged = kit.durable_entries(second)
    assert reasons(logged) == ["first", "second"]
    assert [e.position for e in logged] == [1, 2]


def test_open_is_idempotent_wait_wakes_and_a_live_owner_may_send(kit: Kit) -> None:
    owner = kit.owner()
    owner.log.open()
    owner.commit(state("after a second open"))
    owner.drive_to(1)
    assert [entry.position for entry, _effects in owner.folded] == [1]
    assert owner.log.send_allowed()
    wake = threading.Event()
    wake.set()
    started = time.monotonic()
    owner.log.wait(10, wake)
    assert time.monotonic() - started < 1
    wake.clear()
    started = time.monotonic()
    owner.log.wait(0.2, wake)
    assert time.monotonic() - started < 2
