"""Crash consistency against real LMDB and a real SIGKILL.

A worker process (`tests/support/crash_worker.py`) appends and applies seeded random batches
forever.
The test kills it at a seeded random moment (0.05-0.6 s after it reports ready, so the kill
lands among appends, folds and commits rather than in interpreter start-up), reopens the
store and checks that it equals the replay of its own log up to the applied position: no
batch is half-applied, the log is dense, persistence times never go backwards, payload bytes
are neither lost nor leaked and the lane index matches the timeline. Then it starts a new
worker on the same directory, so every iteration also tests resuming after a crash.
`NEREUS_CRASH_ITERATIONS` sets the number of kills and `NEREUS_CRASH_SEED` replays a failing
run's kill schedule (the seed is in every assertion message; a fixed default, `random` draws
one). Where a kill lands still depends on the machine's speed: the crash windows between the
store's steps are tested deterministically in `tests/storage/test_storage_steps.py`.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.support.crash_worker import check_reopened
from tests.support.seeds import seed_from_env
from tests.support.worker_process import wait_ready

ROOT = Path(__file__).resolve().parents[2]
ITERATIONS = int(os.environ.get("NEREUS_CRASH_ITERATIONS", "12"))
READY_TIMEOUT_S = 20.0


def _seed() -> int:
    # A fixed default (the seed of the run RELIABILITY.md reports); `random` draws one.
    return seed_from_env("NEREUS_CRASH_SEED", 3991063131)


def _start_worker(path: Path, seed: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.support.crash_worker", str(path), str(seed)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def _check_store(path: Path, where: str) -> int:
    return check_reopened(str(path), where)


def test_sigkill_at_random_moments_leaves_the_replay_of_the_durable_log(tmp_path: Path) -> None:
    seed = _seed()
    rng = random.Random(seed)
    path = tmp_path / "shard"
    applied_after: list[int] = []
    for iteration in range(ITERATIONS):
        where = f"seed={seed} iteration={iteration} (rerun with NEREUS_CRASH_SEED={seed})"
        proc = _start_worker(path, seed * 1_000 + iteration)
        try:
            wait_ready(proc, where, READY_TIMEOUT_S)
            time.sleep(rng.uniform(0.05, 0.6))
            # A worker that died by itself would make the kill meaningless.
            assert proc.poll() is None, f"{where}: worker exited early: {proc.communicate()}"
            proc.send_signal(signal.SIGKILL)
            _, err = proc.communicate(timeout=10)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert proc.returncode == -signal.SIGKILL, f"{where}: {err.decode()}"
        applied_after.append(_check_store(path, where))
    print(f"seed={seed} applied after each kill: {applied_after}")
    # The kills must have landed in the middle of real work, not before it started.
    assert applied_after[-1] > 0, f"seed={seed}: the workers never applied anything"
    assert applied_after == sorted(applied_after), f"seed={seed}: applied went backwards"
