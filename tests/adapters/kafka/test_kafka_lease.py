"""The send lease of the Kafka shard log, on the real broker: no send while this owner cannot
prove that it still holds the shard.

A Kafka owner may start a send only within `send_lease_ms` of the start of the last
transaction it committed to its shard log (`adapters.kafka.log_writer`). Being fenced is not
the only way to lose that proof: while the broker refuses the owner's transactions (here:
its commands and replies topics refuse every record, as a partition whose leader is gone or
a quota would), the owner cannot tell whether another process has taken the shard, so an
attempt admitted before must wait, however certain the clock, until a transaction commits
again. The test drives a `ShardRuntime` over a `KafkaLog` tick by tick:

1. a schedule, due at once, is produced to the commands topic; the owner folds it and
   commits its Admission (a transaction: the lease is fresh);
2. before the Admission is read back, the broker starts refusing the owner's records, and
   the lease runs out;
3. the owner folds its Admission (the attempt is admitted, its clock proves the action
   time), every transaction it tries is refused, and nothing is sent, tick after tick;
4. the broker accepts records again: the next transaction renews the lease, and the attempt
   is sent, once.

Every send is checked, at the moment it is made, to start while `send_allowed()` holds. The
same rule without a broker is tests/runtime/test_runtime_lease.py's.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._config import AlterConfigOpType, ConfigEntry, ConfigResource

from nereus.adapters.clock import SystemClock
from nereus.adapters.kafka.log import KafkaLog, KafkaLogConfig
from nereus.adapters.kafka.wire import Envelope, encode_envelope
from nereus.adapters.local.destination import LocalDestination
from nereus.kernel.keys import message_id, str_key
from nereus.kernel.model import Message, Status, Table
from nereus.kernel.records import PublishAdmission, members
from nereus.runtime.config import RuntimeConfig
from nereus.runtime.destination import Send
from nereus.runtime.shard import ShardRuntime
from nereus.service.arguments import schedule_record
from nereus.storage.store import ShardStore
from tests.support import kafka_env
from tests.support.kafka_cluster import read_shard_log
from tests.support.kafka_env import create_topic, unique_topic
from tests.support.runtime_harness import run_until

kafka_bootstrap = kafka_env.kafka_bootstrap
LOG_APPEND = {"message.timestamp.type": "LogAppendTime"}
QUEUE = "q"
MID = message_id("default", QUEUE, "k")
LEASE_MS = 600
# While refusing: above a transaction marker's batch (about 78 bytes; the broker must still
# write the markers of the transactions the owner aborts), below every record the owner
# writes (its smallest, the proof of ownership to the replies topic, is about 250).
REFUSING_BYTES = "120"
# Kafka's default (1 MiB + 12 bytes of batch overhead), to accept records again.
DEFAULT_BYTES = "1048588"
# How long the owner is ticked with its transactions refused and its attempt admitted.
REFUSED_S = 2.0


def _max_message_bytes(admin: AdminClient, topics: Sequence[str], value: str) -> None:
    op = AlterConfigOpType.SET
    entry = ConfigEntry("max.message.bytes", value, incremental_operation=op)
    resources = [ConfigResource("topic", topic, incremental_configs=[entry]) for topic in topics]
    for future in admin.incremental_alter_configs(resources).values():
        future.result(timeout=30)


def _refuses(bootstrap: str, topic: str) -> bool:
    """Whether the broker refuses a record of the size the owner writes into `topic` now
    (a probe of our own: in the commands topic, a record that is no envelope, which every
    owner skips)."""
    errors: list[Any] = []
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "retries": 0})
    producer.produce(topic, value=b"p" * 200, on_delivery=lambda e, _m: errors.append(e))
    assert producer.flush(30) == 0
    # `is`, never ==: KafkaError's comparison with None leaves a TypeError pending in the
    # interpreter (confluent-kafka 2.16), which surfaces at some later, unrelated call.
    (error,) = errors
    return error is not None


def _wait_for(done: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, f"no {what} within {timeout_s} s"
        time.sleep(0.1)


class Owned:
    """A shard owner on a real commands partition: its store, its KafkaLog, a local
    destination whose every send records whether the log allowed it, and the runtime."""

    def __init__(self, bootstrap: str, root: Path, commands: str, replies: str) -> None:
        self.store = ShardStore.open(str(root / "shard"), shard_id=f"kafka:{commands}:0")
        self.log = KafkaLog(
            self.store,
            KafkaLogConfig(
                bootstrap=bootstrap,
                topic=commands,
                partition=0,
                replies_topic=replies,
                process_id="lease-test",
                send_lease_ms=LEASE_MS,
                proof_interval_ms=LEASE_MS // 3,
                commit_timeout_s=5.0,
            ),
        )
        # (sends, whether the log allowed a send) at each call of the destination.
        self.sends: list[tuple[int, bool]] = []
        self.destination = LocalDestination(str(root / "destination"), before_send=self._sending)
        self.runtime = ShardRuntime(
            self.store,
            self.destination,
            SystemClock(assumed_error_ms=2),
            config=RuntimeConfig(owner="lease-test", claim_namespace=self.log.tenure),
            shard_log=self.log,
        )

    def _sending(self, sends: Sequence[Send]) -> None:
        self.sends.append((len(sends), self.log.send_allowed()))

    def tick_until(self, done: Callable[[], bool], timeout_s: float, what: str) -> None:
        run_until(self.runtime, done, timeout_s, what)

    def message(self) -> Message | None:
        with self.store.read() as view:
            m = view.get(Table.MESSAGES, str_key(MID))
        return m if isinstance(m, Message) else None

    def close(self) -> None:
        self.runtime.release()
        self.log.close()
        self.destination.close()
        self.store.close()


@pytest.fixture(scope="module")
def admin(kafka_bootstrap: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": kafka_bootstrap})


@pytest.fixture
def owned(kafka_bootstrap: str, tmp_path: Path) -> Iterator[Owned]:
    commands = create_topic(kafka_bootstrap, unique_topic("lease-cmd"), config=LOG_APPEND)
    replies = create_topic(kafka_bootstrap, unique_topic("lease-rep"))
    owner = Owned(kafka_bootstrap, tmp_path, commands, replies)
    yield owner
    owner.close()


def test_an_admitted_attempt_waits_while_the_owner_cannot_commit_to_its_shard_log(
    kafka_bootstrap: str, admin: AdminClient, owned: Owned
) -> None:
    c = owned.log.config
    record, payload = schedule_record(QUEUE, "k", b"leased", delay_ms=0)
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "acks": "all"})
    envelope = Envelope(f"client:{uuid.uuid4().hex}", None, record, payload)
    producer.produce(c.topic, value=encode_envelope(envelope), partition=0)
    assert producer.flush(30) == 0

    # 1. The owner folds the schedule and commits the Admission.
    owned.tick_until(lambda: owned.runtime.claims.state_of(MID) == "claimed", 30, "Admission")
    logged = read_shard_log(kafka_bootstrap, c.topic, 0)
    admissions = [
        r for x in logged for r in members(x.entry.record) if isinstance(r, PublishAdmission)
    ]
    assert len(admissions) == 1, "the Admission was not committed to the shard log"
    assert owned.runtime.claims.state_of(MID) == "claimed", "read back before the refusal"

    # 2. The broker refuses the owner's records from now on, and the lease runs out.
    _max_message_bytes(admin, [c.topic, c.replies_topic], REFUSING_BYTES)
    _wait_for(lambda: _refuses(kafka_bootstrap, c.replies_topic), 30, "refusal")
    _wait_for(lambda: _refuses(kafka_bootstrap, c.topic), 30, "refusal")
    time.sleep(LEASE_MS / 1000)
    assert not owned.log.send_allowed()

    # 3. Admitted, the clock certain, every transaction refused: nothing is sent.
    owned.tick_until(lambda: owned.runtime.claims.state_of(MID) == "admitted", 30, "fold")
    m = owned.message()
    assert m is not None and m.status is Status.PUBLISHING
    deadline = time.monotonic() + REFUSED_S
    while time.monotonic() < deadline:
        owned.runtime.run_once()
        time.sleep(0.02)
    assert owned.sends == [], "sent while the shard log proved nothing"
    assert owned.runtime.claims.state_of(MID) == "admitted"
    assert owned.runtime.lost is None and owned.runtime.halted is None
    assert list(owned.destination.iter_all(QUEUE)) == []

    # 4. The broker accepts records again: a transaction renews the lease, the send goes.
    _max_message_bytes(admin, [c.topic, c.replies_topic], DEFAULT_BYTES)

    def delivered() -> bool:
        m = owned.message()
        return m is not None and m.status is Status.DELIVERED

    owned.tick_until(delivered, 30, "delivery")
    assert owned.sends == [(1, True)]
    (sent,) = owned.destination.iter_all(QUEUE)
    assert sent.payload == b"leased"
