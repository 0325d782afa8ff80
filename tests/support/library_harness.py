"""Shared by the library tests: a started embedded shard whose clock never proves anything
(nothing fires or expires, so only commands change the store), and the store's fingerprint
(state digest and log end) to compare before and after a refused call."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from nereus import Nereus
from nereus.adapters.clock import SimulatedClock
from nereus.kernel.digest import state_digest
from tests.support.runtime_harness import T0_MS


@contextmanager
def still_shard(path: Path) -> Iterator[Nereus]:
    clock = SimulatedClock(T0_MS)
    clock.lose_sync()
    # Unbounded on purpose: allowed, or start() would refuse it.
    with Nereus.open(str(path), clock=clock, allow_unbounded_clock=True) as n:
        n.start()
        yield n


def fingerprint(n: Nereus) -> tuple[str, int]:
    with n.store.state_view() as state:
        return state_digest(state), n.store.log_last_position
