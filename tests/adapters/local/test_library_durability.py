"""The embedded library under power loss: nothing it acknowledged is lost, nothing it
recorded PUBLISHED names a record the destination lost.

`tests.support.durability_worker` runs the whole stack (`Nereus`, its runtime thread, the shard
store
and the local destination) under the power-loss shim (`tests/support/powerloss.py`), scheduling
timers that come due at once and printing an ack line for each schedule that returned; it is
killed at a seeded moment and the durable images of both stores are put in place. The store's
own durability is `tests/storage/test_storage_durability.py`'s; this file judges the stack by what
it
told its caller and what it recorded, so a component that stops syncing shows here too.

`NEREUS_POWERLOSS_SEED` replays another kill schedule (a fixed default; `random` draws one).
"""

from __future__ import annotations

import sys
from pathlib import Path

from nereus.adapters.local.destination import LocalDestination
from nereus.kernel.model import Attempt, AttemptStatus, Message, Table
from nereus.storage.store import ShardStore
from tests.support.powerloss import acks_then_power_loss
from tests.support.seeds import seed_from_env

SEED = seed_from_env("NEREUS_POWERLOSS_SEED", 31337)


def test_the_embedded_library_loses_nothing_it_acknowledged(tmp_path: Path) -> None:
    """The whole stack (`Nereus`, its runtime thread, the shard store and the local
    destination): every schedule that returned is still there after a power loss, and every
    attempt recorded PUBLISHED names a destination record that is still there too."""
    where = f"embedded power loss (NEREUS_POWERLOSS_SEED={SEED})"
    lines = acks_then_power_loss(
        [sys.executable, "-m", "tests.support.durability_worker", str(tmp_path), str(SEED)],
        tmp_path / "shadows",
        80,
        where,
        tmp_path / "shard" / "data.mdb",
        tmp_path / "destination" / "data.mdb",
    )
    told = [line.split()[1] for line in lines]
    destination = LocalDestination(str(tmp_path / "destination"))
    try:
        with ShardStore.open(str(tmp_path / "shard")) as store, store.read() as view:
            keys = {m.timer_key for _, m in view.items(Table.MESSAGES) if isinstance(m, Message)}
            missing = [key for key in told if key not in keys]
            assert missing == [], f"{where}: acknowledged schedules lost: {missing[:5]}"
            published = [
                a
                for _, a in view.items(Table.ATTEMPTS)
                if isinstance(a, Attempt) and a.status is AttemptStatus.PUBLISHED
            ]
        held = {r.attempt_id for r in destination.iter_all("q")}
    finally:
        destination.close()
    assert published, f"{where}: nothing was delivered before the kill"
    gone = [a.attempt_id for a in published if a.attempt_id not in held]
    assert gone == [], f"{where}: PUBLISHED, but the destination lost the record: {gone[:5]}"
