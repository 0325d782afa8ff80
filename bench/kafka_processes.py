"""Kafka mode with 1 and with N service processes on this machine (`serve --processes N`).

Needs a broker (`./scripts/kafka start`; NEREUS_KAFKA_BOOTSTRAP or --bootstrap). For each
process count P, a fresh `nereus serve --kafka --processes P` (P = 1: one plain process)
with S shards; then:

1. intake: T timers, all due at about one instant T0 ahead, scheduled through the HTTP API
   in batches of 256 by C client threads; rate = T / time until every batch was answered
   (each answer means the schedules are durable in the shard logs);
2. fire: from T0, the processes publish them all to a fresh destination topic; rate =
   T / (last broker timestamp - earliest deliverAt); early deliveries are counted (must
   be 0).

The scaling figures are the P-process rates over the 1-process ones, measured in one run.

    .venv/bin/python -m bench.kafka_processes [--processes 1,2] [--timers 20000] [--shards 4]
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from typing import Any

from bench.common import say, write_json
from bench.kafka_fire import DEST_PARTITIONS, PAYLOAD, _read, _topic

BATCH = 256
CLIENTS = 16


def _start(bootstrap: str, root: str, processes: int, shards: int, dest: str) -> tuple[Any, str]:
    tag = uuid.uuid4().hex[:10]
    log_path = os.path.join(root, f"serve-{tag}.log")
    cmd = [
        sys.executable, "-m", "nereus", "serve", "--kafka", bootstrap,
        "--shards", str(shards), "--commands-topic", f"bench-cmd-{tag}",
        "--replies-topic", f"bench-rep-{tag}", "--group", f"bench-{tag}",
        "--topic", f"q={dest}", "--data", os.path.join(root, f"data-{tag}"),
        "--http", "127.0.0.1:0", "--assume-clock-error-ms", "1",
        "--processes", str(processes),
    ]  # fmt: skip
    err = open(log_path, "wb")  # noqa: SIM115  (closed with the process)
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)
    proc.log = err  # type: ignore[attr-defined]
    deadline = time.monotonic() + 120
    url = ""
    while time.monotonic() < deadline and not url:
        time.sleep(0.1)
        if proc.poll() is not None:
            raise RuntimeError(f"serve exited: {_tail(log_path)}")
        url = _address(log_path)
    # Every shard active, wherever it is: health answers for one process at a time.
    active: set[int] = set()
    while time.monotonic() < deadline and len(active) < shards:
        try:
            with urllib.request.urlopen(url + "/healthz", timeout=5) as resp:
                doc = json.loads(resp.read())
        except OSError:
            time.sleep(0.1)
            continue
        fresh = {int(p) for p, s in doc.get("owned", {}).items() if s == "active"}
        active = fresh if processes == 1 else active | fresh
        time.sleep(0.05)
    if len(active) < shards:
        raise TimeoutError(f"shards not active: {sorted(active)}")
    time.sleep(1.0 if processes > 1 else 0)  # the last process's shards settled too
    return proc, url


def _address(log_path: str) -> str:
    """The service's address, from its log (the supervisor's or the process's line)."""
    with open(log_path) as f:
        for line in f:
            if line.startswith("{"):
                event = json.loads(line)
                if event.get("event") in ("serving", "supervising"):
                    return str(event["url"])
    return ""


def _tail(log_path: str) -> str:
    with open(log_path, errors="replace") as f:
        return f.read()[-2000:]


def _schedule(url: str, keys: list[str], t0_ms: int) -> None:
    payload = base64.b64encode(PAYLOAD).decode()
    for i in range(0, len(keys), BATCH):
        # The API takes a delay from the schedule's persistence time: aim each batch at T0.
        delay_ms = max(t0_ms - int(time.time() * 1000), 0)
        ops = [
            {"op": "schedule", "queue": "q", "timerKey": k, "delayMs": delay_ms,
             "txn": "tx", "payload": payload}
            for k in keys[i : i + BATCH]
        ]  # fmt: skip
        body = json.dumps({"operations": ops}).encode()
        req = urllib.request.Request(url + "/api/v1/timers", data=body, method="POST")
        req.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(req, timeout=120) as resp:
            doc = json.loads(resp.read())
        bad = [r for r in doc["results"] if r["status"] != "scheduled"]
        if bad:
            raise RuntimeError(f"refused: {bad[:3]}")


def run_one(bootstrap: str, processes: int, timers: int, shards: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="nereus-procs-") as root:
        dest = _topic(bootstrap, "bench-procs", DEST_PARTITIONS)
        proc, url = _start(bootstrap, root, processes, shards, dest)
        try:
            say(f"kafka_processes: {processes} process(es), scheduling {timers:,} timers")
            t0_ms = int(time.time() * 1000) + max(8000, timers // 2)
            keys = [f"t{i}" for i in range(timers)]
            chunks = [keys[c::CLIENTS] for c in range(CLIENTS)]
            errors: list[BaseException] = []

            def client(chunk: list[str]) -> None:
                try:
                    _schedule(url, chunk, t0_ms)
                except BaseException as exc:
                    errors.append(exc)

            started = time.perf_counter()
            threads = [threading.Thread(target=client, args=(c,)) for c in chunks]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            intake_s = time.perf_counter() - started
            if errors:
                raise errors[0]
            if int(time.time() * 1000) >= t0_ms:
                raise RuntimeError("intake took longer than the lead: fewer timers")
            say(f"kafka_processes: {processes} process(es), waiting for the fire")
            records = _read(bootstrap, dest, timers, 600)
        finally:
            proc.terminate()
            proc.wait(60)
            proc.log.close()
    last_ms = max(ts for ts, _ in records)
    # From the earliest deliverAt the persistence times gave (within ms of T0).
    fire_s = (last_ms - min(deliver_at for _, deliver_at in records)) / 1000
    return {
        "processes": processes,
        "shards": shards,
        "timers": timers,
        "intake_per_s": round(timers / intake_s),
        "fire_s": round(fire_s, 3),
        "fired_per_s": round(timers / fire_s) if fire_s > 0 else None,
        "records_seen": len(records),
        "early": sum(1 for ts, deliver_at in records if ts < deliver_at),
    }


def run(bootstrap: str, counts: list[int], timers: int, shards: int) -> dict[str, Any]:
    rows = [run_one(bootstrap, n, timers, shards) for n in counts]
    base = rows[0]
    for row in rows:
        row["intake_vs_first"] = round(row["intake_per_s"] / base["intake_per_s"], 2)
        if row["fired_per_s"] and base["fired_per_s"]:
            row["fire_vs_first"] = round(row["fired_per_s"] / base["fired_per_s"], 2)
    return {"bootstrap": bootstrap, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--bootstrap", default=os.environ.get("NEREUS_KAFKA_BOOTSTRAP", ""))
    parser.add_argument("--processes", default="1,2")
    parser.add_argument("--timers", type=int, default=20_000)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--json", help="write results to this file")
    args = parser.parse_args(argv)
    if not args.bootstrap:
        parser.error("needs a broker: --bootstrap or NEREUS_KAFKA_BOOTSTRAP")
    counts = [int(n) for n in args.processes.split(",")]
    result = run(args.bootstrap, counts, args.timers, args.shards)
    print(json.dumps(result, indent=2))
    write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
