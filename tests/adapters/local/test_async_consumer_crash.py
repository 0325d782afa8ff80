"""A process reading deliveries with the async consumer and killed (SIGKILL) before it
commits sees those records again, and loses none.

The queue holds `RECORDS` delivered records. Worker processes
(`tests/support/async_consumer_worker.py`, each another process than the one that wrote the
destination) read it as one group and are killed: at a trap with auto commit (its record
handled, its page of `MAX_BATCH` not committed), at a trap with manual commits every
`COMMIT_EVERY` records, after leaving its loop at a record it did not handle (`break`, then
close: what it handled is committed, that record is not), and at a random point; a last one
reads to the end. The rule, worked out here from the commit rules and not read from the
consumer: a run starts exactly where the group's last commit left it — after an
auto-commit trap at the start of the trap's page (pages are counted from the run's start),
after a manual trap at the last multiple of `COMMIT_EVERY` records handled, after a
`break` at the record it left — so every record handled and not committed is handed out
again, and nothing is skipped; at the end every offset was handled and the group's position
is the queue's end.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from nereus.adapters.local.destination import LocalDestination
from tests.adapters.local.test_async_consumer import fill
from tests.support.async_consumer_worker import COMMIT_EVERY, MAX_BATCH
from tests.support.worker_process import wait_ready

ROOT = Path(__file__).resolve().parents[3]
RECORDS = 600
SEED = int(os.environ.get("NEREUS_ASYNC_CONSUMER_CRASH_SEED", "20261203"))


def _worker(
    data: Path, log: Path, run: int, mode: str, trap: int | None
) -> subprocess.Popen[bytes]:
    argv = [
        sys.executable,
        "-m",
        "tests.support.async_consumer_worker",
        str(data),
        str(log),
        str(run),
        mode,
    ]
    if trap is not None:
        argv.append(str(trap))
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    wait_ready(proc, f"run {run} (seed {SEED})", 60)
    return proc


def _kill(proc: subprocess.Popen[bytes]) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)


def _trapped(proc: subprocess.Popen[bytes]) -> None:
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == b"trap", "the worker ended before its trap"
    _kill(proc)


def _handled(log: Path) -> dict[int, list[int]]:
    text = log.read_text() if log.exists() else ""
    by_run: dict[int, list[int]] = {}
    for line in text[: text.rfind("\n") + 1].splitlines():
        run, offset = line.split()
        by_run.setdefault(int(run), []).append(int(offset))
    return by_run


def test_a_killed_async_consumer_hands_out_again_and_loses_nothing(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    log = tmp_path / "handled.log"
    fill(tmp_path, "q", RECORDS)
    expected_starts = [0]

    # 0: auto commit, killed at a trap: its page was not committed.
    trap = rng.randint(MAX_BATCH + 1, 3 * MAX_BATCH - 2)
    _trapped(_worker(tmp_path, log, 0, "auto", trap))
    expected_starts.append(trap // MAX_BATCH * MAX_BATCH)

    # 1: manual commits every COMMIT_EVERY records, killed at a trap between two commits.
    start = expected_starts[-1]
    trap = start + rng.randint(2 * COMMIT_EVERY + 1, 4 * COMMIT_EVERY - 1)
    assert (trap - start) % COMMIT_EVERY, "the trap must fall between commits"
    _trapped(_worker(tmp_path, log, 1, "manual", trap))
    expected_starts.append(start + (trap - start) // COMMIT_EVERY * COMMIT_EVERY)

    # 2: leaves its loop at a record it did not handle, closes, then is killed.
    trap = expected_starts[-1] + rng.randint(1, 2 * MAX_BATCH)
    _trapped(_worker(tmp_path, log, 2, "break", trap))
    expected_starts.append(trap)

    # 3: auto commit, killed at a random point of its work. Its trap, a page before the end,
    # is only a backstop: on a busy machine the run could otherwise finish every record
    # between two looks at its log and leave run 4 nothing to hand out again.
    proc = _worker(tmp_path, log, 3, "auto", RECORDS - MAX_BATCH - 1)
    deadline = time.monotonic() + 60
    kill_after = rng.randint(30, 150)
    while len(_handled(log).get(3, [])) < kill_after:
        assert proc.poll() is None and time.monotonic() < deadline, "run 3 stopped early"
        time.sleep(0.001)
    _kill(proc)

    # 4: to the end.
    final = _worker(tmp_path, log, 4, "auto", None)
    _, err = final.communicate(timeout=120)
    assert final.returncode == 0, err.decode()[-2000:]

    by_run = _handled(log)
    for run in range(5):
        offsets = by_run[run]
        assert offsets == list(range(offsets[0], offsets[-1] + 1)), f"run {run} skipped one"
    for run, start in enumerate(expected_starts):
        assert by_run[run][0] == start, f"run {run} started at {by_run[run][0]}, not {start}"
    # Each trap's record was handled and not committed: handed out again by the next run.
    assert by_run[1][0] <= by_run[0][-1] and by_run[2][0] <= by_run[1][-1]
    # The record run 2 left unhandled is the first of run 3.
    assert by_run[2][-1] == expected_starts[3] - 1
    # A random kill: run 4 starts within the page run 3 was in, never past what it handled.
    last = by_run[3][-1]
    assert last + 1 - MAX_BATCH <= by_run[4][0] <= last + 1
    assert by_run[4][-1] == RECORDS - 1
    assert set().union(*by_run.values()) == set(range(RECORDS)), "a record was never handled"
    dest = LocalDestination(str(tmp_path / "destination"))
    try:
        assert dest.committed("app", "q") == RECORDS
    finally:
        dest.close()
