"""The library's own costs: the check at submit, and consuming the local destination.

Measurements in one run, on fresh stores in a temporary directory:

1. the guard: `runtime.guard.check_items` (what `ShardRuntime.submit` runs on every item:
   the log's encoding and decoding of the record, the payload's digest) on N schedules,
   beside the raw cost the commit pays anyway for the same records (`encode_entry` of each
   one), per record;
2. consuming: N records already in a local topic, handed out and committed by
   `LocalConsumer.run` with auto commit, at `max_batch` 100 (the default) and at 1 (a
   commit per record); beside it the raw floor of the same work: reading the topic a page
   of 100 at a time and writing one synced position per page.

    .venv/bin/python -m bench.library [--records 20000] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from typing import Any

from bench.common import PAYLOAD, T0_MS, write_json
from nereus.adapters.local.consumer import LocalConsumer
from nereus.adapters.local.destination import LocalDestination
from nereus.kernel.records import LogEntry, encode_entry
from nereus.runtime.destination import PreparedPublish, Send
from nereus.runtime.guard import check_items
from nereus.service.arguments import schedule_record


def guard(n: int) -> dict[str, Any]:
    items = [schedule_record("q", f"k{i}", PAYLOAD, delay_ms=60_000, txn="t") for i in range(n)]
    started = time.perf_counter()
    for i in range(0, n, 1000):
        check_items(items[i : i + 1000])
    checked_s = time.perf_counter() - started
    started = time.perf_counter()
    for position, (record, _) in enumerate(items, start=1):
        encode_entry(LogEntry(position, T0_MS, record))
    encoded_s = time.perf_counter() - started
    return {
        "records": n,
        "check_us_per_record": round(checked_s / n * 1e6, 2),
        "encode_us_per_record": round(encoded_s / n * 1e6, 2),
        "ratio": round(checked_s / encoded_s, 2),
    }


def _fill(path: str, n: int) -> None:
    dest = LocalDestination(path)
    try:
        for first in range(0, n, 1000):
            sends = [
                Send(
                    f"m{i}.1.1",
                    PreparedPublish(
                        "local", "q", None, PAYLOAD, (), f"m{i}", 1, "t", 0, None, False
                    ),
                )
                for i in range(first, min(first + 1000, n))
            ]
            dest.submit(sends, T0_MS)
            dest.poll(0)
    finally:
        dest.close()


def consume(root: str, n: int, max_batch: int) -> float:
    path = os.path.join(root, f"consume-{max_batch}")
    _fill(path, n)
    dest = LocalDestination(path)
    try:
        consumer = LocalConsumer(dest, "q", group="bench", max_batch=max_batch)
        started = time.perf_counter()
        handled = consumer.run(lambda _: None, limit=n, idle_timeout_s=5)
        took_s = time.perf_counter() - started
        assert handled == n and consumer.committed == n, (handled, consumer.committed)
        consumer.close()
    finally:
        dest.close()
    return n / took_s


def raw(root: str, n: int) -> float:
    path = os.path.join(root, "raw")
    _fill(path, n)
    dest = LocalDestination(path)
    try:
        started = time.perf_counter()
        offset = 0
        while offset < n:
            page = dest.read("q", offset, 100)
            offset = page[-1].offset + 1
            dest.commit("raw", "q", offset)
        took_s = time.perf_counter() - started
    finally:
        dest.close()
    return n / took_s


def run(records: int, tmp: str | None = None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(dir=tmp) as root:
        batch = consume(root, records, 100)
        one = consume(root, max(records // 20, 100), 1)
        floor = raw(root, records)
    return {
        "guard": guard(records),
        "consume_per_s": round(batch),
        "consume_commit_each_per_s": round(one),
        "raw_read_and_commit_per_s": round(floor),
        "ratio": round(batch / floor, 3),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--records", type=int, default=20_000)
    p.add_argument("--json", help="also write the figures to this file")
    args = p.parse_args(argv)
    figures = run(args.records, os.environ.get("NEREUS_BENCH_DIR"))
    print(json.dumps(figures, indent=2))
    write_json(args.json, figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
