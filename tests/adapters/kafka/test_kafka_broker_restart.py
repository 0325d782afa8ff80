"""The Kafka broker stopped and restarted while timers fire: work resumes, outcomes are true.

This test runs its OWN single-node broker (scripts/kafka on two free loopback ports, state in
a temporary directory), never the shared one the other Kafka tests use, and always stops it
at the end. `scripts/kafka stop` deletes the broker's data and `scripts/kafka start` always
reformats its storage, so neither can restart a broker with its data: the test stops the
broker with SIGTERM to its pid (the data directory survives) and starts it again with the
very command line the script launched it with (read from /proc), writing the script's pid
file so `scripts/kafka stop` still finds it for the teardown.

Scenario: an embedded shard store, `KafkaDestination` (message.timeout.ms 3 s, so records
held through the outage come back as timeouts rather than being retried until the broker is
back) and a `ShardRuntime` in its thread with the host clock. 60 timers fall due over 3 s;
the broker is stopped ~1 s into the fire, kept down a few seconds, and restarted with the
same data. Ten more timers are scheduled after the restart. Then, reading the destination
topic back (read_committed, LogAppendTime) and the shard's ledger and log:

* no record is stamped before its deliverAt;
* nothing is lost: every timer is DELIVERED, or UNCERTAIN with an UNKNOWN attempt;
* PUBLISHED is true (its attempt id is in the topic, at its evidence's offset) and
  NOT_PUBLISHED is true (its attempt id is not in the topic), for every outcome ever logged;
* an attempt id read twice, or a message read twice, has an UNKNOWN outcome in the log;
* the outage reached the fire path (a timer due during it was written only after it, or
  its attempt failed); the idempotent producer's outage left at least one non-PUBLISHED
  outcome in the log (a transaction may instead wait in its commit, or the lane be found
  unready before any send); the timers scheduled after the restart are all DELIVERED;
* an UNKNOWN attempt whose record is in the topic gets resolved by the reconciler.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from nereus.adapters.clock import SystemClock
from nereus.adapters.kafka.destination import Delivery, KafkaDestination, KafkaDestinationConfig
from nereus.adapters.local.embedded import Nereus
from nereus.kernel.keys import message_id
from nereus.kernel.model import Attempt, AttemptStatus, Message, Status, Table
from nereus.kernel.records import NotPublished, Published, PublishOutcome, Unknown
from nereus.runtime.destination import H_DELIVER_AT
from nereus.runtime.shard import ShardRuntime
from nereus.service.arguments import schedule_record
from nereus.service.results import to_result
from nereus.storage.store import ShardStore
from tests.support.builders import records
from tests.support.kafka_cluster import DestRecord, read_destination
from tests.support.kafka_env import create_topic, unique_topic
from tests.support.own_broker import Broker, own_broker_fixture

own_broker = own_broker_fixture("kafka-restart")
QUEUE = "reminders"
PARTITIONS = 2
FIRST_WAVE = 60
SECOND_WAVE = 10


def _wait_ready(broker: Broker, topic: str) -> None:
    """The topic has a leader for every partition again after the restart."""
    admin = AdminClient({"bootstrap.servers": broker.bootstrap, "log_level": 0})
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            meta = admin.list_topics(topic, timeout=2).topics.get(topic)
        except KafkaException:
            meta = None
        if (
            meta is not None
            and meta.error is None
            and len(meta.partitions) == PARTITIONS
            and all(p.leader >= 0 for p in meta.partitions.values())
        ):
            return
        time.sleep(0.1)
    raise AssertionError(f"{topic} has no leaders after the restart")


@dataclass
class Ledger:
    messages: dict[str, Message]
    attempts: dict[str, Attempt]
    # Every outcome ever logged per attempt id (an UNKNOWN later resolved keeps its trace).
    outcomes: dict[str, list[PublishOutcome]]


def read_ledger(store: ShardStore) -> Ledger:
    messages: dict[str, Message] = {}
    attempts: dict[str, Attempt] = {}
    with store.read() as view:
        for key, value in view.items(Table.MESSAGES):
            if isinstance(value, Message):
                messages[key.decode()] = value
        for key, value in view.items(Table.ATTEMPTS):
            if isinstance(value, Attempt):
                attempts[key.decode()] = value
    outcomes: dict[str, list[PublishOutcome]] = {}
    for record in records(store.iter_log()):
        if isinstance(record, PublishOutcome):
            outcomes.setdefault(record.attempt_id, []).append(record)
    return Ledger(messages, attempts, outcomes)


def settled(ledger: Ledger, mids: list[str]) -> bool:
    """Every timer DELIVERED, or UNCERTAIN with an attempt in UNKNOWN."""
    for mid in mids:
        m = ledger.messages.get(mid)
        if m is None:
            return False
        if m.status == Status.DELIVERED:
            continue
        if m.status != Status.UNCERTAIN:
            return False
        if not any(
            a.message_id == mid and a.status == AttemptStatus.UNKNOWN
            for a in ledger.attempts.values()
        ):
            return False
    return True


@pytest.mark.parametrize("delivery", ["transactional", "idempotent"])
def test_broker_stop_and_restart_mid_fire(
    own_broker: Broker, tmp_path: Path, delivery: Delivery
) -> None:
    t_start = time.monotonic()
    bootstrap = own_broker.bootstrap
    topic = create_topic(
        bootstrap,
        unique_topic("restart"),
        partitions=PARTITIONS,
        config={"message.timestamp.type": "LogAppendTime"},
    )
    dest = KafkaDestination(
        KafkaDestinationConfig(
            bootstrap=bootstrap,
            topics={QUEUE: topic},
            delivery=delivery,
            message_timeout_ms=3000,
            commit_timeout_s=5.0,
            admin_timeout_s=0.5,
            client_config={"log_level": 0},
        )
    )
    store = ShardStore.open(str(tmp_path / "shard"))
    runtime = ShardRuntime(
        store,
        dest,
        SystemClock(assumed_error_ms=2),
    )
    nereus = Nereus(store, dest, runtime)
    first = [f"a-{i}" for i in range(FIRST_WAVE)]
    second = [f"b-{i}" for i in range(SECOND_WAVE)]
    mids = {key: message_id("default", QUEUE, key) for key in first + second}
    try:
        nereus.start()
        for i, key in enumerate(first):
            delay = 300 + i * 3000 // FIRST_WAVE
            res = nereus.schedule(QUEUE, key, f"p-{key}".encode(), delay_ms=delay, partition=key)
            assert res.ok, res
        time.sleep(1.2)  # about a third of the timers have fired
        stopping_at_ms = int(time.time() * 1000)  # the broker refuses work from here
        argv = own_broker.stop_keeping_data()
        stopped_at = time.monotonic()
        time.sleep(4.0)
        back_at_ms = int(time.time() * 1000)  # the broker starts again from here
        own_broker.restart(argv)
        _wait_ready(own_broker, topic)
        outage_s = time.monotonic() - stopped_at
        # Not nereus.schedule (30 s limit): a reconcile pass begun during the outage may
        # still hold the loop.
        items = [
            schedule_record(QUEUE, key, f"p-{key}".encode(), delay_ms=200, partition=key)
            for key in second
        ]
        for item, outcome in zip(items, runtime.submit(items).result(90), strict=True):
            res = to_result(outcome, item[0], runtime.store.config)
            assert res.ok, res

        # Settle: every timer DELIVERED or UNCERTAIN behind an UNKNOWN attempt. (UNKNOWN
        # attempts whose record is in the topic are resolved by the reconciler later, one
        # find() after another on the loop: not waited for, only reported.)
        deadline = time.monotonic() + 90
        while True:
            assert runtime.halted is None, runtime.halted
            ledger = read_ledger(store)
            records = read_destination(bootstrap, topic, PARTITIONS)
            in_topic = {r.attempt_id for r in records}
            findable = [
                a.attempt_id
                for a in ledger.attempts.values()
                if a.status == AttemptStatus.UNKNOWN and a.attempt_id in in_topic
            ]
            if settled(ledger, list(mids.values())):
                break
            assert time.monotonic() < deadline, (
                f"not settled: {Counter(str(m.status) for m in ledger.messages.values())}, "
                f"UNKNOWN attempts whose record is in the topic: {findable}"
            )
            time.sleep(0.5)
    finally:
        nereus.close()

    # Never early.
    for r in records:
        deliver_at = int(r.headers[H_DELIVER_AT])
        assert r.timestamp_ms >= deliver_at, (
            f"{r.attempt_id} stamped {deliver_at - r.timestamp_ms} ms before deliverAt"
        )

    by_attempt: dict[str, list[DestRecord]] = {}
    by_message: dict[str, list[DestRecord]] = {}
    for r in records:
        by_attempt.setdefault(r.attempt_id, []).append(r)
        by_message.setdefault(r.message_id, []).append(r)
    unknown_attempts = {
        aid
        for aid, outs in ledger.outcomes.items()
        if any(isinstance(o.result, Unknown) for o in outs)
    }
    unknown_messages = {ledger.attempts[aid].message_id for aid in unknown_attempts}

    # Nothing lost; the second wave (after the restart) all delivered.
    assert settled(ledger, list(mids.values()))
    for key in second:
        assert ledger.messages[mids[key]].status == Status.DELIVERED, key

    # Outcomes are true, every one ever logged.
    for aid, outs in ledger.outcomes.items():
        for o in outs:
            if isinstance(o.result, Published):
                ev = o.result.evidence
                found = by_attempt.get(aid, [])
                assert any(
                    (r.partition, r.offset, r.timestamp_ms)
                    == (ev.partition, ev.offset, ev.timestamp_ms)
                    for r in found
                ), f"{aid} recorded PUBLISHED at {ev} but no such record in the topic"
            elif isinstance(o.result, NotPublished):
                assert aid not in by_attempt, (
                    f"{aid} recorded NOT_PUBLISHED ({o.result.error_code}) but it is in the topic"
                )
    for a in ledger.attempts.values():
        if a.status == AttemptStatus.PUBLISHED:
            assert a.attempt_id in by_attempt, a
        if a.status == AttemptStatus.NOT_PUBLISHED:
            assert a.attempt_id not in by_attempt, a

    # Duplicates only behind a recorded UNKNOWN.
    for aid, rs in by_attempt.items():
        if len(rs) > 1:
            assert aid in unknown_attempts, f"attempt {aid} read {len(rs)} times, never UNKNOWN"
    for mid, rs in by_message.items():
        if len(rs) > 1:
            assert mid in unknown_messages, f"message {mid} read {len(rs)} times, never UNKNOWN"
    assert set(by_message) <= set(mids.values())

    # The outage reached the fire path: a timer that came due while the broker was down was
    # written only once it was back, or its attempt failed.
    failed = {
        ledger.attempts[aid].message_id
        for aid, outs in ledger.outcomes.items()
        if any(not isinstance(o.result, Published) for o in outs)
    }
    stamped = {r.message_id: r.timestamp_ms for r in records}
    held = [
        mid
        for mid in mids.values()
        if stopping_at_ms <= ledger.messages[mid].deliver_at_ms < back_at_ms
        and (mid in failed or stamped.get(mid, 0) >= back_at_ms)
    ]
    assert held, f"no timer due during the {outage_s:.1f} s outage waited for the broker"
    classes = Counter(type(o.result).__name__ for outs in ledger.outcomes.values() for o in outs)
    if delivery == "idempotent":
        # It lasted longer than message.timeout.ms, so the records produced while the broker
        # was down came back as failures, not successes. (A transaction may instead wait in
        # its commit, or the lane be found unready before any send: nothing fails then.)
        assert classes["Unknown"] + classes["NotPublished"] > 0, (classes, outage_s)
    else:
        # Every transaction of the outage was aborted or settled by the fence: never
        # UNKNOWN, so never a duplicate, and every timer delivered.
        assert classes["Unknown"] == 0, classes
        assert all(len(rs) == 1 for rs in by_message.values())
        for mid in mids.values():
            assert ledger.messages[mid].status == Status.DELIVERED, mid
    duplicates = sum(len(rs) - 1 for rs in by_message.values())
    print(
        f"\noutage {outage_s:.1f} s; outcomes {dict(classes)}; messages "
        f"{dict(Counter(str(m.status) for m in ledger.messages.values()))}; "
        f"records {len(records)}, duplicate records {duplicates}; "
        f"UNKNOWN still open though in the topic {len(findable)}; "
        f"test {time.monotonic() - t_start:.1f} s"
    )
