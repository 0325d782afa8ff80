"""A supervised process never outlives its supervisor: the lifeline (`adapters.compose.lifeline`),
without a broker. The other guard of the rule is the Kafka-mode supervisor test in
`tests/adapters/kafka/test_kafka_processes.py`.

The rule, as written: once no process holds the lifeline's write end, every process holding
its read end either refuses to start (the supervisor was gone before it looked) or stops as
on SIGTERM, and is ended anyway if that stop is not over `exit_after_s` later. The parent
here is a stand-in (`tests.support.lifeline_worker`) that sets no parent-death signal, so the pipe
is
the only link under test.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nereus.adapters.compose.lifeline import (
    follow_supervisor,
    lifeline_pipe,
    supervisor_gone,
)
from nereus.adapters.compose.processes import Child
from nereus.runtime.log import Logger
from tests.support.lifeline_worker import STUCK_EXIT_AFTER_S, pipe_ends
from tests.support.serve_process import json_events
from tests.support.worker_process import gone

ROOT = Path(__file__).resolve().parents[3]
# A loaded CI machine starts a Python service in seconds, not tens of seconds.
START_TIMEOUT_S = float(os.environ.get("NEREUS_LIFELINE_START_TIMEOUT_S", "60"))
# The serve processes here run with the default --stop-timeout-s (30 s): an orderly stop of
# an idle embedded service takes well under a second, so this bound is about the link.
STOP_TIMEOUT_S = float(os.environ.get("NEREUS_LIFELINE_STOP_TIMEOUT_S", "20"))


def _wait(predicate: Any, timeout_s: float, what: str, log: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}: {tail}")


@pytest.fixture
def parent(tmp_path: Path) -> Iterator[Any]:
    """Start the stand-in supervisor in a mode; yields (its Popen, its child's pid). Kills
    both at the end, whatever the test did."""
    started: list[tuple[subprocess.Popen[bytes], int]] = []

    def start(mode: str) -> tuple[subprocess.Popen[bytes], int]:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.support.lifeline_worker", mode, str(tmp_path)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
        )
        assert proc.stdout is not None
        child = int(proc.stdout.readline())
        started.append((proc, child))
        return proc, child

    yield start
    for proc, child in started:
        proc.kill()
        proc.wait()
        if not gone(child):
            os.kill(child, signal.SIGKILL)


def test_a_served_process_stops_as_on_sigterm_when_its_supervisor_is_killed(
    parent: Any, tmp_path: Path
) -> None:
    log = tmp_path / "child.log"
    sup, child = parent("serve")
    _wait(
        lambda: any(e["event"] == "serving" for e in json_events(log)),
        START_TIMEOUT_S,
        "serving",
        log,
    )
    # The child holds the read end of its supervisor's lifeline, never the write end. (The
    # supervisor holds both ends of it alone; its stdout is a pipe it writes to.)
    lifelines = {inode for inode, ends in pipe_ends(sup.pid).items() if ends == {"r", "w"}}
    assert len(lifelines) == 1
    assert {inode: ends for inode, ends in pipe_ends(child).items() if inode in lifelines} == {
        lifelines.pop(): {"r"}
    }

    sup.kill()  # SIGKILL: it runs no code of its own to stop its child
    sup.wait()
    _wait(lambda: gone(child), STOP_TIMEOUT_S, "the child to stop", log)
    events = [e["event"] for e in json_events(log)]
    assert events.index("supervisor_gone") < events.index("stopped")
    # The orderly stop, as on SIGTERM: it logs how long it took (a timed-out one does not).
    stopped = [e for e in json_events(log) if e["event"] == "stopped"]
    assert len(stopped) == 1 and "took_ms" in stopped[0], stopped
    assert "stop_timeout" not in events


def test_a_process_whose_supervisor_died_before_it_looked_refuses_to_serve(
    parent: Any, tmp_path: Path
) -> None:
    log = tmp_path / "child.log"
    sup, child = parent("late")
    sup.kill()
    sup.wait()  # reaped: only now does the child's shell start `nereus serve`
    _wait(lambda: gone(child), START_TIMEOUT_S, "the child to refuse", log)
    events = json_events(log)
    refused = [e for e in events if e["event"] == "refused"]
    assert len(refused) == 1 and "the supervisor is gone" in refused[0]["detail"], events
    assert not [e for e in events if e["event"] in ("serving", "supervisor_gone")]


def test_a_process_whose_stop_never_ends_is_ended_anyway(parent: Any, tmp_path: Path) -> None:
    log = tmp_path / "child.log"
    sup, child = parent("stuck")
    _wait(lambda: "watching" in log.read_text(), START_TIMEOUT_S, "the watch", log)
    sup.kill()
    sup.wait()
    killed_at = time.monotonic()
    _wait(lambda: gone(child), STOP_TIMEOUT_S, "the child to be ended", log)
    assert time.monotonic() - killed_at >= STUCK_EXIT_AFTER_S
    assert [e["event"] for e in json_events(log)] == ["supervisor_gone", "stop_timeout"]


def test_a_started_process_holds_the_read_end_alone(tmp_path: Path) -> None:
    """`Child.start`, as the supervisor calls it: the socket and the lifeline's read end are
    passed, the write end (and every other descriptor of the parent) is not."""
    read_fd, write_fd = lifeline_pipe()
    spare_read_fd, spare_write_fd = os.pipe2(0)  # inheritable: only close_fds keeps it out
    sock = socket.create_server(("127.0.0.1", 0))
    sock.set_inheritable(True)
    argv = ["serve", "--data", str(tmp_path / "d"), "--http-fd", str(sock.fileno())]
    argv += ["--assume-clock-error-ms", "5"]
    argv += ["--supervisor-fd", str(read_fd)]
    child = Child(0, argv, sock.fileno(), read_fd, dict(os.environ))
    try:
        child.start()
        assert child.proc is not None
        ends = pipe_ends(child.proc.pid)
        lifeline = os.fstat(read_fd).st_ino
        spare = os.fstat(spare_read_fd).st_ino
        assert ends.get(lifeline) == {"r"} and spare not in ends, ends
    finally:
        if child.proc is not None:
            child.proc.kill()
            child.proc.wait()
        for fd in (read_fd, write_fd, spare_read_fd, spare_write_fd):
            os.close(fd)
        sock.close()


class _Watcher:
    """One process's view of the lifeline, in this process: its stop and exit recorded."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.stops = 0
        self.exits: list[int] = []
        self.done = threading.Event()
        self.started: bool | None = None

    def stop(self) -> None:
        self.stops += 1

    def exit(self, code: int) -> None:
        self.exits.append(code)
        self.done.set()

    def follow(self) -> None:
        self.started = follow_supervisor(self.fd, self.stop, 0.01, Logger(), self.exit)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(watchers=st.integers(1, 4), closed_after=st.integers(0, 4), readers_first=st.booleans())
def test_no_watcher_misses_the_end_of_its_supervisor(
    watchers: int, closed_after: int, readers_first: bool
) -> None:
    read_fd, write_fd = lifeline_pipe()
    # Each process has its own copy of the read end, made before or after the write end goes.
    fds = [os.dup(read_fd) for _ in range(watchers)] if readers_first else []
    assert not supervisor_gone(read_fd)
    views: list[_Watcher] = []
    for i in range(watchers):
        if i == closed_after:
            os.close(write_fd)
        view = _Watcher(fds[i] if readers_first else os.dup(read_fd))
        view.follow()
        views.append(view)
    if closed_after >= watchers:
        assert not any(v.done.wait(0.05) for v in views), "stopped while the supervisor lives"
        os.close(write_fd)
    try:
        assert supervisor_gone(read_fd)
        for i, view in enumerate(views):
            if i >= closed_after:  # looked after the end: refused, nothing watched
                assert view.started is False and view.stops == 0
            else:
                assert view.started is True
                assert view.done.wait(10), f"watcher {i} missed the end"
                assert (view.stops, view.exits) == (1, [1])
    finally:
        for fd in [read_fd, *(v.fd for v in views)]:
            os.close(fd)
