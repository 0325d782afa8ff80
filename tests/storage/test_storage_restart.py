"""Stop the service (SIGTERM or SIGKILL) and start it again on the same data directory, many times.

Issue 15, item 3: after a clean SIGTERM of `nereus serve` (and once after a SIGKILL), 3 of 16
data directories were refused on restart as "truncated", while LMDB read every row of them.
LMDB's newest meta page may count pages its file never received (storage/lmdbcheck.py), and
the pre-open check took that for truncation.

Each of NEREUS_RESTART_STORES data directories (default 10) gets SESSIONS (3) runs of
tests/support/restart_worker.py (the embedded service under schedules, upserts, cancels and fires
with payloads of 10 B to 400 KB), each stopped by SIGTERM (a clean stop) or SIGKILL at a
seeded random moment. Every later run opens the directory with every pre-open check, and
after the last stop the test reopens both of its stores itself: the shard store with every
check (this one, the structure walk, the invariant check) and then the replay of its log,
the local destination with its check. There must be no refusal at all; one is reported with
LMDB's own verdict on the file. The test also counts the stops after which the shard
store's newest meta page counted pages past the end of its file (about one in three), and
requires some: without them it would not reach the case it is for. Before the fix, this
test failed with 7 or 8 of the 10 directories refused, every one readable by LMDB in full.
`NEREUS_RESTART_SEED` replays a run's stop schedule and workload seeds (a fixed default,
`random` draws one; the moment a signal lands still varies with the machine).
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
from nereus.kernel.digest import state_digest
from nereus.replay.fold import replay
from nereus.storage.errors import StoreError
from nereus.storage.store import ShardStore
from tests.support.lmdb_files import lmdb_verdict, pages_past_eof
from tests.support.restart_worker import REFUSED_EXIT
from tests.support.seeds import seed_from_env
from tests.support.worker_process import read_line

ROOT = Path(__file__).resolve().parents[2]
STORES = int(os.environ.get("NEREUS_RESTART_STORES", "10"))
SESSIONS = 3
READY_TIMEOUT_S = 30.0


def _seed() -> int:
    # A fixed default, so every run stops the same workloads at the same moments; `random`
    # draws one.
    return seed_from_env("NEREUS_RESTART_SEED", 20261201)


def _session(data_dir: Path, seed: int, stop_after_s: float, how: signal.Signals) -> str | None:
    """Run one worker until `how` stops it; the refusal it printed, if it was refused."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.support.restart_worker", str(data_dir), str(seed)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        said = read_line(proc, READY_TIMEOUT_S)
        assert said is not None, f"{data_dir}: the worker never spoke"
        first = said.decode().strip()  # "ready" or "refused: ..."
        if first != "ready":
            out, err = proc.communicate(timeout=READY_TIMEOUT_S)
            assert proc.returncode == REFUSED_EXIT, (first, out, err.decode()[-2000:])
            return first.removeprefix("refused: ")
        time.sleep(stop_after_s)
        assert proc.poll() is None, f"the worker exited early: {proc.communicate()}"
        proc.send_signal(how)
        out, err = proc.communicate(timeout=READY_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if how is signal.SIGTERM:
        assert proc.returncode == 0 and b"stopped" in out, err.decode()[-2000:]
    else:
        assert proc.returncode == -signal.SIGKILL, err.decode()[-2000:]
    return None


def _reopen(data_dir: Path) -> None:
    """Every pre-open check on both stores, the invariant check, and the replay of the log."""
    with ShardStore.open(str(data_dir / "shard"), create=False) as store:
        entries = list(store.iter_log(1, store.meta.position))
        _, result = replay(entries, store.config)
        with store.state_view() as state:
            assert state_digest(state) == result.digest, f"{data_dir}: state differs from replay"
    LocalDestination(str(data_dir / "destination")).close()


def test_a_stopped_service_always_restarts_on_its_data(tmp_path: Path) -> None:
    seed = _seed()
    rng = random.Random(seed)
    refusals: list[str] = []
    stops = short = 0
    for index in range(STORES):
        data_dir = tmp_path / f"data-{index}"
        refused: str | None = None
        for _ in range(SESSIONS):
            how = signal.SIGTERM if rng.random() < 0.6 else signal.SIGKILL
            refused = _session(data_dir, rng.randrange(2**32), rng.uniform(0.2, 0.9), how)
            if refused is not None:
                break
            stops += 1
            short += pages_past_eof(data_dir / "shard" / "data.mdb") > 0
        if refused is None:
            try:
                _reopen(data_dir)
            except StoreError as exc:
                refused = str(exc)
        if refused is not None:
            verdict = lmdb_verdict(Path(refused.split(": ")[0]).parent)
            refusals.append(f"{data_dir.name}: {refused}\n  LMDB itself: {verdict}")
    where = f"NEREUS_RESTART_SEED={seed}"
    summary = (
        f"{where}: {STORES} data directories, {stops} stops, {short} left the shard store's "
        f"newest meta counting pages past the end of its file, {len(refusals)} refused"
    )
    print(summary)
    assert not refusals, summary + "\n" + "\n".join(refusals)
    assert short > 0, f"{summary}: the stops never reached the case this test is for"
