"""A load client for the HTTP bench, run in a process of its own so its work does not share
the server's interpreter lock: many concurrent connections on one asyncio loop, each sending
pre-encoded batch-1 POSTs, timing every request from its write to its whole answer.

    python -m bench.http_load --port P --clients 64 --seconds 5            # keep-alive
    python -m bench.http_load --port P --clients 500 --fresh                # one request each

Prints one JSON object: requests answered and refused, elapsed seconds, latency percentiles.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any


def _request(key: str) -> bytes:
    body = json.dumps(
        {"operations": [{"op": "schedule", "queue": "load", "timerKey": key, "delayMs": 3_600_000}]}
    ).encode()
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


async def _keep_alive(port: int, client: int, until: float, out: list[tuple[float, int]]) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        i = 0
        while time.perf_counter() < until:
            request = _request(f"ka-{client}-{i}")
            i += 1
            t = time.perf_counter()
            writer.write(request)
            status = await _answer(reader)
            out.append((time.perf_counter() - t, status))
    finally:
        writer.close()


async def _fresh(port: int, client: int, out: list[tuple[float, int]]) -> None:
    t = time.perf_counter()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(_request(f"fresh-{client}-{time.time_ns()}"))
            status = await asyncio.wait_for(_answer(reader), 30)
        finally:
            writer.close()
    except (OSError, TimeoutError, asyncio.IncompleteReadError):
        status = 0
    out.append((time.perf_counter() - t, status))


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


async def run(port: int, clients: int, seconds: float, fresh: bool) -> dict[str, Any]:
    out: list[tuple[float, int]] = []
    started = time.perf_counter()
    if fresh:
        await asyncio.gather(*(_fresh(port, c, out) for c in range(clients)))
    else:
        until = started + seconds
        await asyncio.gather(*(_keep_alive(port, c, until, out) for c in range(clients)))
    elapsed = time.perf_counter() - started
    latencies = [took for took, _ in out]
    return {
        "clients": clients,
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
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--fresh", action="store_true", help="one request per new connection")
    args = p.parse_args(argv)
    print(json.dumps(asyncio.run(run(args.port, args.clients, args.seconds, args.fresh))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
