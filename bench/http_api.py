"""The HTTP timer API beside the library API: schedule operations per second, same run.

One embedded `Nereus` (fresh directory, runtime started) and its HTTP server
(`adapters.http.server.HttpServer` over `TimerApi`) started in this process on loopback, port 0,
without a configuration (one tenant, no credentials). One keep-alive `http.client`
connection. Four ways to schedule timers (delay 1 h, so nothing fires meanwhile):

1. library, one per call: `Nereus.schedule(...)`, each call waiting for its durable commit;
2. library, batches of 256: the records `Nereus.schedule` builds (`schedule_record`) handed
   256 at a time to `nereus.runtime.execute`, the call the embedded HTTP backend makes;
3. HTTP, batches of 1: POST /api/v1/timers with one schedule operation;
4. HTTP, batches of 256: POST /api/v1/timers with 256 operations.

Request bodies are encoded before the clock starts (a client's cost, not the server's);
every answer is checked afterwards (200, every result `scheduled`). The four alternate in
rounds so drift in the machine's load touches all of them. Ratios: HTTP 256 / library 256
and HTTP 1 / library one per call.

Then two concurrent loads on the same server, from a client process of its own
(`bench.http_load`, so the client does not share the server's interpreter lock):

5. batch-1 POSTs from 64 keep-alive connections for a few seconds: requests/s and the
   latency percentiles (each request from its write to its whole answer);
6. 500 connections opened at once, one batch-1 POST each: how many were answered (the old
   thread-per-connection server with its backlog of 5 left 348 of 500 unanswered).

    .venv/bin/python -m bench.http_api [--calls 600] [--batches 60] [--rounds 3] [--seconds 5]
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from adapters.embedded import Nereus, schedule_record
from bench.common import PAYLOAD, Progress

BATCH = 256
DELAY_MS = 3_600_000
_B64 = base64.b64encode(PAYLOAD).decode()


def _body(prefix: str, start: int, count: int) -> bytes:
    ops = [
        {
            "op": "schedule",
            "queue": "q",
            "timerKey": f"{prefix}-{i}",
            "delayMs": DELAY_MS,
            "payload": _B64,
        }
        for i in range(start, start + count)
    ]
    return json.dumps({"operations": ops}).encode()


def _post_all(conn: http.client.HTTPConnection, bodies: list[bytes]) -> tuple[float, list[Any]]:
    answers: list[Any] = []
    headers = {"Content-Type": "application/json"}
    t = time.perf_counter()
    for body in bodies:
        conn.request("POST", "/api/v1/timers", body=body, headers=headers)
        response = conn.getresponse()
        answers.append((response.status, response.read()))
    return time.perf_counter() - t, answers


def _check_http(answers: list[Any], per_body: int) -> None:
    for status, raw in answers:
        if status != 200:
            raise RuntimeError(f"HTTP {status}: {raw[:300]!r}")
        results = json.loads(raw)["results"]
        bad = [r for r in results if r.get("status") != "scheduled"]
        if len(results) != per_body or bad:
            raise RuntimeError(f"unexpected results: {bad[:3] or len(results)}")


def _load(port: int, clients: int, seconds: float, fresh: bool) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "bench.http_load", "--port", str(port)]
    cmd += ["--clients", str(clients), "--seconds", str(seconds)] + (["--fresh"] if fresh else [])
    done = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=300)
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def run(calls: int, batches: int, rounds: int, seconds: float = 5.0) -> dict[str, Any]:
    from adapters.http.api import TimerApi  # noqa: PLC0415  (may be mid-edit)
    from adapters.http.server import HttpServer  # noqa: PLC0415

    spent = {"library_1": 0.0, "library_256": 0.0, "http_1": 0.0, "http_256": 0.0}
    done = dict.fromkeys(spent, 0)
    progress = Progress("http_api: rounds", rounds)
    with tempfile.TemporaryDirectory(
        prefix="nereus-bench-", dir=os.environ.get("NEREUS_BENCH_DIR")
    ) as root:
        nereus = Nereus.open(root, assume_clock_error_ms=1.0)
        nereus.start()
        server = HttpServer(TimerApi(nereus), "127.0.0.1", 0)
        server.start()
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
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
                bodies_1 = [_body(f"h1-{r}", i, 1) for i in range(per_round_calls)]
                elapsed, answers = _post_all(conn, bodies_1)
                spent["http_1"] += elapsed
                done["http_1"] += per_round_calls
                _check_http(answers, 1)
                bodies_256 = [
                    _body(f"h256-{r}", b * BATCH, BATCH) for b in range(per_round_batches)
                ]
                elapsed, answers = _post_all(conn, bodies_256)
                spent["http_256"] += elapsed
                done["http_256"] += per_round_batches * BATCH
                _check_http(answers, BATCH)
                progress.update(r + 1)
            keep_alive = _load(server.port, 64, seconds, fresh=False)
            burst = _load(server.port, 500, seconds, fresh=True)
        finally:
            conn.close()
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
    print(
        f"library one per call {r['library_1_per_s']:>8,}/s   HTTP batch 1   "
        f"{r['http_1_per_s']:>8,}/s   ratio {r['http_1_vs_library_1']:.3f}\n"
        f"library batch 256    {r['library_256_per_s']:>8,}/s   HTTP batch 256 "
        f"{r['http_256_per_s']:>8,}/s   ratio {r['http_256_vs_library_256']:.3f}"
    )
    ka, burst = r["keep_alive_64"], r["connections_500"]
    print(
        f"64 keep-alive clients, batch 1: {ka['per_s']:,} requests/s, p50 {ka['p50_ms']} ms, "
        f"p99 {ka['p99_ms']} ms\n"
        f"500 connections at once: {burst['ok']} of {burst['clients']} answered 200 in "
        f"{burst['elapsed_s']} s (p99 {burst['p99_ms']} ms)"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(r, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
