"""What recovery and uncertain retries may conclude from Kafka evidence, on the real broker.

A shard runtime on a real LMDB store sends through `KafkaDestination` and is then "killed"
(its store and destination dropped, nothing more committed) with an attempt whose outcome is
not on the record: written to the topic, or never produced. A new incarnation on the same
store settles it from what the destination's evidence search says:

* **a record stamped before its admission** (a broker clock behind the host's, less than
  the search slack behind) is found: PUBLISHED by evidence, never proven absent and written
  again;
* **a search cut short** by its record or time bound proves nothing: the attempt stays open
  (PUBLISHING, searched again) while searches are bounded, and is found once one is not;
* **the look before an uncertain retry** is a complete search: with the idempotent producer
  an attempt nothing proves is UNKNOWN and its generation is retried, but never while the
  searches for the UNKNOWN attempt are incomplete (the record may be in what they did not
  read);
* **a proof of absence is the attempt's own fence's**: an attempt admitted unfenced (the
  idempotent capability, before a change to the transactional one) or under another
  transactional id is UNKNOWN after the restart, never NOT_PUBLISHED by the new producer's
  fence, and the uncertain retry delivers the timer once.

Every test reads the destination topic back (read_committed) to count what is really there.
The same rules without a broker are in tests/runtime/test_runtime_settle.py and
tests/adapters/kafka/test_kafka_evidence.py.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from nereus.adapters.clock import SystemClock
from nereus.adapters.kafka.destination import KafkaDestination, KafkaDestinationConfig
from nereus.kernel.codes import Code
from nereus.kernel.config import KernelConfig
from nereus.kernel.keys import attempt_prefix, message_id, str_key
from nereus.kernel.model import Attempt, AttemptStatus, Message, Status, Table
from nereus.kernel.records import NotPublished, Published, PublishOutcome, Unknown
from nereus.kernel.timing import TrustedInterval
from nereus.runtime.clock import ClockSource, ClockStatus
from nereus.runtime.destination import Send
from nereus.runtime.shard import ShardRuntime
from nereus.service.arguments import schedule_record
from nereus.storage.store import ShardStore
from tests.support import kafka_env
from tests.support.builders import records
from tests.support.kafka_cluster import read_destination
from tests.support.kafka_env import create_topic, unique_topic
from tests.support.runtime_harness import run_until

kafka_bootstrap = kafka_env.kafka_bootstrap
LOG_APPEND = {"message.timestamp.type": "LogAppendTime"}
PARTITIONS = 2  # of the destination topic
QUEUE = "q"
TENANT = "default"
MID = message_id(TENANT, QUEUE, "k")
BACKOFF_MS = KernelConfig().backoff_ms(1)  # the first retry after an UNKNOWN
# A broker clock this far behind the host's (well inside the default 30 s search slack).
BEHIND_MS = 5_000


class Died(SystemExit):
    """The process dies inside the send, before the producer is called."""


class DiesAtSend(KafkaDestination):
    def submit(self, sends: Sequence[Send], now_ms: int) -> None:
        if sends:
            raise Died("killed before the producer was called")
        super().submit(sends, now_ms)


class AheadClock:
    """The host clock read `ahead_ms` ahead: seen from the host, the broker's clock is that
    far behind, so it stamps a record before the admission that led to it."""

    def __init__(self, ahead_ms: int) -> None:
        self.host = SystemClock(assumed_error_ms=2)
        self.ahead_ms = ahead_ms

    def interval(self) -> TrustedInterval:
        i = self.host.interval()
        return TrustedInterval(i.earliest_ms + self.ahead_ms, i.latest_ms + self.ahead_ms)

    def now_ms(self) -> int:
        return self.host.now_ms() + self.ahead_ms

    def monotonic_ms(self) -> float:
        return self.host.monotonic_ms()

    def describe(self) -> ClockStatus:
        return self.host.describe()


class Owner:
    """One incarnation of the shard: its LMDB store, a Kafka destination and the runtime,
    ticked on the test's thread."""

    def __init__(self, root: Path, destination: KafkaDestination, clock: ClockSource) -> None:
        self.store = ShardStore.open(str(root / "shard"))
        self.destination = destination
        self.runtime = ShardRuntime(self.store, destination, clock)
        self.dead = False

    def tick_until(self, done: Callable[[], bool], timeout_s: float, what: str) -> None:
        run_until(self.runtime, done, timeout_s, what)

    def tick_for(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.runtime.run_once()
            time.sleep(0.01)

    def schedule(self) -> None:
        future = self.runtime.submit([schedule_record(QUEUE, "k", b"once", delay_ms=0)])
        self.tick_until(future.done, 10, "commit of the schedule")
        assert future.result(0)[0].code is Code.SCHEDULED

    def message(self) -> Message:
        with self.store.read() as view:
            m = view.get(Table.MESSAGES, str_key(MID))
        assert isinstance(m, Message)
        return m

    def attempts(self) -> list[Attempt]:
        prefix = attempt_prefix(MID, 1).encode()
        with self.store.read() as view:
            rows = [a for _, a in view.range(Table.ATTEMPTS, prefix, prefix + b"\xff")]
        return sorted(
            (a for a in rows if isinstance(a, Attempt)), key=lambda a: a.admitted_position
        )

    def results(self, attempt_id: str) -> list[Any]:
        return [
            r.result
            for r in records(self.store.iter_log())
            if isinstance(r, PublishOutcome) and r.attempt_id == attempt_id
        ]

    def recovered(self) -> bool:
        return self.runtime.is_recovered() and not self.runtime.recovery.recovering

    def crash(self) -> None:
        """Stop like a killed process: nothing more is committed."""
        if not self.dead:
            self.dead = True
            self.destination.close()
            self.store.close()


def at_destination(bootstrap: str, topic: str) -> list[str]:
    """The attempt ids of every committed record of `topic`."""
    return [r.attempt_id for r in read_destination(bootstrap, topic, PARTITIONS)]


@pytest.fixture
def topic(kafka_bootstrap: str) -> str:
    return create_topic(
        kafka_bootstrap, unique_topic("settle"), partitions=PARTITIONS, config=LOG_APPEND
    )


@pytest.fixture
def owners() -> Iterator[list[Owner]]:
    made: list[Owner] = []
    yield made
    for owner in made:
        owner.crash()


def _destination(
    bootstrap: str, topic: str, *, cls: type[KafkaDestination] = KafkaDestination, **options: Any
) -> KafkaDestination:
    config = KafkaDestinationConfig(bootstrap=bootstrap, topics={QUEUE: topic}, **options)
    return cls(config)


def _sent_then_killed(
    bootstrap: str, topic: str, root: Path, clock: ClockSource, owners: list[Owner], **options: Any
) -> Attempt:
    """The timer is admitted and sent, its record committed at the destination, and the
    process dies before the outcome is on the record. Returns the attempt."""
    owner = Owner(root, _destination(bootstrap, topic, **options), clock)
    owners.append(owner)
    owner.schedule()
    owner.tick_until(lambda: owner.runtime.claims.state_of(MID) == "sending", 20, "send")
    deadline = time.monotonic() + 30
    while not at_destination(bootstrap, topic):
        assert time.monotonic() < deadline, "the send never reached the topic"
        time.sleep(0.1)
    (attempt,) = owner.attempts()
    assert attempt.status is AttemptStatus.PUBLISHING
    owner.crash()
    return attempt


# A record stamped before its admission ------------------------------------------------------


@pytest.mark.parametrize("delivery", ["transactional", "idempotent"])
def test_recovery_finds_a_record_the_broker_stamped_before_its_admission(
    kafka_bootstrap: str, topic: str, tmp_path: Path, owners: list[Owner], delivery: str
) -> None:
    clock = AheadClock(BEHIND_MS)
    first = _sent_then_killed(kafka_bootstrap, topic, tmp_path, clock, owners, delivery=delivery)

    owner = Owner(tmp_path, _destination(kafka_bootstrap, topic, delivery=delivery), clock)
    owners.append(owner)
    owner.tick_until(owner.recovered, 30, "recovery")
    (attempt,) = owner.attempts()
    assert attempt.status is AttemptStatus.PUBLISHED, owner.results(first.attempt_id)
    assert attempt.evidence is not None
    # The scenario: the broker stamped the record before the admission's persistence time.
    assert attempt.evidence.timestamp_ms < first.admitted_at_ms
    assert [type(r) for r in owner.results(first.attempt_id)] == [Published]
    owner.tick_for(BACKOFF_MS / 1000 + 1)
    assert owner.message().status is Status.DELIVERED
    assert at_destination(kafka_bootstrap, topic) == [first.attempt_id]


# A bounded search ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bound",
    [{"find_max_seconds": 0.0}, {"find_max_records": 0}],
    ids=["time-bound", "record-bound"],
)
def test_a_bounded_search_at_recovery_proves_nothing(
    kafka_bootstrap: str, topic: str, tmp_path: Path, owners: list[Owner], bound: dict[str, Any]
) -> None:
    """Transactional: every search is made after the new producer's fence, so a complete miss
    would prove the attempt absent. These are cut short before reading anything: the record
    that is there must not be proven absent (and written again)."""
    clock = SystemClock(assumed_error_ms=2)
    first = _sent_then_killed(kafka_bootstrap, topic, tmp_path, clock, owners)

    bounded = Owner(tmp_path, _destination(kafka_bootstrap, topic, **bound), clock)
    owners.append(bounded)
    bounded.tick_for(4.0)  # recovery's search and its retries (1 s, then 2 s later)
    (attempt,) = bounded.attempts()
    assert attempt.status is AttemptStatus.PUBLISHING, bounded.results(first.attempt_id)
    assert bounded.results(first.attempt_id) == []
    assert first.attempt_id in bounded.runtime.recovery.recovering
    bounded.crash()

    owner = Owner(tmp_path, _destination(kafka_bootstrap, topic), clock)
    owners.append(owner)
    owner.tick_until(owner.recovered, 30, "recovery")
    (attempt,) = owner.attempts()
    assert attempt.status is AttemptStatus.PUBLISHED
    assert at_destination(kafka_bootstrap, topic) == [first.attempt_id]


# The look before an uncertain retry ---------------------------------------------------------


def test_an_uncertain_retry_waits_for_a_complete_search(
    kafka_bootstrap: str, topic: str, tmp_path: Path, owners: list[Owner]
) -> None:
    """Idempotent: nothing proves absence, so the attempt is UNKNOWN and a retry comes due
    after one backoff. While every search is cut short the retry is never sent (the record
    is at the destination); with complete searches the record is found instead."""
    clock = SystemClock(assumed_error_ms=2)
    idempotent: dict[str, Any] = {"delivery": "idempotent"}
    first = _sent_then_killed(kafka_bootstrap, topic, tmp_path, clock, owners, **idempotent)

    bound: dict[str, Any] = {"find_max_seconds": 0.0}
    bounded = Owner(tmp_path, _destination(kafka_bootstrap, topic, **idempotent, **bound), clock)
    owners.append(bounded)
    bounded.tick_until(bounded.recovered, 30, "recovery")
    m = bounded.message()
    assert m.status is Status.UNCERTAIN
    assert [type(r) for r in bounded.results(first.attempt_id)] == [Unknown]
    # Past the retry's action time, with searches for it made and cut short (they follow
    # each other 1, 2 and 4 s apart).
    wait_s = max(m.action_at_ms - clock.now_ms(), 0) / 1000 + 4.0
    bounded.tick_for(wait_s)
    assert [a.attempt_id for a in bounded.attempts()] == [first.attempt_id]
    assert bounded.message().status is Status.UNCERTAIN
    assert at_destination(kafka_bootstrap, topic) == [first.attempt_id]
    bounded.crash()

    owner = Owner(tmp_path, _destination(kafka_bootstrap, topic, **idempotent), clock)
    owners.append(owner)
    owner.tick_until(lambda: owner.message().status is Status.DELIVERED, 30, "delivery")
    (attempt,) = owner.attempts()
    assert attempt.status is AttemptStatus.PUBLISHED
    assert at_destination(kafka_bootstrap, topic) == [first.attempt_id]


# Proofs keyed to the attempt's own fence ----------------------------------------------------


@pytest.mark.parametrize("change", ["idempotent-to-transactional", "another-transactional-id"])
def test_a_restart_under_another_fence_leaves_the_attempt_unknown(
    kafka_bootstrap: str, topic: str, tmp_path: Path, owners: list[Owner], change: str
) -> None:
    """The attempt was admitted and its process died before the producer was called. The
    new incarnation's producer is fenced, but not the one the attempt was sent under: its
    complete search proves nothing about that attempt, which is UNKNOWN; the uncertain retry
    delivers the timer, once."""
    clock = SystemClock(assumed_error_ms=2)
    if change == "idempotent-to-transactional":
        before: dict[str, Any] = {"delivery": "idempotent"}
        after: dict[str, Any] = {}  # transactional, its id derived from the store
    else:
        before = {"transactional_id": f"nereus-test-a-{uuid.uuid4().hex[:8]}"}
        after = {"transactional_id": f"nereus-test-b-{uuid.uuid4().hex[:8]}"}
    dying = Owner(tmp_path, _destination(kafka_bootstrap, topic, cls=DiesAtSend, **before), clock)
    owners.append(dying)
    dying.schedule()
    with pytest.raises(Died):
        dying.tick_until(lambda: False, 20, "death at the send")
    (first,) = dying.attempts()
    assert first.status is AttemptStatus.PUBLISHING
    admitted_under = dying.destination.fence_id
    dying.crash()
    assert first.fence_id == admitted_under

    owner = Owner(tmp_path, _destination(kafka_bootstrap, topic, **after), clock)
    owners.append(owner)
    owner.tick_until(owner.recovered, 30, "recovery")
    assert owner.destination.fence_id is not None
    assert owner.destination.fence_id != first.fence_id
    (attempt,) = owner.attempts()
    assert attempt.status is AttemptStatus.UNKNOWN, owner.results(first.attempt_id)
    assert [type(r) for r in owner.results(first.attempt_id)] == [Unknown]

    owner.tick_until(lambda: owner.message().status is Status.DELIVERED, 30, "delivery")
    old, retry = owner.attempts()
    assert old.status is AttemptStatus.UNKNOWN and retry.status is AttemptStatus.PUBLISHED
    assert retry.fence_id == owner.destination.fence_id
    assert not [r for r in owner.results(first.attempt_id) if isinstance(r, NotPublished)]
    assert at_destination(kafka_bootstrap, topic) == [retry.attempt_id]
