"""Durability: what a commit promises survives the power going out, not just a kill.

The store and the local destination must open LMDB so that every commit is synced (data
pages with fsync, the meta page through a synchronous write). A process crash cannot show
whether they do, since the OS keeps what was written; so these tests cut the power with
`tests/support/powerloss.py`: the child runs under a shim that keeps only what was made durable,
is killed at a seeded moment, and the test puts the durable image in place and reopens.
Every write the child was told had returned must be there, whole; and the same run with
fsync switched off must visibly lose writes, or the harness would prove nothing.

`NEREUS_POWERLOSS_SEED` replays another kill schedule (a fixed default; `random` draws one).
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

from nereus.adapters.local.destination import LocalDestination
from nereus.storage.errors import StoreError
from nereus.storage.schema import StoreOptions
from nereus.storage.store import ShardStore
from tests.support.crash_worker import CONFIG, check_reopened, entry_digest
from tests.support.powerloss import acks_then_power_loss, cut_power, script_under_shim
from tests.support.seeds import seed_from_env

SEED = seed_from_env("NEREUS_POWERLOSS_SEED", 31337)
KILLS = 3


def test_the_store_syncs_every_commit(tmp_path: Path) -> None:
    with ShardStore.open(str(tmp_path / "shard")) as store:
        flags = store.env.env.flags()
    assert flags["sync"] is True, "commits of the shard store are not fsynced"
    assert flags["metasync"] is True, "the shard store's meta page is not written synchronously"
    assert StoreOptions().sync is True


def test_the_local_destination_syncs_every_write(tmp_path: Path) -> None:
    destination = LocalDestination(str(tmp_path / "destination"))
    try:
        flags = destination._env.flags()
    finally:
        destination.close()
    assert flags["sync"] is True and flags["metasync"] is True


SHIM_SELF_TEST = """
import os, sys, time
path = sys.argv[1]
fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
os.write(fd, b"A" * 10)
os.fsync(fd)                         # durable: ten A
os.pwrite(fd, b"B" * 5, 0)           # never synced: lost
dsync = os.open(path, os.O_WRONLY | os.O_DSYNC)
os.pwrite(dsync, b"C", 9)            # a synchronous write: durable at once
os.lseek(fd, 10, os.SEEK_SET)
os.write(fd, b"D" * 4)               # grows the file, never synced: lost
print("ready", flush=True)
time.sleep(60)
"""


def test_the_power_loss_model_keeps_exactly_what_was_synced(tmp_path: Path) -> None:
    shadows = tmp_path / "shadows"
    target = tmp_path / "plain.bin"
    with script_under_shim(SHIM_SELF_TEST, target, shadows, ("plain.bin",), "shim self-test"):
        assert target.read_bytes() == b"BBBBBAAAACDDDD"  # what the running process sees
    cut_power(shadows, target)
    assert target.read_bytes() == b"AAAAAAAAAC"


def _run_store_worker(path: Path, shadows: Path, seed: int, acks: int, *extra: str) -> list[str]:
    command = [sys.executable, "-m", "tests.support.crash_worker", str(path), str(seed), "--acks"]
    where = f"store worker seed {seed}"
    return acks_then_power_loss([*command, *extra], shadows, acks, where, path / "data.mdb")


def _lost(path: Path, told: list[str]) -> list[str]:
    """What of the acknowledged writes the store no longer holds after the power loss."""
    try:
        store = ShardStore.open(str(path), config=CONFIG)
    except StoreError as exc:
        return [f"the store no longer opens: {exc}"]
    with store:
        digests = {e.position: entry_digest(e) for e in store.iter_log()}
        lost: list[str] = []
        for line in told:
            _, applied, log_end, *appended = line.split()
            if store.meta.position < int(applied) or store.log_last_position < int(log_end):
                lost.append(
                    f"{line!r}: the store is at {store.meta.position}/{store.log_last_position}"
                )
            for item in appended:
                position, digest = item.split(":")
                if digests.get(int(position)) != digest:
                    lost.append(f"entry {position} acknowledged, not in the log as written")
        return lost


def test_every_acknowledged_write_survives_power_loss(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    path, shadows = tmp_path / "shard", tmp_path / "shadows"
    total = 0
    for kill in range(KILLS):
        where = f"power loss {kill} (NEREUS_POWERLOSS_SEED={SEED})"
        told = _run_store_worker(path, shadows, SEED * 10 + kill, rng.randint(20, 120))
        total += len(told)
        assert _lost(path, told) == [], where
        check_reopened(str(path), where)
    print(f"power loss seed={SEED}: {KILLS} cuts, {total} acknowledged writes, none lost")


def test_a_store_without_fsync_is_caught_losing_writes(tmp_path: Path) -> None:
    """The harness is not vacuous: the same workload on a store opened without sync."""
    path, shadows = tmp_path / "shard", tmp_path / "shadows"
    told = _run_store_worker(path, shadows, SEED, 40, "--no-sync")
    assert _lost(path, told), "a store that never syncs lost nothing at a power loss"
