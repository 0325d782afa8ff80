"""Fire lag while a shard's owner writes snapshots of a big state, beside the same shard with
snapshots off, in the same run.

A fresh one-partition commands topic gets `--live` L schedules due in a day (the state a
snapshot must copy: at 1M live timers about 560 MB). One service folds them on a data
directory; then, on that directory, one after the other:

1. off: a service with snapshots off takes the shard; a steady `--rate` R timers/s due 200 ms
   later are scheduled for `--seconds` D and read back from the destination topic.
2. on: a service with snapshots every `--interval-ms` (default 1 s, so that one starts as
   soon as the last is done: the worst case, a snapshot always in progress) does the same.

Figures per phase: fire lag p50/p99/max (destination broker timestamp - deliverAt), early
deliveries (must be 0), the process CPU seconds, and in the second phase the snapshots
completed and their size.

    NEREUS_KAFKA_BOOTSTRAP=127.0.0.1:19092 .venv/bin/python -m bench.kafka_snapshot_lag \\
        [--live 1000000] [--rate 1000] [--seconds 30] [--interval-ms 1000]
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import uuid
from typing import Any

from bench.common import process_cpu_s, say, scratch, write_json
from bench.kafka_fire import DEST_PARTITIONS, _topic, steady_lag
from bench.kafka_takeover import commands_topic, take_shard, write_history
from nereus.adapters.clock import SystemClock
from nereus.adapters.kafka.config import KafkaServiceConfig
from nereus.adapters.kafka.log_snapshots import SNAPSHOT_BYTES, SNAPSHOT_WRITTEN_AT
from nereus.adapters.kafka.service import KafkaService

SHARD = {"shard": "0"}


def _service(bootstrap: str, topic: str, data: str, interval_ms: int, dest: str) -> KafkaService:
    tag = uuid.uuid4().hex[:8]
    service = KafkaService(
        KafkaServiceConfig(
            bootstrap=bootstrap,
            data_dir=data,
            commands_topic=topic,
            replies_topic=f"{topic}.replies",
            group=f"bench-snaplag-{tag}",
            shards=1,
            destination_topics={"q": dest},
            snapshot_interval_ms=interval_ms,
        ),
        clock=SystemClock(assumed_error_ms=1.0),
    )
    take_shard(service, 3_600)
    return service


def _phase(
    bootstrap: str, topic: str, data: str, interval_ms: int, *, rate: int, seconds: float
) -> dict[str, Any]:
    dest = _topic(bootstrap, "bench-snaplag-dest", DEST_PARTITIONS)
    service = _service(bootstrap, topic, data, interval_ms, dest)
    completed: set[float] = set()
    sizes: list[float] = []
    stop = threading.Event()

    def watch() -> None:
        # A snapshot's completion time is a gauge; each new value is one more snapshot.
        while not stop.wait(0.2):
            at = service.metrics.value(SNAPSHOT_WRITTEN_AT, SHARD)
            if at and at not in completed:
                completed.add(at)
                sizes.append(service.metrics.value(SNAPSHOT_BYTES, SHARD))

    watcher = threading.Thread(target=watch, daemon=True)
    try:
        watcher.start()
        cpu = process_cpu_s()
        result = steady_lag(service, bootstrap, dest, rate, seconds, prefix=uuid.uuid4().hex[:6])
        result["cpu_s"] = round(process_cpu_s() - cpu, 1)
    finally:
        stop.set()
        watcher.join()
        service.close()
    result["snapshot_interval_ms"] = interval_ms
    result["snapshots_completed"] = len(completed)
    result["snapshot_bytes"] = int(max(sizes, default=0))
    return result


def run(bootstrap: str, live: int, rate: int, seconds: float, interval_ms: int) -> dict[str, Any]:
    topic = commands_topic(bootstrap, "nereus-bench-snaplag")
    write_history(bootstrap, topic, live, live)
    with scratch("nereus-snaplag-") as root:
        data = os.path.join(root, "data")
        say(f"snapshot_lag: folding {live:,} live timers")
        dest = _topic(bootstrap, "bench-snaplag-dest", DEST_PARTITIONS)
        _service(bootstrap, topic, data, 0, dest).close()
        say(f"snapshot_lag: snapshots off, {rate}/s for {seconds:g} s")
        off = _phase(bootstrap, topic, data, 0, rate=rate, seconds=seconds)
        say(f"snapshot_lag: snapshots every {interval_ms} ms, {rate}/s for {seconds:g} s")
        on = _phase(bootstrap, topic, data, interval_ms, rate=rate, seconds=seconds)
    return {"live_timers": live, "off": off, "on": on}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--live", type=int, default=1_000_000)
    parser.add_argument("--rate", type=int, default=1_000)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--interval-ms", type=int, default=1_000)
    parser.add_argument("--json", help="write results to this file")
    args = parser.parse_args(argv)
    bootstrap = os.environ.get("NEREUS_KAFKA_BOOTSTRAP")
    if not bootstrap:
        raise SystemExit("kafka_snapshot_lag: set NEREUS_KAFKA_BOOTSTRAP (./scripts/kafka)")
    result = run(bootstrap, args.live, args.rate, args.seconds, args.interval_ms)
    for name in ("off", "on"):
        r = result[name]
        print(
            f"snapshots {name:>3}: lag p50 {r['lag_ms_p50']} ms, p99 {r['lag_ms_p99']} ms, "
            f"max {r['lag_ms_max']} ms, early {r['early']}, {r['published']:,} published, "
            f"CPU {r['cpu_s']} s, {r['snapshots_completed']} snapshots "
            f"({r['snapshot_bytes'] / 1e6:.0f} MB)"
        )
    write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
