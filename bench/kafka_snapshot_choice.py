"""What shipping a shard's state through Kafka costs the process, for the two shapes issue 20
names: a compacted changelog (one keyed record per row change, as Kafka Streams backs its
state stores) against chunked snapshots (many rows per record, written once per snapshot).

Both write the same number of ~290-byte rows (a schema-6 message row's size) with a
transactional producer on a fresh topic: the changelog one record per row, a transaction per
2,000 rows (a tick's worth); the chunks 3,000 rows a record (~870 KB, under the 1 MiB record
limit), a transaction per ten chunks. The figure is process CPU (user + system) per row.
What it means per timer: a changelog pays it on every row change (about a dozen over a
timer's life: its schedule, its Admission and its outcome); a snapshot pays it once per live
row per snapshot interval, whatever the traffic.

    NEREUS_KAFKA_BOOTSTRAP=127.0.0.1:19092 .venv/bin/python -m bench.kafka_snapshot_choice
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

from bench.common import process_cpu_s, say, write_json

ROW_BYTES = 290
CHUNK_ROWS = 3_000
TICK_ROWS = 2_000


def _write(bootstrap: str, topic: str, rows: int, rows_per_record: int, per_txn: int) -> float:
    """CPU seconds of writing `rows` rows, `rows_per_record` a record, `per_txn` rows a
    transaction."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": f"nereus-bench-{uuid.uuid4().hex}",
            "linger.ms": 5,
            "message.max.bytes": 1_048_576,
        }
    )
    producer.init_transactions()
    row = os.urandom(ROW_BYTES)
    started = process_cpu_s()
    producer.begin_transaction()
    written = records = 0
    while written < rows:
        if rows_per_record == 1:
            producer.produce(topic, row, key=written.to_bytes(16, "big"))
        else:
            producer.produce(topic, row * rows_per_record)
        written += rows_per_record
        records += 1
        if records % 1_000 == 0:
            producer.poll(0)
        if written % per_txn == 0:
            producer.commit_transaction()
            producer.begin_transaction()
    producer.commit_transaction()
    return process_cpu_s() - started


def run(bootstrap: str, rows: int) -> dict[str, Any]:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    changelog, chunks = (f"nereus-bench-{kind}-{uuid.uuid4().hex[:8]}" for kind in ("cl", "ch"))
    topics = [
        NewTopic(changelog, 1, 1, config={"cleanup.policy": "compact"}),
        NewTopic(chunks, 1, 1, config={"max.message.bytes": "1048576"}),
    ]
    for future in admin.create_topics(topics).values():
        future.result()
    try:
        say(f"snapshot choice: {rows:,} rows as a changelog")
        changelog_s = _write(bootstrap, changelog, rows, 1, TICK_ROWS)
        say(f"snapshot choice: {rows:,} rows in chunks of {CHUNK_ROWS:,}")
        rows = rows // CHUNK_ROWS * CHUNK_ROWS
        chunks_s = _write(bootstrap, chunks, rows, CHUNK_ROWS, CHUNK_ROWS * 10)
    finally:
        for future in admin.delete_topics([changelog, chunks]).values():
            future.result()
    return {
        "rows": rows,
        "row_bytes": ROW_BYTES,
        "changelog_cpu_us_per_row": round(changelog_s / rows * 1e6, 2),
        "chunks_cpu_us_per_row": round(chunks_s / rows * 1e6, 2),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rows", type=int, default=300_000)
    parser.add_argument("--json", help="write results to this file")
    args = parser.parse_args(argv)
    bootstrap = os.environ.get("NEREUS_KAFKA_BOOTSTRAP")
    if not bootstrap:
        raise SystemExit("kafka_snapshot_choice: set NEREUS_KAFKA_BOOTSTRAP (./scripts/kafka)")
    result = run(bootstrap, args.rows)
    print(
        f"process CPU per row: changelog {result['changelog_cpu_us_per_row']} us, "
        f"chunks {result['chunks_cpu_us_per_row']} us ({result['rows']:,} rows)"
    )
    write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
