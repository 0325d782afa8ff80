"""A load client for the HTTP bench, run in a process of its own so its work does not share
the server's interpreter lock (an HTTP client is another program): asyncio connections
sending pre-encoded schedule POSTs, timing each request from its write to its whole answer.

    python -m bench.http_load --port P --sequence 600 --batch 1   # one connection, in turn
    python -m bench.http_load --port P --clients 64 --seconds 5   # 64 keep-alive connections
    python -m bench.http_load --port P --clients 500 --fresh      # 500 connections at once

Prints one JSON object: requests, answered 200, unanswered, elapsed seconds, rate and
latency percentiles.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Iterable
from typing import Any

Outcome = tuple[float, int]  # (seconds, HTTP status; 0: no answer)


def request(key: str, batch: int = 1, payload: str = "") -> bytes:
    ops = [
        {"op": "schedule", "queue": "load", "timerKey": f"{key}-{i}", "delayMs": 3_600_000}
        | ({"payload": payload} if payload else {})
        for i in range(batch)
    ]
    body = json.dumps({"operations": ops}).encode()
    head = f"POST /api/v1/timers HTTP/1.1\r\nHost: b\r\nContent-Length: {len(body)}\r\n\r\n"
    return head.encode() + body


async def _answer(reader: asyncio.StreamReader) -> int:
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    length = 0
    for line in head.split(b"\r\n"):
        if line[:15].lower() == b"content-length:":
            length = int(line[15:])
    await reader.readexactly(length)
    return status


async def _in_turn(port: int, bodies: Iterable[bytes], out: list[Outcome], until: float) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for body in bodies:
            if time.perf_counter() >= until:
                return
            t = time.perf_counter()
            writer.write(body)
            status = await _answer(reader)
            out.append((time.perf_counter() - t, status))
    finally:
        writer.close()


async def _fresh(port: int, body: bytes, out: list[Outcome]) -> None:
    t = time.perf_counter()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(body)
            status = await asyncio.wait_for(_answer(reader), 30)
        finally:
            writer.close()
    except (OSError, TimeoutError, asyncio.IncompleteReadError):
        status = 0
    out.append((time.perf_counter() - t, status))


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


async def run(args: argparse.Namespace) -> dict[str, Any]:
    out: list[Outcome] = []
    tag = f"{args.prefix}-{time.time_ns()}"
    if args.sequence:
        bodies = [request(f"{tag}-{i}", args.batch, args.payload) for i in range(args.sequence)]
        started = time.perf_counter()
        await _in_turn(args.port, bodies, out, float("inf"))
    elif args.fresh:
        bodies = [request(f"{tag}-{c}", args.batch, args.payload) for c in range(args.clients)]
        started = time.perf_counter()
        await asyncio.gather(*(_fresh(args.port, body, out) for body in bodies))
    else:
        # Enough bodies for any rate this machine reaches; the clock stops each client.
        per_client = 20_000
        started = time.perf_counter()
        until = started + args.seconds

        def stream(c: int) -> Iterable[bytes]:
            return (request(f"{tag}-{c}-{i}", args.batch, args.payload) for i in range(per_client))

        await asyncio.gather(
            *(_in_turn(args.port, stream(c), out, until) for c in range(args.clients))
        )
    elapsed = time.perf_counter() - started
    latencies = [took for took, _ in out]
    return {
        "clients": 1 if args.sequence else args.clients,
        "batch": args.batch,
        "requests": len(out),
        "ok": sum(1 for _, status in out if status == 200),
        "unanswered": sum(1 for _, status in out if status == 0),
        "elapsed_s": round(elapsed, 3),
        "per_s": round(len(out) / elapsed) if elapsed else 0,
        "p50_ms": round(_pct(latencies, 0.50) * 1000, 2),
        "p99_ms": round(_pct(latencies, 0.99) * 1000, 2),
        "max_ms": round(max(latencies, default=0.0) * 1000, 2),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--sequence", type=int, default=0, help="requests on one connection")
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--fresh", action="store_true", help="one request per new connection")
    p.add_argument("--batch", type=int, default=1, help="operations per request")
    p.add_argument("--payload", default="", help="base64 payload of every operation")
    p.add_argument("--prefix", default="load", help="timer key prefix")
    args = p.parse_args(argv)
    print(json.dumps(asyncio.run(run(args))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
