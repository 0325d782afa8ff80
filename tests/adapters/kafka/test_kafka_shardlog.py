"""The Kafka-partitioned shard log against a real broker (scripts/kafka; NEREUS_KAFKA_BOOTSTRAP).

Every test uses its own topics and group. The truth is always read back from Kafka by an
auditor (`tests.support.kafka_cluster.audit`): each commands partition is re-read (read_committed,
positions counted as an owner counts them, LogAppendTime as persistence time) and folded by
the kernel, and the destination topic is checked against those ledgers:

* in one process (`KafkaService`): schedules through Kafka are published to the destination
  topic once, never before deliverAt (broker timestamps), with the evidence headers; the
  owner's LMDB stores equal the fold of the Kafka log; envelopes that are not envelopes are
  skipped identically by everyone;
* fencing on one partition (a second `KafkaLog` fences the first) is the `ShardLog`
  contract's, with the embedded log's: tests/runtime/test_shardlog_contract.py;
* two `nereus serve --kafka` processes share the shards and answer for each other (replies
  topic); SIGTERM one and its shards move to the other, which resolves the PUBLISHING
  attempts it finds in the log by evidence;
* a zombie (SIGSTOP the owner, the group rebalances, SIGCONT): its producer is fenced, none
  of its records lands after the new owner's, and it starts no send after waking;
* SIGKILL an owner mid-fire and restart it, `NEREUS_KAFKA_CRASH_ITERATIONS` times (default
  3) at moments drawn from `NEREUS_KAFKA_CRASH_SEED` (a fixed default; `random` draws one
  and prints it): nothing lost, nothing early, duplicates only behind a recorded UNKNOWN,
  and every local store is a prefix of the Kafka log.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from nereus.adapters.clock import SystemClock
from nereus.adapters.kafka.log_read import FROM_MEMORY
from nereus.adapters.kafka.service import KafkaService, KafkaServiceConfig
from nereus.kernel.keys import message_id
from nereus.kernel.model import AttemptStatus
from nereus.kernel.records import PublishAdmission, ShardState, members
from nereus.service.arguments import schedule_record
from nereus.storage.store import ShardStore
from tests.support import kafka_env
from tests.support.kafka_cluster import (
    TENANT,
    ServiceProc,
    Topics,
    audit,
    check_delivery,
    check_stores_are_prefixes,
    keys_on_shards,
    open_obligations,
    schedule_op,
    wait_until,
    writes_after_takeover,
)
from tests.support.kafka_env import create_topic, unique_topic
from tests.support.seeds import seed_from_env
from tests.support.shardlogs import KafkaKit, no_rows, now_ms

kafka_bootstrap = kafka_env.kafka_bootstrap
LOG_APPEND = {"message.timestamp.type": "LogAppendTime"}
SHARDS = 3
# The SIGKILL loop: how many kills, and the seed of their moments (printed with the result).
CRASH_ITERATIONS = int(os.environ.get("NEREUS_KAFKA_CRASH_ITERATIONS", "3"))
CRASH_SEED = seed_from_env("NEREUS_KAFKA_CRASH_SEED", 708873)  # `random` draws one
DEST_PARTITIONS = 2


def _destination(bootstrap: str) -> str:
    return create_topic(
        bootstrap, unique_topic("dest"), partitions=DEST_PARTITIONS, config=LOG_APPEND
    )


# One process --------------------------------------------------------------------------------


def _one_process(bootstrap: str, tmp_path: Path, topics: Topics, shards: int) -> KafkaService:
    return KafkaService(
        KafkaServiceConfig(
            bootstrap=bootstrap,
            data_dir=str(tmp_path / "data"),
            commands_topic=topics.commands,
            replies_topic=topics.replies,
            group=topics.group,
            shards=shards,
            destination_topics={topics.queue: topics.destination},
        ),
        clock=SystemClock(assumed_error_ms=2),
    )


def test_schedules_through_kafka_publish_once_never_early(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    topics = Topics.unique(_destination(kafka_bootstrap))
    service = _one_process(kafka_bootstrap, tmp_path, topics, SHARDS)
    keys = [f"t{i}" for i in range(45)]
    try:
        service.start()
        wait_until(
            lambda: (
                set(service.shard_states().values()) == {"active"}
                and len(service.shard_states()) == SHARDS
            ),
            30,
            "all shards active",
        )
        # A record on the commands topic that is not an envelope gets no position.
        junk = Producer({"bootstrap.servers": kafka_bootstrap})
        junk.produce(topics.commands, b"\x00not an envelope", partition=0)
        junk.flush(10)
        items = [
            schedule_record(
                topics.queue,
                key,
                f"payload-{key}".encode(),
                delay_ms=i * 1500 // len(keys),
                txn=f"txn-{key}",
                partition=key[-1],
            )
            for i, key in enumerate(keys)
        ]
        outcomes = service.execute(items, 30)
        assert [o.code for o in outcomes] == ["scheduled"] * len(keys)
        again = service.execute(items[:3], 30)  # identical retries
        assert [o.code for o in again] == ["unchanged"] * 3

        def delivered() -> bool:
            return all(service.peek(topics.queue, k).status == "DELIVERED" for k in keys)

        wait_until(delivered, 30, "every timer DELIVERED")
        peek = service.peek(topics.queue, keys[0])
        assert peek.claimed is False and peek.payload is None  # bytes dropped once delivered
        stores = {p: service.owned_store(p) for p in range(SHARDS)}
        # The owners' own Admissions and outcomes were folded from memory (the store still
        # equals the decoded log entry for entry, below).
        lines = service.metrics.render().splitlines()
        from_memory = [float(x.rsplit(" ", 1)[1]) for x in lines if x.startswith(FROM_MEMORY)]
        assert sum(from_memory) >= 2
    finally:
        service.close()
    a = audit(kafka_bootstrap, topics, SHARDS, DEST_PARTITIONS)
    counts = check_delivery(a, keys, where="one process")
    assert counts["records"] == len(keys) and not counts.get("duplicates")
    for key in keys:
        recs = a.by_message[message_id(TENANT, topics.queue, key)]
        assert len(recs) == 1
    # Each shard's store, written by the fold, equals the kernel's fold of the Kafka log.
    assert all(s is not None for s in stores.values())
    assert check_stores_are_prefixes(a, [tmp_path / "data"], where="one process") == SHARDS
    for p in range(SHARDS):
        with ShardStore.open(str(tmp_path / "data" / f"shard-{p}"), create=False) as store:
            assert store.meta.position == len(a.logs[p])
            assert store.source is not None and store.source.last_offset >= a.logs[p][-1].offset
            # The mirrored local log is the Kafka log, entry for entry.
            assert list(store.iter_log()) == [x.entry for x in a.logs[p]]
    assert a.logs[0][0].envelope.reply_to is not None  # the junk record got no position


def test_a_calls_large_payloads_are_cut_into_records_the_topic_accepts(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """One call's commands for one shard travel as few records as the topic's
    max.message.bytes allows (1 MiB of payload + the envelope's reserve by default): five
    600 KiB payloads and a small one make three batch records of two, each answered in the
    call's order, every payload stored whole."""
    topics = Topics.unique(_destination(kafka_bootstrap))
    service = _one_process(kafka_bootstrap, tmp_path, topics, 1)
    big = [bytes([n]) * (600 * 1024) for n in range(5)]
    items = [
        schedule_record(topics.queue, f"big{n}", data, delay_ms=600_000, txn=f"t{n}")
        for n, data in enumerate(big)
    ]
    items.append(schedule_record(topics.queue, "small", b"s", delay_ms=600_000, txn="ts"))
    try:
        service.start()
        wait_until(lambda: service.shard_states() == {0: "active"}, 30, "the shard active")
        outcomes = service.execute(items, 60)
        assert [o.code for o in outcomes] == ["scheduled"] * len(items)
        assert [o.txn for o in outcomes] == [f"t{n}" for n in range(5)] + ["ts"]
        for n, data in enumerate(big):
            stored = service.peek(topics.queue, f"big{n}").payload
            assert stored == data
    finally:
        service.close()
    a = audit(kafka_bootstrap, topics, 1, DEST_PARTITIONS)
    sent = [x.entry.record for x in a.logs[0] if x.envelope.reply_to is not None]
    assert [type(r).__name__ for r in sent] == ["CommandBatch"] * 3
    assert [len(members(r)) for r in sent] == [2, 2, 2]


# Two processes ------------------------------------------------------------------------------


def _pair(
    bootstrap: str, tmp_path: Path, *, extra: tuple[str, ...] = ()
) -> tuple[Topics, ServiceProc, ServiceProc]:
    topics = Topics.unique(_destination(bootstrap))
    a = ServiceProc("a", bootstrap, topics, tmp_path / "a", shards=SHARDS, extra=extra)
    b = ServiceProc("b", bootstrap, topics, tmp_path / "b", shards=SHARDS, extra=extra)
    a.start().wait_serving()
    b.start().wait_serving()
    wait_until(
        lambda: (
            a.active_shards() | b.active_shards() == set(range(SHARDS))
            and a.active_shards()
            and b.active_shards()
        ),
        60,
        "the shards spread over both processes",
    )
    return topics, a, b


def _keys_of(owner: set[int], prefix: str, n: int) -> list[str]:
    """n timer keys whose shards are all in `owner`."""
    return keys_on_shards(prefix, n, SHARDS, owner)


def test_stopping_one_process_moves_its_shards_to_the_other(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    # A long destination linger keeps sends in flight, so the stop catches attempts that are
    # PUBLISHING in the log: the new owner must resolve them by evidence. (The idempotent
    # capability: a transaction does not linger. The transactional hand-over is
    # tests/adapters/kafka/test_kafka_recovery.py's.)
    topics, a, b = _pair(
        kafka_bootstrap,
        tmp_path,
        extra=("--destination-linger-ms", "400", "--delivery", "idempotent"),
    )
    try:
        a_shards = a.active_shards()
        # Commands to shards the other process owns are answered through the replies topic.
        keys = _keys_of(a_shards, "s", 30) + _keys_of(b.active_shards(), "o", 6)
        # a's timers fall due one every 80 ms from 0.4 s to 2.7 s; the stop comes at 1.5 s.
        results = b.schedule([schedule_op(k, 400 + 80 * i) for i, k in enumerate(keys)])
        assert [r["status"] for r in results] == ["scheduled"] * len(keys)
        status, doc = b.http("GET", f"/api/v1/timers/reminders/{keys[0]}")
        assert (status, doc["error"]["code"]) == (503, "shard_not_local")
        time.sleep(1.5)
        t_stop = time.time()
        assert a.stop() == 0
        stop_s = time.time() - t_stop
        wait_until(lambda: b.active_shards() == set(range(SHARDS)), 60, "b owns every shard")

        def all_delivered() -> bool:
            for k in keys:
                status, doc = b.http("GET", f"/api/v1/timers/reminders/{k}")
                if status != 200 or doc.get("status") != "DELIVERED":
                    return False
            return True

        wait_until(all_delivered, 60, "every timer DELIVERED at b")
        recovered = [e for e in b.events() if e.get("event") == "recovered_attempt"]
    finally:
        a.kill()
        b.stop()
    audit_ = audit(kafka_bootstrap, topics, SHARDS, DEST_PARTITIONS)
    counts = check_delivery(audit_, keys, where="sigterm")
    # Attempts a admitted and b resolved: found in the log, resolved by evidence.
    a_tenures = set(a.tenures())
    b_tenures = set(b.tenures())
    handed_over = [
        att
        for att, tenure in audit_.admitted_by.items()
        if tenure in a_tenures and audit_.resolved_by.get(att) in b_tenures
    ]
    assert handed_over, "the stop caught no attempt in flight"
    at_destination = {r.attempt_id for r in audit_.records}
    by_evidence = 0
    for attempt_id in handed_over:
        attempt = audit_.attempt(attempt_id)
        assert attempt is not None
        if attempt.status is AttemptStatus.PUBLISHED:
            assert attempt.evidence is not None and attempt_id in at_destination
            by_evidence += 1
        else:
            # Admitted by a, which stopped before sending it: b cannot know that, so it is
            # UNKNOWN (never NOT_PUBLISHED from absence), and a retry delivered the timer.
            assert attempt.status is AttemptStatus.UNKNOWN, attempt
            assert attempt_id not in at_destination
    assert by_evidence, "no PUBLISHING attempt was resolved by evidence"
    assert {e["result"] for e in recovered} <= {"Published", "Unknown"}, recovered
    assert not counts.get("duplicates"), counts
    check_stores_are_prefixes(audit_, [a.data, b.data], where="sigterm")
    print(
        f"sigterm: stop took {stop_s:.2f} s; {len(handed_over)} attempts handed over, "
        f"{by_evidence} resolved by evidence"
    )


def test_a_zombie_owner_is_fenced_and_sends_nothing_after_waking(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    topics, a, b = _pair(kafka_bootstrap, tmp_path)
    try:
        a_shards = a.active_shards()
        keys = _keys_of(a_shards, "z", 30)
        b.schedule([schedule_op(k, 200 + 100 * i) for i, k in enumerate(keys)])
        time.sleep(1.0)  # some of a's timers have fired, the rest are due while it sleeps
        zombie_tenures = set(a.tenures())
        b_tenures_before = set(b.tenures())
        t_stop_ms = int(time.time() * 1000)
        a.signal(signal.SIGSTOP)
        wait_until(lambda: b.active_shards() == set(range(SHARDS)), 60, "b takes a's shards")
        t_cont_ms = int(time.time() * 1000)
        a.signal(signal.SIGCONT)
        # (It may get shards back in the rebalance its return causes, under new tenures.)
        wait_until(
            lambda: any(e.get("event") in ("shards_lost", "shard_log_fenced") for e in a.events()),
            30,
            "the zombie notices it lost its shards",
        )

        def all_delivered() -> bool:
            for k in keys:
                status, doc = b.http("GET", f"/api/v1/timers/reminders/{k}")
                if status != 200 or doc.get("status") != "DELIVERED":
                    return False
            return True

        wait_until(all_delivered, 60, "every timer DELIVERED at b")
        time.sleep(1.0)
        a_events = a.events()
    finally:
        a.kill()
        b.stop()
    audit_ = audit(kafka_bootstrap, topics, SHARDS, DEST_PARTITIONS)
    check_delivery(audit_, keys, where="zombie")
    takeover_tenures = set(b.tenures()) - b_tenures_before

    def tenure(x: Any) -> str:
        return str(x.envelope.request_id.split(":")[0])

    late = writes_after_takeover(audit_, a_shards, zombie_tenures, takeover_tenures)
    assert not late, f"the zombie wrote to a shard after b took it: {late[:3]}"
    # Nothing the zombie started after waking reached the destination: a record it published
    # after SIGCONT is of an attempt admitted before SIGSTOP (a send already under way).
    admitted: dict[str, tuple[str, int]] = {}
    for logged in audit_.logs.values():
        for x in logged:
            for record in members(x.entry.record):
                if isinstance(record, PublishAdmission):
                    admitted[record.attempt_id] = (tenure(x), x.entry.persisted_at_ms)
    for r in audit_.records:
        by, admitted_at_ms = admitted[r.attempt_id]
        if by in zombie_tenures and r.timestamp_ms > t_cont_ms:
            assert admitted_at_ms < t_stop_ms, r
    fenced = [e for e in a_events if e.get("event") == "shard_log_fenced"]
    print(f"zombie: {len(fenced)} of its shard logs fenced when it tried to write after waking")


def test_sigkill_mid_fire_then_restart_loses_nothing(kafka_bootstrap: str, tmp_path: Path) -> None:
    # Sends linger 200 ms in the (idempotent) destination producer: the kill catches some in
    # flight. A transaction does not linger; the transactional capability's kills, with
    # thousands in flight, are tests/adapters/kafka/test_kafka_recovery.py's.
    topics, a, b = _pair(
        kafka_bootstrap,
        tmp_path,
        extra=("--destination-linger-ms", "200", "--delivery", "idempotent"),
    )
    keys: list[str] = []
    stop_feeding = threading.Event()
    errors: list[Any] = []

    def feed() -> None:
        i = 0
        while not stop_feeding.is_set():
            batch = [f"k{i + j}" for j in range(5)]
            i += 5
            ops = [schedule_op(k, 100 + (j * 97) % 700) for j, k in enumerate(batch)]
            try:
                results = b.schedule(ops)
            except Exception as exc:  # the test fails below with it
                errors.append(exc)
                return
            assert all(r["status"] == "scheduled" for r in results), results
            keys.extend(batch)
            time.sleep(0.05)

    feeder = threading.Thread(target=feed)
    rng = random.Random(CRASH_SEED)
    killed_tenures: set[str] = set()
    try:
        feeder.start()
        time.sleep(2.0)
        for _ in range(CRASH_ITERATIONS):
            # SIGKILL mid-fire at a seeded moment, down for a seeded while, then restart
            # on the same data directory.
            time.sleep(rng.uniform(0.2, 2.0))
            # Mid-fire means with attempts open: on a loaded machine a seeded moment alone
            # can fall between fires (each send lingers 200 ms, so an open one is still
            # open when the kill lands).
            wait_until(lambda: open_obligations(a) > 0, 60, "the owner holding open attempts")
            killed_tenures |= set(a.tenures())
            a.kill()
            time.sleep(rng.uniform(0.2, 1.5))
            a.start().wait_serving()
        time.sleep(2.0)
        stop_feeding.set()
        feeder.join(60)
        assert not errors, errors
        wait_until(
            lambda: a.active_shards() | b.active_shards() == set(range(SHARDS)),
            60,
            "every shard owned again",
        )

        def all_delivered() -> bool:
            peeks = {}
            for proc in (a, b):
                for k in keys:
                    status, doc = proc.http("GET", f"/api/v1/timers/reminders/{k}")
                    if status == 200:
                        peeks[k] = doc.get("status")
            return all(peeks.get(k) == "DELIVERED" for k in keys)

        wait_until(all_delivered, 90, "every timer DELIVERED")
    finally:
        stop_feeding.set()
        a.kill()
        b.stop()
    audit_ = audit(kafka_bootstrap, topics, SHARDS, DEST_PARTITIONS)
    where = f"sigkill (NEREUS_KAFKA_CRASH_SEED={CRASH_SEED})"
    counts = check_delivery(audit_, keys, where=where)
    check_stores_are_prefixes(audit_, [a.data, b.data], where=where)
    handed_over = [
        attempt_id
        for attempt_id, tenure in audit_.admitted_by.items()
        if tenure in killed_tenures and audit_.resolved_by.get(attempt_id) not in killed_tenures
    ]
    assert handed_over, f"the kills caught no attempt in flight (seed {CRASH_SEED})"
    unknown = sum(1 for att in handed_over if (x := audit_.attempt(att)) and x.error_code)
    print(
        f"sigkill seed={CRASH_SEED} kills={CRASH_ITERATIONS}: {len(keys)} timers, {counts}; "
        f"{len(handed_over)} attempts of the killed "
        f"owner resolved by others ({unknown} recorded UNKNOWN)"
    )


def test_the_kafka_log_refuses_payload_bytes_before_writing_anything(
    tmp_path: Path, kafka_bootstrap: str
) -> None:
    """Kafka mode's log takes only the runtime's own records: one handed payload bytes is
    refused with TypeError before anything is written, and the log goes on as before."""
    kit = KafkaKit(tmp_path, kafka_bootstrap)
    try:
        owner = kit.owner()
        with pytest.raises(TypeError, match="payload bytes"):
            owner.log.commit([(ShardState("PAUSED", "refused"), b"bytes")], now_ms(), no_rows)
        owner.commit((ShardState("PAUSED", "after"), None))
        owner.drive_to(1)
        assert [entry.record for entry, _effects in owner.folded] == [ShardState("PAUSED", "after")]
    finally:
        kit.close()
