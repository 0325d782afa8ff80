"""`nereus serve` on a host clock that cannot bound true time: refused at start unless told
how, and not ready while it runs so (specs/http.md, specs/time.md).

Each process runs on a host clock report the test chooses (`tests.support.host_clock_shim`), never
this machine's: `unsynchronised` (adjtimex says STA_UNSYNC), `no_reading` (no adjtimex) or
`synchronised:US`. The rules, written from the spec: without `--assume-clock-error-ms` or
`--allow-unbounded-clock` the process exits 2 before it opens its store or contacts a
broker, with one `refused` log line (`reason: clock_unbounded`, what was measured) and a
message for a person naming both flags; with `--allow-unbounded-clock` it serves, `/healthz`
is 200, `/readyz` is 503 `clock_unbounded` and a due timer's peek says `clock_unbounded`;
with an assumed error, or on a synchronised host, `/readyz` is 200.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.support.host_clock_shim import ENV
from tests.support.serve_process import ROOT, free_port, serve, stop, wait_serving

REFUSAL_TIMEOUT_S = 30


def _refused(
    argv: list[str], host_clock: str
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    done = subprocess.run(
        [sys.executable, "-m", "tests.support.host_clock_shim", "serve", *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=REFUSAL_TIMEOUT_S,
        env={**os.environ, "PYTHONPATH": str(ROOT), ENV: host_clock},
        check=False,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    docs = [json.loads(line) for line in done.stderr.splitlines() if line.startswith("{")]
    (refused,) = [d for d in docs if d["event"] == "refused"]
    return done, refused


def _human(stderr: str) -> str:
    return "\n".join(line for line in stderr.splitlines() if not line.startswith("{"))


@pytest.mark.parametrize(
    ("host_clock", "measured"),
    [
        ("unsynchronised", "adjtimex says unsynchronised"),
        ("no_reading", "adjtimex gave no reading"),
    ],
)
def test_serve_refuses_to_start_without_a_bound(
    tmp_path: Path, host_clock: str, measured: str
) -> None:
    data = tmp_path / "data"
    done, refused = _refused(
        ["--data", str(data), "--http", f"127.0.0.1:{free_port()}"], host_clock
    )
    assert refused["reason"] == "clock_unbounded" and refused["measured"] == measured
    human = _human(done.stderr)
    assert measured in human
    assert "--assume-clock-error-ms" in human and "--allow-unbounded-clock" in human
    assert not data.exists(), "refused before opening the store"


@pytest.mark.parametrize("processes", ["1", "2"])
def test_kafka_mode_refuses_before_contacting_a_broker(tmp_path: Path, processes: str) -> None:
    argv = ["--kafka", "127.0.0.1:1", "--data", str(tmp_path / "data"), "--processes", processes]
    argv += ["--http", f"127.0.0.1:{free_port()}"]
    done, refused = _refused(argv, "unsynchronised")  # nothing listens at 127.0.0.1:1
    assert refused["reason"] == "clock_unbounded"
    assert "--allow-unbounded-clock" in _human(done.stderr)


def _http(port: int, method: str, path: str, body: object = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return int(resp.status), json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def _settled(port: int, want: list[str]) -> tuple[int, Any]:
    """/readyz once its reasons are `want` (start-up's own recovery may show first)."""
    deadline = time.monotonic() + 10
    while True:
        status, doc = _http(port, "GET", "/readyz")
        if [r["code"] for r in doc.get("reasons", [])] == want or time.monotonic() > deadline:
            return status, doc
        time.sleep(0.05)


def test_allowed_unbounded_clock_serves_but_is_not_ready(tmp_path: Path) -> None:
    proc, port = serve(
        tmp_path / "data",
        "--allow-unbounded-clock",
        clock_error_ms=None,
        host_clock="unsynchronised",
    )
    try:
        lines = wait_serving(proc)
        (warned,) = [r for r in lines if r["event"] == "clock_unbounded"]
        assert warned["measured"] == "adjtimex says unsynchronised"
        assert _http(port, "GET", "/healthz")[0] == 200, "liveness is not readiness"
        status, doc = _settled(port, ["clock_unbounded"])
        assert status == 503 and doc["ready"] is False
        assert [r["code"] for r in doc["reasons"]] == ["clock_unbounded"]
        op = {"op": "schedule", "queue": "q", "timerKey": "k", "delayMs": 0}
        status, doc = _http(port, "POST", "/api/v1/timers", {"operations": [op]})
        assert status == 200 and doc["results"][0]["status"] == "scheduled", doc
        status, doc = _http(port, "GET", "/api/v1/timers/q/k")
        assert status == 200 and doc["status"] == "SCHEDULED"
        assert doc["lastError"] == "clock_unbounded"
    finally:
        stop(proc)


@pytest.mark.parametrize(
    ("host_clock", "clock_error_ms"), [("unsynchronised", 5), ("synchronised:2000", None)]
)
def test_a_bounded_clock_is_ready(
    tmp_path: Path, host_clock: str, clock_error_ms: int | None
) -> None:
    proc, port = serve(tmp_path / "data", clock_error_ms=clock_error_ms, host_clock=host_clock)
    try:
        lines = wait_serving(proc)
        assert "clock_unbounded" not in [r["event"] for r in lines]
        assert _settled(port, []) == (200, {"ready": True})
    finally:
        stop(proc)
