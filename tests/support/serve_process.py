"""`nereus serve` (the embedded service) as a real child process, for black-box tests.

`serve` starts it on a free loopback port with an assumed clock error (so timers fire on a
host whose clock is not reported synchronised), `wait_serving` reads its structured start-up
lines until it says `serving`, and `stop` ends it by SIGTERM (SIGKILL if it does not stop).
`json_events` reads back the JSON log lines a service (of any mode) wrote to a file.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.support.host_clock_shim import ENV

ROOT = Path(__file__).resolve().parents[2]
SERVING_TIMEOUT_S = 30.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve(
    data: Path,
    *args: str,
    port: int | None = None,
    clock_error_ms: int | None = 5,
    host_clock: str | None = None,
) -> tuple[subprocess.Popen[str], int]:
    """Start `nereus serve --data DATA` with `args`; its stderr is a pipe of JSON lines.
    `clock_error_ms` None gives no `--assume-clock-error-ms`; `host_clock` runs it on a host
    clock report of the test's choosing (`tests.support.host_clock_shim`)."""
    port = port or free_port()
    clock = [] if clock_error_ms is None else ["--assume-clock-error-ms", str(clock_error_ms)]
    command = ["nereus"] if host_clock is None else ["tests.support.host_clock_shim"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if host_clock is not None:
        env[ENV] = host_clock
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            *command,
            "serve",
            "--data",
            str(data),
            "--http",
            f"127.0.0.1:{port}",
            *clock,
            *args,
        ],
        cwd=ROOT,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    return proc, port


def wait_serving(
    proc: subprocess.Popen[str], timeout_s: float = SERVING_TIMEOUT_S
) -> list[dict[str, Any]]:
    """The start-up lines up to and including `serving`; kills the process if it never
    serves."""
    assert proc.stderr is not None
    lines: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        lines.append(json.loads(line))
        if lines[-1]["event"] == "serving":
            return lines
    proc.kill()
    raise AssertionError(f"never served: {lines}")


def json_events(path: Path) -> list[dict[str, Any]]:
    """The JSON lines of a log file, in order, skipping other lines (a traceback) and a last
    line still being written; none while the file does not exist yet."""
    if not path.exists():
        return []
    out: list[dict[str, Any]] = []
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return out


def stop(proc: subprocess.Popen[str], timeout_s: float = 30.0) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
