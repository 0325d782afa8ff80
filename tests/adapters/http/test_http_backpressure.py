"""Backpressure at the HTTP edge, against the real server (issue 31, item 1):

* four pipelining floods that never read cannot grow the server's memory past a bound or
  slow a well-behaved client past its budget;
* a pipelining client that reads gets every answer, in order, while the server pauses and
  resumes reading under it;
* a client that takes none of its answers is read no further once they back up, and is
  dropped after the keep-alive timeout; one that takes them slowly is served in full.

The flood runs `nereus serve` as a child process so its resident memory can be read from
/proc (VmRSS). Its length comes from the environment; the default is long enough for the
old protocol (which read a pipelining client's input as fast as it came) to grow by more
than the bound and to slow a well-behaved client far past its budget:

    NEREUS_FLOOD_S=10   NEREUS_PIPELINE_N=20000

The inbox the bound lives in is tested on its own, without sockets, in `test_http_inbox`.
"""

from __future__ import annotations

import io
import json
import os
import socket
import statistics
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import pytest

from tests.support.http_harness import QUEUE, Service, config, read_reply, schedule, start_service
from tests.support.serve_process import serve, stop, wait_serving

FLOOD_S = float(os.environ.get("NEREUS_FLOOD_S", "10"))
PIPELINE_N = int(os.environ.get("NEREUS_PIPELINE_N", "20000"))
FLOODERS = 4
# Requests per write of a flooder: the probe that found the fault wrote 500 at a time.
FLOOD_BATCH = 500
# The bounds the issue sets: growth of the server's RSS over its level before the flood,
# and the 99th percentile of a well-behaved client's requests meanwhile.
RSS_GROWTH_MAX_BYTES = 64 * 1024 * 1024
GOOD_P99_MAX_S = 0.100
# On a machine busy with other work (CI, the suite's other workers) the client's requests
# are slower with or without a flood; the budget then grows with the p99 the same client
# measured just before the flood, in this run. The old protocol slowed it 20-100-fold (p50
# 0.25-1.2 s against ~10 ms), far past either bound.
LOADED_P99_FACTOR = 3.0
HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
AUTH = b"Authorization: Bearer acme-all\r\n"


def _rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


@dataclass
class _Flood:
    """Raw sockets writing pipelined requests and never reading; a reset connection is
    replaced by a new one, as a hostile client would."""

    port: int
    deadline: float
    pushed_bytes: list[int] = field(default_factory=lambda: [0] * FLOODERS)
    connections: list[int] = field(default_factory=lambda: [0] * FLOODERS)

    def run(self, i: int) -> None:
        chunk = HEALTHZ * FLOOD_BATCH
        while time.monotonic() < self.deadline:
            try:
                sock = socket.create_connection(("127.0.0.1", self.port), timeout=5)
            except OSError:
                time.sleep(0.05)
                continue
            self.connections[i] += 1
            sock.settimeout(0.2)
            try:
                self._push(i, sock, chunk)
            except OSError:
                pass  # reset by the server: connect again
            finally:
                sock.close()

    def _push(self, i: int, sock: socket.socket, chunk: bytes) -> None:
        at = 0
        while time.monotonic() < self.deadline:
            try:
                sent = sock.send(chunk[at:])
            except TimeoutError:
                continue  # the server is not reading: keep offering
            self.pushed_bytes[i] += sent
            at = (at + sent) % len(chunk)


@dataclass
class _Good:
    """One keep-alive connection, one GET /healthz at a time, each answer timed."""

    port: int
    deadline: float
    took_s: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    def run(self) -> None:
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=30)
        try:
            while time.monotonic() < self.deadline:
                started = time.perf_counter()
                sock.sendall(HEALTHZ)
                reply = read_reply(sock)
                self.took_s.append(time.perf_counter() - started)
                if reply.status != 200:
                    self.failures.append(f"{reply.status} {reply.body[:100]!r}")
                time.sleep(0.005)
        except OSError as exc:
            self.failures.append(repr(exc))
        finally:
            sock.close()


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], int]]:
    proc, port = serve(tmp_path / "data")
    wait_serving(proc)
    stderr = proc.stderr
    assert stderr is not None
    # The access log writes a line per answer: a full pipe would stall the server.
    drain = threading.Thread(target=lambda: all(True for _ in stderr), daemon=True)
    drain.start()
    try:
        yield proc, port
    finally:
        stop(proc)
        drain.join(10)


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def test_pipelining_floods_that_never_read_hold_bounded_memory_and_slow_nobody(
    served: tuple[subprocess.Popen[str], int],
) -> None:
    proc, port = served
    warm = _Good(port, time.monotonic() + 1.0)
    warm.run()  # the allocator and the code paths of an answer, before the baseline
    quiet = _Good(port, time.monotonic() + 1.0)
    quiet.run()  # the same client's requests without a flood, on this machine, now
    time.sleep(0.5)
    before = _rss_bytes(proc.pid)
    deadline = time.monotonic() + FLOOD_S
    flood = _Flood(port, deadline)
    good = _Good(port, deadline)
    threads = [threading.Thread(target=flood.run, args=(i,)) for i in range(FLOODERS)]
    threads.append(threading.Thread(target=good.run))
    peak = before
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        peak = max(peak, _rss_bytes(proc.pid))
        time.sleep(0.1)
    for t in threads:
        t.join()
    closed_at = time.monotonic()
    while time.monotonic() < closed_at + 2.0:  # what is left once the floods are gone
        peak = max(peak, _rss_bytes(proc.pid))
        time.sleep(0.1)
    after = _rss_bytes(proc.pid)
    mib = 1024 * 1024
    figures = (
        f"RSS before {before / mib:.1f} MiB, peak {peak / mib:.1f} MiB, "
        f"2 s after {after / mib:.1f} MiB; flood pushed {sum(flood.pushed_bytes) / mib:.1f} MiB "
        f"over {sum(flood.connections)} connections in {FLOOD_S:.0f} s; good client "
        f"{len(good.took_s)} requests, p50 {statistics.median(good.took_s) * 1000:.1f} ms, "
        f"p99 {_percentile(good.took_s, 0.99) * 1000:.1f} ms, "
        f"max {max(good.took_s) * 1000:.1f} ms; without the flood p99 "
        f"{_percentile(quiet.took_s, 0.99) * 1000:.1f} ms"
    )
    print(figures)
    assert not good.failures, good.failures[:5]
    assert peak - before <= RSS_GROWTH_MAX_BYTES, figures
    budget_s = max(GOOD_P99_MAX_S, LOADED_P99_FACTOR * _percentile(quiet.took_s, 0.99))
    assert _percentile(good.took_s, 0.99) <= budget_s, f"{figures}; budget {budget_s * 1000:.1f} ms"
    assert proc.poll() is None, "the server died under the flood"


# A client that reads its answers ---------------------------------------------------------------


@pytest.fixture
def svc(tmp_path: Path) -> Iterator[Service]:
    with start_service(tmp_path / "data", config()) as s:
        yield s


KEYS = [f"pipe-{i}" for i in range(50)]


def _requests(n: int) -> Iterator[tuple[bytes, str]]:
    """The i-th request and what its answer must name: peeks of known keys (the answer
    names the key), health checks, and every 97th a POST with a body (a durable commit, so
    the server holds it a while and unread input piles up behind it)."""
    for i in range(n):
        if i % 97 == 0:
            body = json.dumps({"operations": [schedule(f"posted-{i}")]}).encode()
            head = f"POST /api/v1/timers HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
            yield head.encode() + AUTH + b"\r\n" + body, f'"timerKey":"posted-{i}"'
        elif i % 10 == 0:
            yield HEALTHZ, '"ok":true'
        else:
            key = KEYS[i % len(KEYS)]
            line = f"GET /api/v1/timers/{QUEUE}/{key} HTTP/1.1\r\nHost: x\r\n"
            yield line.encode() + AUTH + b"\r\n", f'"timerKey":"{key}"'


def _next_answer(stream: BinaryIO) -> tuple[int, bytes]:
    """One answer from a buffered stream, leaving the next one's bytes in the buffer."""
    status_line = stream.readline()
    assert status_line.startswith(b"HTTP/1.1 "), status_line
    length = 0
    while (line := stream.readline()) not in (b"\r\n", b""):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    return int(status_line.split()[1]), stream.read(length)


def test_a_pipelining_client_that_reads_gets_every_answer_in_order(svc: Service) -> None:
    svc.post(*(schedule(key) for key in KEYS))
    expected: list[str] = []
    pending = bytearray()
    for data, needle in _requests(PIPELINE_N):
        pending += data
        expected.append(needle)
    errors: list[BaseException] = []
    with socket.create_connection(("127.0.0.1", svc.server.port), timeout=60) as sock:

        def write() -> None:
            try:
                sock.sendall(pending)  # all of it at once: the server must pause us
            except BaseException as exc:
                errors.append(exc)

        writer = threading.Thread(target=write)
        writer.start()
        answers: list[bytes] = []
        stream = sock.makefile("rb")
        for i in range(PIPELINE_N):
            status, body = _next_answer(stream)
            assert status == 200, (i, status, body[:200])
            answers.append(body)
            if i % 1000 == 500:
                time.sleep(0.3)  # a reader that lags: the answers back up in the server
        writer.join(60)
    assert not errors, errors
    # Answer i is request i's: nothing lost, nothing reordered, nothing answered twice.
    wrong = [
        (i, needle, body[:120])
        for i, (needle, body) in enumerate(zip(expected, answers, strict=True))
        if needle.encode() not in body.replace(b" ", b"")
    ]
    assert not wrong, wrong[:5]


# A client that takes none of its answers -------------------------------------------------------

OPENAPI = b"GET /openapi.json HTTP/1.1\r\nHost: x\r\n\r\n"
DROP_TIMEOUT_S = 3.0  # the keep-alive timeout of the service under test
STALL_S = 1.0  # offered input not taken for this long: the server stopped reading
STALL_DEADLINE_S = 30.0


def _answered(svc: Service, route: str) -> int:
    text = svc.call("GET", "/metrics", token=None).body.decode()
    prefix = f'nereus_http_requests_total{{route="{route}",status="200"}} '
    return sum(
        int(float(line[len(prefix) :])) for line in text.splitlines() if line.startswith(prefix)
    )


def _tcp_max_send_buffer_bytes() -> int:
    with open("/proc/sys/net/ipv4/tcp_wmem") as f:
        return int(f.read().split()[2])


def test_a_client_that_takes_no_answers_is_read_no_further_and_then_dropped(
    tmp_path: Path,
) -> None:
    """Pipelined requests for a 39 KB document, never read: once the answers fill the
    socket buffers and the transport's high-water mark, the server starts no new request
    and reads nothing more; the client's offered bytes stop being taken. After the
    keep-alive timeout it is dropped. The old protocol kept reading (and answering) for as
    long as the client kept sending."""
    doc = config()
    doc["server"] = {"keep_alive_timeout_s": DROP_TIMEOUT_S}
    with start_service(tmp_path / "data", doc) as svc:
        answer_bytes = len(svc.call("GET", "/openapi.json", token=None).body)
        before = _answered(svc, "GET /openapi.json")
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        # A small receive buffer, set before connecting so the kernel keeps it: what the
        # server can write before its own buffers fill is then known.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8192)
        sock.connect(("127.0.0.1", svc.server.port))
        sock.settimeout(0.2)
        chunk, at, pushed = OPENAPI * 100, 0, 0
        started = last_taken = time.monotonic()
        try:
            while time.monotonic() - last_taken < STALL_S:
                assert time.monotonic() - started < STALL_DEADLINE_S, (
                    f"the server kept reading: {pushed} bytes taken"
                )
                try:
                    sent = sock.send(chunk[at:])
                except TimeoutError:
                    continue
                pushed += sent
                at = (at + sent) % len(chunk)
                last_taken = time.monotonic()
            answered = _answered(svc, "GET /openapi.json") - before
            print(f"stalled after {pushed} bytes taken, {answered} answers written")
            # The answers it wrote fit in the client's receive buffer, the server socket's
            # send buffer and the transport's buffer (its high-water mark, 64 KiB, plus the
            # answer that crossed it), and one more request may have been in hand.
            buffers = sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
            buffers += _tcp_max_send_buffer_bytes() + 64 * 1024 + answer_bytes
            assert 0 < answered <= buffers // answer_bytes + 2, (answered, pushed)
            time.sleep(DROP_TIMEOUT_S + 1.0)
            assert _answered(svc, "GET /openapi.json") - before == answered
            # Reset: the server dropped it (a send that times out is a connection kept).
            with pytest.raises((ConnectionResetError, BrokenPipeError)):
                for _ in range(100):
                    sock.send(chunk)
        finally:
            sock.close()


SLOW_READ_BYTES = 4096
SLOW_READ_EVERY_S = 0.1  # about 40 KB/s: a transport buffer of answers takes ~2 s to drain
SLOW_ANSWERS = 6


class _SlowReader(io.RawIOBase):
    """A socket read a few KB at a time, with a pause before each read."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        time.sleep(SLOW_READ_EVERY_S)
        return self.sock.recv_into(buffer, min(len(buffer), SLOW_READ_BYTES))


def test_a_client_that_takes_its_answers_slowly_is_served_in_full(tmp_path: Path) -> None:
    """Writing pauses for longer than the keep-alive timeout while the client reads, slowly:
    it is taking its answers, so it is not dropped, and every one arrives whole."""
    doc = config()
    doc["server"] = {"keep_alive_timeout_s": 0.5}
    with start_service(tmp_path / "data", doc) as svc:
        expected = svc.call("GET", "/openapi.json", token=None).body
        # Small socket buffers on both sides (accepted sockets inherit the listener's), so
        # the transport's own buffer fills at once instead of after megabytes.
        svc.server.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 16384)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8192)
            sock.connect(("127.0.0.1", svc.server.port))
            sock.settimeout(30)
            sock.sendall(OPENAPI * SLOW_ANSWERS)
            stream = io.BufferedReader(_SlowReader(sock), SLOW_READ_BYTES)
            answers = [_next_answer(stream) for _ in range(SLOW_ANSWERS)]
    assert answers == [(200, expected)] * SLOW_ANSWERS
