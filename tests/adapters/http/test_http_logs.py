"""The service's logs are JSON lines, every one of them, through bursts, client disconnects
and hostile input (the old server's stderr was mostly `BrokenPipeError` tracebacks, some
interleaved mid-line); and the library's records reach the standard `logging` module."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from pathlib import Path

import pytest

from nereus.adapters.local.embedded import Nereus
from tests.support.serve_process import serve, stop, wait_serving

BODY = b'{"operations":[{"op":"schedule","queue":"q","timerKey":"k%d","delayMs":60000}]}'


def _post(i: int) -> bytes:
    body = BODY % i
    return b"POST /api/v1/timers HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (
        len(body),
        body,
    )


def _abuse(port: int) -> None:
    """Requests whose clients hang up at every stage, plus a burst of ordinary ones."""
    for i in range(40):
        with socket.create_connection(("127.0.0.1", port)) as s:
            match i % 5:
                case 0:  # hung up mid-head
                    s.sendall(b"GET /healthz HTT")
                case 1:  # hung up mid-body
                    s.sendall(_post(i)[:-10])
                case 2:  # hung up before reading the answer, with a reset
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00" * 2)
                    s.sendall(_post(i))
                case 3:  # garbage
                    s.sendall(b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03" * 20)
                case _:  # an ordinary request, answered
                    s.sendall(_post(i))
                    s.recv(65536)

    def burst(n: int) -> None:
        for j in range(20):
            with socket.create_connection(("127.0.0.1", port)) as s:
                s.sendall(_post(1000 * n + j))
                s.recv(65536)

    threads = [threading.Thread(target=burst, args=(n,)) for n in range(1, 9)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def test_every_line_the_service_writes_is_one_json_object(tmp_path: Path) -> None:
    proc, port = serve(tmp_path / "data")
    assert proc.stderr is not None
    stderr = proc.stderr
    lines: list[str] = []
    # Read as it comes: a full pipe would block the service's logging.
    reader = threading.Thread(target=lambda: lines.extend(stderr))
    try:
        wait_serving(proc)
        reader.start()
        _abuse(port)
        time.sleep(0.5)
    finally:
        stop(proc)
    reader.join(30)
    records = [json.loads(line) for line in lines]  # raises on any line that is not JSON
    assert all(isinstance(r, dict) and {"ts", "level", "event"} <= set(r) for r in records)
    assert not [r for r in records if "traceback" in r], "a traceback was logged"
    # A client that hangs up is not the app failing (a reset before the lingering close
    # made shutdown(SHUT_WR) raise inside the app's send).
    failed = [r for r in records if r["event"] == "http_app_failed"]
    assert not failed, json.dumps(failed)
    access = [r for r in records if r["event"] == "http_request"]
    assert len(access) >= 160 and {r["status"] for r in access} <= {200, 400}
    assert any(r["event"] == "http_refused" for r in records)
    assert records[-1]["event"] == "stopped"


def test_a_credential_in_the_query_never_reaches_the_access_log(tmp_path: Path) -> None:
    """A credential sent in the query (refused where the API checks credentials, ignored
    here, where it does not) is logged with its request's target: the value is written
    `[redacted]`, under any spelling of the name (issue 31)."""
    targets = {
        "/api/v1/timers/q/k?access_token=S3CRET-A": "/api/v1/timers/q/k?access_token=[redacted]",
        "/api/v1/timers/q?after=a&TOKEN=S3CRET-B": "/api/v1/timers/q?after=a&TOKEN=[redacted]",
        "/healthz?api-key=S3CRET-C&x=1": "/healthz?api-key=[redacted]&x=1",
        "/api/v1/timers/q?password=S3CRET-D;sig=S3CRET-E": (
            "/api/v1/timers/q?password=[redacted];sig=[redacted]"
        ),
        "/api/v1/timers/q?after=a&limit=5": "/api/v1/timers/q?after=a&limit=5",
    }
    proc, port = serve(tmp_path / "data")
    assert proc.stderr is not None
    try:
        wait_serving(proc)
        for target in targets:
            with socket.create_connection(("127.0.0.1", port)) as s:
                s.sendall(f"GET {target} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
                s.recv(65536)
    finally:
        stop(proc)
    text = proc.stderr.read()
    assert "S3CRET" not in text
    logged = [json.loads(line) for line in text.splitlines()]
    access = [r["target"] for r in logged if r["event"] == "http_request"]
    assert access == list(targets.values())


def test_the_library_logs_through_the_logging_module(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="nereus")
    with Nereus.open(str(tmp_path), assume_clock_error_ms=3):
        pass
    (record,) = [r for r in caplog.records if r.getMessage() == "clock_error_assumed"]
    assert record.name == "nereus" and record.levelno == logging.WARNING
    assert record.fields == {"error_bound_ms": 3.0}  # type: ignore[attr-defined]
