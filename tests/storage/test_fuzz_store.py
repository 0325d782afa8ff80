"""Fuzzing the store opener: a damaged data file opens or is refused, never anything else.

A real store (schedules, cancels, a gate change) is copied and damaged the ways files get
damaged — bit flips, a burst of junk, a truncation, a zeroed page, a file of random bytes —
and each copy is opened and read in full (the whole log, the live-timer index). The only
acceptable answers are a store that opens and reads (the damage hit free pages, or a value
never read, which the CRC refuses the moment it is read) or a `StoreError` naming the data
file. A traceback or a crash of the process is a failure, reported with its seed:
`NEREUS_FUZZ_STORE_SEED=S NEREUS_FUZZ_STORE_CASES=N pytest tests/storage/test_fuzz_store.py` (the
seed
has a fixed default; `random` draws one).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from nereus import kernel as k
from nereus.storage.store import ShardStore
from tests.support.builders import QUEUE, T0_MS, TENANT, schedule
from tests.support.lmdb_files import build_short_store
from tests.support.seeds import seed_from_env

CASES = int(os.environ.get("NEREUS_FUZZ_STORE_CASES", "150"))
SEED = seed_from_env("NEREUS_FUZZ_STORE_SEED", 220593)  # `random` draws one
ROOT = Path(__file__).resolve().parents[2]


def _build(path: Path) -> None:
    with ShardStore.open(str(path)) as store:
        for batch in range(20):
            store.append(
                [(schedule(f"k{batch}-{i}"), b"payload") for i in range(40)], T0_MS + batch
            )
        store.append([(k.LaneGate(TENANT, QUEUE, "CLOSED", reason="fuzz"), None)], T0_MS + 30)
        store.append([(k.Cancel(TENANT, QUEUE, f"k1-{i}"), None) for i in range(40)], T0_MS + 31)
        while store.apply_pending():
            pass


def _fuzz(base: Path, work: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.support.fuzz_store_worker",
            str(base),
            str(work),
            str(SEED),
            str(CASES),
        ],
        cwd=ROOT,
        check=False,
        capture_output=True,
        text=True,
        timeout=600,
    )
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    where = f"NEREUS_FUZZ_STORE_SEED={SEED}, case {len(lines)}"
    assert proc.returncode == 0, f"{where}: exit {proc.returncode}\n{proc.stderr[-3000:]}"
    assert len(lines) == CASES
    refused = [x for x in lines if x["result"] == "refused"]
    for x in refused:
        assert x["detail"].startswith(str(work / "data.mdb")), x
    print(
        f"store fuzz seed={SEED} ({base.name}): {CASES} damaged copies, {len(refused)} refused "
        f"naming the file, {CASES - len(refused)} opened and read in full"
    )


def test_a_damaged_store_opens_or_is_refused_naming_the_file(tmp_path: Path) -> None:
    base = tmp_path / "base"
    _build(base)
    _fuzz(base, tmp_path / "damaged")


def test_a_damaged_short_store_opens_or_is_refused_naming_the_file(tmp_path: Path) -> None:
    """The same for a store whose newest meta page counts pages past the end of its file:
    there the pre-open check walks every reachable page (storage/lmdbcheck.py), so the
    damage lands in what that walk reads."""
    base = tmp_path / "short"
    build_short_store(base)
    _fuzz(base, tmp_path / "damaged")
