"""The HTTP timer API beside the library API: schedule operations per second, same run.

One embedded `Nereus` (fresh directory, runtime started) and its HTTP server
(`adapters.http.server.HttpServer` over `TimerApi`) started in this process on loopback, port
0, without a configuration (one tenant, no credentials). Four ways to schedule timers (delay
1 h, so nothing fires meanwhile):

1. library, one per call: `Nereus.schedule(...)`, each call waiting for its durable commit;
2. library, batches of 256: the records `Nereus.schedule` builds (`schedule_record`) handed
   256 at a time to `nereus.runtime.execute`, the call the embedded HTTP backend makes;
3. HTTP, batches of 1: POST /api/v1/timers with one schedule operation, one after the other
   on one keep-alive connection;
4. HTTP, batches of 256: the same with 256 operations a POST.

The HTTP requests come from a client process of its own (`bench.http_load`): an HTTP client
is another program, and one in the server's process would share its interpreter lock. Its
bodies are encoded before its clock starts; every answer must be 200. The four alternate in
rounds so drift in the machine's load touches all of them. Ratios: HTTP 256 / library 256
and HTTP 1 / library one per call. Then two concurrent loads on the same server:

5. batch-1 POSTs from 64 keep-alive connections for a few seconds: requests/s and the
   latency percentiles (each request from its write to its whole answer);
6. 500 connections opened at once, one batch-1 POST each: how many were answered (the old
   thread-per-connection server with its backlog of 5 left 348 of 500 unanswered).

    .venv/bin/python -m bench.http_api [--calls 600] [--batches 60] [--rounds 3] [--seconds 5]
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from bench.common import PAYLOAD, Progress, write_json
from nereus.adapters.local.embedded import Nereus
from nereus.service.arguments import schedule_record

BATCH = 256
DELAY_MS = 3_600_000
_B64 = base64.b64encode(PAYLOAD).decode()


def _load(port: int, *args: str) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "bench.http_load", "--port", str(port), *args]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=600)
    result: dict[str, Any] = json.loads(done.stdout)
    if result["ok"] != result["requests"]:
        raise RuntimeError(f"HTTP answers that were not 200: {result}")
    return result


def run(calls: int, batches: int, rounds: int, seconds: float = 5.0) -> dict[str, Any]:
    from nereus.adapters.http.api import TimerApi  # noqa: PLC0415  (may be mid-edit)
    from nereus.adapters.http.server import HttpServer  # noqa: PLC0415

    spent = {"library_1": 0.0, "library_256": 0.0, "http_1": 0.0, "http_256": 0.0}
    done = dict.fromkeys(spent, 0)
    progress = Progress("http_api: rounds", rounds)
    with tempfile.TemporaryDirectory(
        prefix="nereus-bench-", dir=os.environ.get("NEREUS_BENCH_DIR")
    ) as root:
        nereus = Nereus.open(root, assume_clock_error_ms=1.0)
        nereus.start()
        server = HttpServer(TimerApi(nereus.service), "127.0.0.1", 0)
        server.start()
        try:
            per_round_calls = max(1, calls // rounds)
            per_round_batches = max(1, batches // rounds)
            for r in range(rounds):

                def timed(name: str, fn: Callable[[], None], ops: int) -> None:
                    t = time.perf_counter()
                    fn()
                    spent[name] += time.perf_counter() - t
                    done[name] += ops

                def library_1(r: int = r) -> None:
                    for i in range(per_round_calls):
                        result = nereus.schedule("q", f"l1-{r}-{i}", PAYLOAD, delay_ms=DELAY_MS)
                        if result.status != "scheduled":
                            raise RuntimeError(f"library schedule: {result.status}")

                def library_256(r: int = r) -> None:
                    for b in range(per_round_batches):
                        items = [
                            schedule_record("q", f"l256-{r}-{b}-{i}", PAYLOAD, delay_ms=DELAY_MS)
                            for i in range(BATCH)
                        ]
                        outcomes = nereus.runtime.execute(items, 120)
                        bad = [o for o in outcomes if str(o.code) != "scheduled"]
                        if bad:
                            raise RuntimeError(f"library batch: {bad[0]}")

                timed("library_1", library_1, per_round_calls)
                timed("library_256", library_256, per_round_batches * BATCH)
                for name, count, batch in (
                    ("http_1", per_round_calls, 1),
                    ("http_256", per_round_batches, BATCH),
                ):
                    got = _load(
                        server.port,
                        *("--sequence", str(count), "--batch", str(batch), "--payload", _B64),
                        *("--prefix", f"{name}-{r}"),
                    )
                    spent[name] += got["elapsed_s"]
                    done[name] += count * batch
                progress.update(r + 1)
            keep_alive = _load(server.port, "--clients", "64", "--seconds", str(seconds))
            burst = _load(server.port, "--clients", "500", "--fresh")
        finally:
            server.stop()
            nereus.close()
    rate = {name: done[name] / spent[name] for name in spent}
    return {
        "rounds": rounds,
        "operations": done,
        "library_1_per_s": round(rate["library_1"]),
        "library_256_per_s": round(rate["library_256"]),
        "http_1_per_s": round(rate["http_1"]),
        "http_256_per_s": round(rate["http_256"]),
        "http_256_vs_library_256": round(rate["http_256"] / rate["library_256"], 4),
        "http_1_vs_library_1": round(rate["http_1"] / rate["library_1"], 4),
        "http_256_vs_library_1": round(rate["http_256"] / rate["library_1"], 4),
        "keep_alive_64": keep_alive,
        "connections_500": burst,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--calls", type=int, default=600, help="single schedules per way")
    parser.add_argument("--batches", type=int, default=60, help="batches of 256 per way")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0, help="of the 64-client load")
    parser.add_argument("--json", help="write results to this file")
    args = parser.parse_args(argv)
    r = run(args.calls, args.batches, args.rounds, args.seconds)
    ka, burst = r["keep_alive_64"], r["connections_500"]
    print(
        f"library one per call {r['library_1_per_s']:>8,}/s   HTTP batch 1   "
        f"{r['http_1_per_s']:>8,}/s   ratio {r['http_1_vs_library_1']:.3f}\n"
        f"library batch 256    {r['library_256_per_s']:>8,}/s   HTTP batch 256 "
        f"{r['http_256_per_s']:>8,}/s   ratio {r['http_256_vs_library_256']:.3f}\n"
        f"64 keep-alive clients, batch 1: {ka['per_s']:,} requests/s, p50 {ka['p50_ms']} ms, "
        f"p99 {ka['p99_ms']} ms\n"
        f"500 connections at once: {burst['ok']} of {burst['clients']} answered 200 in "
        f"{burst['elapsed_s']} s (p99 {burst['p99_ms']} ms)"
    )
    write_json(args.json, r)
    return 0


if __name__ == "__main__":
    sys.exit(main())
