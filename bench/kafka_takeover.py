"""Takeover of a Kafka-mode shard by a process without a store: folding the commands topic
from offset 0 beside restoring the newest snapshot, in the same run, for each history length.

For each `--history` H: a fresh one-partition commands topic gets `--live` L schedules (due
in a day, 64-byte payloads), then H - L reschedules cycling over those timers, 500 commands a
record (`COMMANDS_V1`, as a client's batch travels). Then:

1. fold: a service on an empty data directory takes the shard; the figure is the time from
   its start to the shard being active (caught up, recovered, firing). It then writes a
   snapshot (interval 1 s) and is stopped once a snapshot covers the whole topic.
2. restore: a second service on another empty directory takes the shard, restoring that
   snapshot; the same figure.

The target (issue 20): the restore within 30 s at 1M live timers, and flat in the history
(10M commands against 1M: at most 1.2x).

    NEREUS_KAFKA_BOOTSTRAP=127.0.0.1:19092 .venv/bin/python -m bench.kafka_takeover \\
        [--live 1000000] [--history 1000000,10000000]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid
from typing import Any

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from bench.common import say, scratch, write_json
from nereus.adapters.clock import SystemClock
from nereus.adapters.kafka.config import KafkaServiceConfig
from nereus.adapters.kafka.service import KafkaService
from nereus.adapters.kafka.snapshots import latest_manifest
from nereus.adapters.kafka.topics import wait_for_leaders
from nereus.adapters.kafka.wire import Envelope, encode_envelope
from nereus.kernel.records import Appendable
from nereus.runtime.batching import command_record
from nereus.service.arguments import reschedule_record, schedule_record

BATCH = 500
DAY_MS = 86_400_000
PAYLOAD = b"p" * 64


def write_history(bootstrap: str, topic: str, live: int, history: int) -> int:
    """Write `live` schedules due in a day, then reschedules of them up to `history`
    commands, straight to partition 0 of `topic`; returns the records written."""
    producer = Producer(
        {"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 20}
    )
    records = 0

    def send(unit: list[Appendable]) -> None:
        nonlocal records
        record, payload = command_record(unit)
        envelope = Envelope(f"bench:{records}", None, record, payload)
        while True:
            try:
                producer.produce(topic, encode_envelope(envelope), partition=0)
                break
            except BufferError:
                producer.poll(0.1)
        records += 1
        producer.poll(0)

    for first in range(0, live, BATCH):
        send(
            [
                schedule_record("q", f"t{i}", PAYLOAD, delay_ms=DAY_MS, txn=f"s{i}")
                for i in range(first, min(first + BATCH, live))
            ]
        )
        if first % 100_000 == 0:
            say(f"takeover: {first:,} of {live:,} schedules written")
    for first in range(0, history - live, BATCH):
        send(
            [
                reschedule_record("q", f"t{n % live}", delay_ms=DAY_MS + n, txn=f"r{n}")
                for n in range(first, min(first + BATCH, history - live))
            ]
        )
        if first % 1_000_000 == 0:
            say(f"takeover: {first:,} of {history - live:,} reschedules written")
    producer.flush(300)
    return records


def commands_topic(bootstrap: str, prefix: str) -> str:
    """A fresh one-partition commands topic, as the service would create it."""
    topic = f"{prefix}-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    config = {"message.timestamp.type": "LogAppendTime", "retention.ms": "-1"}
    admin.create_topics([NewTopic(topic, 1, 1, config=config)])[topic].result(30)
    wait_for_leaders(admin, topic, 30)
    return topic


def _service(bootstrap: str, topic: str, data: str, interval_ms: int) -> KafkaService:
    tag = uuid.uuid4().hex[:8]
    return KafkaService(
        KafkaServiceConfig(
            bootstrap=bootstrap,
            data_dir=data,
            commands_topic=topic,
            replies_topic=f"{topic}.replies",
            group=f"bench-takeover-{tag}",
            shards=1,
            snapshot_interval_ms=interval_ms,
            snapshot_bytes_per_tick=4 * 1024 * 1024,
        ),
        clock=SystemClock(assumed_error_ms=2),
    )


def _until(predicate: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"takeover: {what} not within {timeout_s} s")
        time.sleep(0.05)


def take_shard(service: KafkaService, timeout_s: float) -> float:
    """Start `service` and wait for its one shard to be active; returns the seconds taken."""
    started = time.monotonic()
    service.start()
    _until(lambda: service.shard_states() == {0: "active"}, timeout_s, "the shard active")
    return time.monotonic() - started


def one(bootstrap: str, live: int, history: int, timeout_s: float) -> dict[str, Any]:
    topic = commands_topic(bootstrap, "nereus-bench-takeover")
    records = write_history(bootstrap, topic, live, history)
    settings = {"bootstrap.servers": bootstrap}
    with scratch("nereus-takeover-") as root:
        say(f"takeover: folding {history:,} commands from offset 0")
        folder = _service(bootstrap, topic, os.path.join(root, "fold"), 1_000)
        try:
            fold_s = take_shard(folder, timeout_s)
            store = folder.owned_store(0)
            assert store is not None
            end = store.meta.position

            def snapshot_covers() -> bool:
                found = latest_manifest(settings, topic, 0)
                return found is not None and found.transfer.position >= end

            _until(snapshot_covers, timeout_s, "a snapshot of the whole history")
        finally:
            folder.close()
        manifest = latest_manifest(settings, topic, 0)
        assert manifest is not None
        say("takeover: restoring the snapshot")
        restorer = _service(bootstrap, topic, os.path.join(root, "restore"), 0)
        try:
            restore_s = take_shard(restorer, timeout_s)
        finally:
            restorer.close()
    return {
        "live_timers": live,
        "history_commands": history,
        "records": records,
        "fold_from_offset_0_s": round(fold_s, 2),
        "restore_s": round(restore_s, 2),
        "snapshot_bytes": manifest.transfer.bytes,
        "snapshot_rows": manifest.transfer.rows,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--live", type=int, default=1_000_000)
    parser.add_argument("--history", default="1000000,10000000")
    parser.add_argument("--timeout-s", type=float, default=3_600.0)
    parser.add_argument("--json", help="write results to this file")
    args = parser.parse_args(argv)
    bootstrap = os.environ.get("NEREUS_KAFKA_BOOTSTRAP")
    if not bootstrap:
        raise SystemExit("kafka_takeover: set NEREUS_KAFKA_BOOTSTRAP (./scripts/kafka)")
    runs = [one(bootstrap, args.live, int(h), args.timeout_s) for h in args.history.split(",")]
    for r in runs:
        print(
            f"{r['live_timers']:,} live, {r['history_commands']:,} commands: fold from offset 0 "
            f"{r['fold_from_offset_0_s']} s, restore {r['restore_s']} s "
            f"({r['snapshot_bytes'] / 1e6:.0f} MB snapshot)"
        )
    if len(runs) > 1:
        ratio = runs[-1]["restore_s"] / runs[0]["restore_s"]
        print(f"restore, longest history / shortest: {ratio:.2f}")
    write_json(args.json, {"runs": runs})
    return 0


if __name__ == "__main__":
    sys.exit(main())
