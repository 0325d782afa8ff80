"""Recovery in Kafka mode: from a kill -9 with N attempts in flight to delivering again.

Needs the shared broker (`./scripts/kafka start`; NEREUS_KAFKA_BOOTSTRAP or --bootstrap) for
the commands topic, and starts a broker of its own for the destination topic (scripts/kafka on
free ports, stopped at the end), which it pauses (SIGSTOP) to hold sends in flight. For each
capability (transactional, idempotent) and each N (0, 512, 2,048, 5,000):

1. one `nereus serve --kafka` process owns every shard (8: at most 1,024 claims per lane and
   shard are in flight, so 5,000 need 5 or more);
2. the destination broker is paused, N timers come due together and are all admitted (their
   sends wait in the producer), the process is killed (SIGKILL) and the broker resumed;
3. the process is restarted on the same data directory (t0) and, once it serves, 100 new
   timers due at once are scheduled; the figures are read back from Kafka (`tests.
   kafka_cluster.audit`): time from t0 to the first record any new tenure published, to the
   last outcome of an attempt the killed process left open, and how those were settled
   (found, proven absent, UNKNOWN).

N = 0 is the baseline in the same run: the same restart with nothing to settle, so the
difference is what the in-flight attempts cost.

    .venv/bin/python -m bench.recovery [--inflight 0,512,2048,5000] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench.common import say, write_json
from tests.support.kafka_cluster import (
    ServiceProc,
    Topics,
    audit,
    metric_sum,
    open_obligations,
    recovery_figures,
    schedule_many,
    schedule_op,
    wait_until,
)
from tests.support.kafka_env import create_topic, unique_topic
from tests.support.own_broker import Broker, new_broker

SHARDS = 8
DEST_PARTITIONS = 8
PROBES = 100
CAPABILITIES = ("transactional", "idempotent")


def _start_broker(root: str) -> Broker:
    broker = new_broker(Path(root) / "dest-broker")
    broker.script("start")
    return broker


def scenario(
    bootstrap: str, dest: Broker, root: str, delivery: str, inflight: int
) -> dict[str, Any]:
    topics = Topics.unique(
        create_topic(
            dest.bootstrap,
            unique_topic("dest"),
            partitions=DEST_PARTITIONS,
            config={"message.timestamp.type": "LogAppendTime"},
        )
    )
    data = Path(root) / f"{delivery}-{inflight}-{uuid.uuid4().hex[:6]}" / "a"
    data.parent.mkdir(parents=True)
    extra = ("--destination-bootstrap", dest.bootstrap, "--delivery", delivery)
    proc = ServiceProc("a", bootstrap, topics, data, shards=SHARDS, extra=extra)
    tag = uuid.uuid4().hex[:6]
    keys = [f"k{tag}-{i}" for i in range(inflight)]
    probes = [f"p{tag}-{i}" for i in range(PROBES)]
    try:
        proc.start().wait_serving()
        wait_until(lambda: proc.active_shards() == set(range(SHARDS)), 90, "shards active")
        killed = set(proc.tenures())
        dest.pause()
        try:
            schedule_many(proc, keys, delay_ms=1_000)
            wait_until(lambda: open_obligations(proc) >= inflight, 180, "all admitted")
            proc.kill()
        finally:
            dest.resume()
        restarted_ms = int(time.time() * 1000)
        proc.start().wait_serving()
        served_s = time.time() - restarted_ms / 1000
        proc.schedule([schedule_op(k, 0) for k in probes])
        wait_until(
            lambda: (
                metric_sum(proc, "nereus_recovery_pending_attempts") == 0
                and len(proc.active_shards()) == SHARDS
            ),
            300,
            "every in-flight attempt settled",
        )

        def published() -> bool:
            return metric_sum(proc, "nereus_outcomes_total", **{"class": "PUBLISHED"}) >= (
                PROBES + inflight
            )

        wait_until(published, 300, "the probes published")
    finally:
        proc.stop()
    a = audit(bootstrap, topics, SHARDS, DEST_PARTITIONS, destination_bootstrap=dest.bootstrap)
    f = recovery_figures(a, killed, restarted_ms)
    return {
        "delivery": delivery,
        "inflight_target": inflight,
        "in_flight": f.in_flight,
        "found": f.found,
        "proven_absent": f.absent,
        "unknown": f.unknown,
        "serving_s": round(served_s, 2),
        "first_new_delivery_s": round(f.first_new_delivery_s, 2),
        "all_settled_s": round(f.all_settled_s, 2) if f.in_flight else 0.0,
        "duplicates": sum(max(len(rs) - 1, 0) for rs in a.by_message.values()),
    }


def run(bootstrap: str, sizes: list[int]) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="nereus-bench-recovery-") as root:
        dest = _start_broker(root)
        try:
            for delivery in CAPABILITIES:
                for n in sizes:
                    say(f"recovery: {delivery}, {n:,} in flight")
                    row = scenario(bootstrap, dest, root, delivery, n)
                    say(f"recovery: {row}")
                    rows.append(row)
        finally:
            dest.script("stop")
    return {"shards": SHARDS, "probes": PROBES, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.recovery", description=__doc__)
    parser.add_argument("--bootstrap", default=os.environ.get("NEREUS_KAFKA_BOOTSTRAP", ""))
    parser.add_argument("--inflight", default="0,512,2048,5000")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    if not args.bootstrap:
        parser.error("a broker is needed: --bootstrap or NEREUS_KAFKA_BOOTSTRAP")
    result = run(args.bootstrap, [int(x) for x in args.inflight.split(",")])
    write_json(args.json, result)
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
