"""Three `nereus serve --kafka` processes share twelve shards through rolling restarts under
a steady workload, with snapshots every two seconds and the owners trimming the commands
topic behind them: nothing is lost, nothing is early, nothing is published twice (the
transactional capability), and the commands topic no longer starts at offset 0.

The audit cannot read the shard logs from offset 0 (they were trimmed): each shard is
rebuilt from Kafka alone as `nereus replay --kafka` does (its newest snapshot, then the
commands after it), and the destination topic is read whole. `NEREUS_KAFKA_ROLLING_ROUNDS`
(default 1: each process restarted once) sizes it.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path

from nereus.adapters.kafka.audit import rebuild
from nereus.kernel.keys import message_id
from nereus.kernel.model import Attempt, AttemptStatus, Message, Status, Table
from nereus.runtime.destination import H_ATTEMPT_ID, H_DELIVER_AT, H_MESSAGE_ID
from tests.support import kafka_env
from tests.support.kafka_cluster import (
    TENANT,
    DestRecord,
    ServiceProc,
    Topics,
    read_destination,
    schedule_op,
    wait_until,
)
from tests.support.kafka_env import create_topic, unique_topic

kafka_bootstrap = kafka_env.kafka_bootstrap
SHARDS = 12
DEST_PARTITIONS = 3
ROUNDS = int(os.environ.get("NEREUS_KAFKA_ROLLING_ROUNDS", "1"))


def _workload(procs: list[ServiceProc], keys: list[str], stop: threading.Event) -> None:
    """A batch of 10 timers due 0.3-1.3 s ahead every 100 ms, through whichever process
    answers (a restarting one does not)."""
    i = 0
    while not stop.is_set():
        batch = [f"w{i + j}" for j in range(10)]
        ops = [schedule_op(k, 300 + 100 * n) for n, k in enumerate(batch)]
        for proc in procs[i // 10 % len(procs) :] + procs:
            try:
                results = proc.schedule(ops)
            except (OSError, AssertionError):
                continue
            if all(r["status"] == "scheduled" for r in results):
                keys.extend(batch)
                break
        i += 10
        stop.wait(0.1)


def test_rolling_restarts_of_three_processes_lose_nothing(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    topics = Topics.unique(
        create_topic(
            kafka_bootstrap,
            unique_topic("dest"),
            partitions=DEST_PARTITIONS,
            config={"message.timestamp.type": "LogAppendTime"},
        )
    )
    extra = ("--snapshot-interval-ms", "2000")
    procs = [
        ServiceProc(name, kafka_bootstrap, topics, tmp_path / name, shards=SHARDS, extra=extra)
        for name in ("a", "b", "c")
    ]
    keys: list[str] = []
    stop = threading.Event()
    worker = threading.Thread(target=_workload, args=(procs, keys, stop))
    try:
        for proc in procs:
            proc.start().wait_serving()

        def all_active() -> bool:
            owned = [p.active_shards() for p in procs]
            return set().union(*owned) == set(range(SHARDS)) and sum(map(len, owned)) == SHARDS

        wait_until(all_active, 90, "twelve shards active over three processes")
        worker.start()
        for _ in range(ROUNDS):
            for proc in procs:
                time.sleep(2.5)  # snapshots and trims happen between the restarts
                assert proc.stop() == 0, proc.log_tail()
                proc.start().wait_serving()
                wait_until(all_active, 90, f"every shard active again after {proc.name}")
        time.sleep(3.0)
    finally:
        stop.set()
        if worker.is_alive():
            worker.join(30)
    try:
        assert len(keys) >= 100, f"only {len(keys)} timers scheduled"
        wanted = {message_id(TENANT, "reminders", k): k for k in keys}

        def delivered_at_destination() -> bool:
            seen = {
                r.message_id
                for r in read_destination(kafka_bootstrap, topics.destination, DEST_PARTITIONS)
            }
            return set(wanted) <= seen

        wait_until(delivered_at_destination, 60, "every timer at the destination")
    finally:
        for proc in procs:
            proc.stop()
    records = read_destination(kafka_bootstrap, topics.destination, DEST_PARTITIONS)
    _check_destination(records, set(wanted))
    settings = {"bootstrap.servers": kafka_bootstrap}
    trimmed = 0
    attempts: dict[str, Attempt] = {}
    messages: dict[str, Message] = {}
    for shard in range(SHARDS):
        scratch = tmp_path / f"audit-{shard}"
        store, _result, audited = rebuild(settings, topics.commands, shard, str(scratch))
        try:
            trimmed += audited.snapshot is not None and audited.first_offset > 0
            with store.read() as view:
                for row_key, value in view.items(Table.ATTEMPTS):
                    assert isinstance(value, Attempt)
                    attempts[row_key.decode()] = value
                for row_key, value in view.items(Table.MESSAGES):
                    assert isinstance(value, Message)
                    messages[row_key.decode()] = value
        finally:
            store.close()
            shutil.rmtree(scratch, ignore_errors=True)
    assert trimmed > 0, "no shard's audit started from a snapshot after trimmed commands"
    for mid, key in wanted.items():
        m = messages.get(mid)
        assert m is not None, f"{key} is in no shard's state"
        assert m.status is Status.DELIVERED, f"{key} is {m.status}"
    for r in records:
        attempt = attempts.get(r.attempt_id)
        assert attempt is not None and attempt.status is AttemptStatus.PUBLISHED, r.attempt_id
    print(f"rolling: {len(keys)} timers, {len(records)} records, {trimmed} shards trimmed")


def _check_destination(records: list[DestRecord], wanted: set[str]) -> None:
    """0 early; and, the transactional capability, no timer twice."""
    seen: dict[str, int] = {}
    for r in records:
        for name in (H_MESSAGE_ID, H_ATTEMPT_ID, H_DELIVER_AT):
            assert r.headers.get(name), f"{name} missing on {r}"
        deliver_at = int(r.headers[H_DELIVER_AT])
        assert r.timestamp_ms >= deliver_at, (
            f"{r.attempt_id} {deliver_at - r.timestamp_ms} ms early"
        )
        seen[r.message_id] = seen.get(r.message_id, 0) + 1
    twice = {mid: n for mid, n in seen.items() if n > 1 and mid in wanted}
    assert not twice, f"published more than once: {twice}"
