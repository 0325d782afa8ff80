"""Snapshot files survive a power loss whole, or not at all.

The rule (storage/snapshot.py; RELIABILITY.md P3): a snapshot that `write_snapshot` returned
is on disk with all its contents, and a snapshot file is never there with only part of
them: after a power loss the file under a snapshot's name holds the whole snapshot, or the
name still holds what it held before (nothing, or an older file). A kill cannot show this,
since the OS keeps what was written; so the writer runs under the power-loss shim
(tests/support/powerloss.py), which keeps of each snapshot file only the bytes that were fsynced and
gives it its new name only once its directory is fsynced. The writer is killed at seeded
moments, mid-snapshot or between snapshots, the durable image of its store and its snapshot
folder put in place, and every snapshot file there read in full.

`NEREUS_POWERLOSS_SEED` replays another kill schedule (a fixed default; `random` draws one);
`NEREUS_SNAPSHOT_TIMERS` sizes the state each snapshot holds.
"""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path

from nereus.storage.errors import StoreError
from nereus.storage.snapshot import read_snapshot
from tests.support.crash_worker import CONFIG
from tests.support.powerloss import acks_then_power_loss, cut_power_folder, script_under_shim
from tests.support.seeds import seed_from_env

SEED = seed_from_env("NEREUS_POWERLOSS_SEED", 4242)
TIMERS = int(os.environ.get("NEREUS_SNAPSHOT_TIMERS", "2000"))
CUTS = 4
SNAPSHOT_FILES = ("data.mdb", "snapshot-*")

RENAME_SELF_TEST = """
import os, sys, time
folder = sys.argv[1]
def write(name, data, sync_file):
    with open(os.path.join(folder, name), "wb") as f:
        f.write(data)
        f.flush()
        if sync_file:
            os.fsync(f.fileno())
def sync_dir():
    fd = os.open(folder, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
write("snapshot-a.tmp", b"a" * 9000, True)
os.replace(os.path.join(folder, "snapshot-a.tmp"), os.path.join(folder, "snapshot-a"))
write("snapshot-b.tmp", b"b" * 9000, False)
os.replace(os.path.join(folder, "snapshot-b.tmp"), os.path.join(folder, "snapshot-b"))
write("snapshot-c.tmp", b"c" * 9000, True)
sync_dir()   # a and b are renamed on disk, c's name is durable as it is
os.replace(os.path.join(folder, "snapshot-c.tmp"), os.path.join(folder, "snapshot-c"))
write("snapshot-d.tmp", b"d" * 9000, True)
print("ready", flush=True)
time.sleep(60)
"""


def test_the_power_loss_model_renames_on_disk_only_when_the_directory_is_synced(
    tmp_path: Path,
) -> None:
    """The harness itself: a rename is durable once its directory is fsynced, and then the
    file has only the bytes fsynced before; a rename not yet synced leaves the old name."""
    shadows, folder = tmp_path / "shadows", tmp_path / "snapshots"
    folder.mkdir()
    with script_under_shim(RENAME_SELF_TEST, folder, shadows, ("snapshot-*",), "rename self-test"):
        seen = {p.name: p.read_bytes() for p in folder.iterdir()}
        assert sorted(seen) == ["snapshot-a", "snapshot-b", "snapshot-c", "snapshot-d.tmp"]
    cut_power_folder(shadows, folder)
    after = {p.name: p.read_bytes() for p in folder.iterdir()}
    assert after == {
        "snapshot-a": b"a" * 9000,  # synced, renamed, directory synced
        "snapshot-b": b"",  # renamed and directory synced, its bytes never synced
        "snapshot-c.tmp": b"c" * 9000,  # synced, but its rename never reached the disk
        "snapshot-d.tmp": b"d" * 9000,  # synced under its first name
    }


def _snapshot_problems(folder: Path, acked: dict[str, tuple[int, str]]) -> list[str]:
    problems: list[str] = []
    for path in sorted(folder.glob("snapshot-*.bin")):
        try:
            header, _ = read_snapshot(str(path), CONFIG)
        except StoreError as exc:
            problems.append(f"{path.name} is not a whole snapshot after the power loss: {exc}")
            continue
        if str(path) in acked and (header.position, header.digest) != acked[str(path)]:
            problems.append(f"{path.name} holds position {header.position}, not the one told")
    for told in acked:
        if not Path(told).exists():
            problems.append(f"{Path(told).name} was acknowledged and is gone")
    return problems


def test_every_acknowledged_snapshot_is_whole_after_a_power_loss(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    path, shadows = tmp_path / "shard", tmp_path / "shadows"
    acked: dict[str, tuple[int, str]] = {}
    for cut in range(CUTS):
        where = f"power loss {cut} (NEREUS_POWERLOSS_SEED={SEED})"
        command = [
            sys.executable,
            "-m",
            "tests.support.snapshot_worker",
            str(path),
            str(SEED + cut),
        ]
        told = acks_then_power_loss(
            [*command, str(TIMERS)],
            shadows,
            rng.randint(1, 6),
            where,
            path / "data.mdb",
            names=SNAPSHOT_FILES,
        )
        cut_power_folder(shadows, path / "snapshots")
        for line in told:
            _, file, position, digest = line.split()
            acked[file] = (int(position), digest)
        assert _snapshot_problems(path / "snapshots", acked) == [], where
    snapshots = len(list((path / "snapshots").glob("snapshot-*.bin")))
    print(f"snapshot power loss seed={SEED}: {CUTS} cuts, {len(acked)} acknowledged, {snapshots}")
