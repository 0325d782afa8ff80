"""A deterministic whole-shard simulator (issue 7).

It drives the real kernel, the real `ShardStore` on real LMDB in a temporary directory and
the real `ShardRuntime` (its `tick(now)` called from the simulation loop with the simulated
clock's reading, never its thread),
with one seeded `random.Random`: an honest but drifting, stepping, sometimes unsynchronised
clock whose true time only the simulator knows (`sim.clock`); a destination that fails,
times out before and after writing, reports twice and acknowledges late (`sim.destination`);
crashes before, inside and after the commit, around the destination write and between ticks
(`sim.crash`); and clients that schedule, upsert, retry, reschedule, cancel and flip lane
gates (`sim.client`). The kernel invariants are checked after every step and every send is
checked against the committed store; after the run settles, `sim.audit` holds the log, the
replay and the broker's writes to every promise Nereus makes.

    python -m nereus.sim --seeds 200                 # what CI-sized runs look like, with figures
    python -m nereus.sim --seed 17 --steps 400       # reproduce one seed (a failure prints this)
    python -m nereus.sim --seed 17 --steps 400 -v    # ... with its event trace

A long soak (hours; every seed is independent, so stop it whenever):

    python -m nereus.sim --seeds 100000 --seed 1000000 --steps 2000

`tests/sim/test_simulator.py` runs `NEREUS_SIM_SEEDS` seeds (a small default) in the suite.
"""

from __future__ import annotations

import tempfile
from collections import Counter

from nereus.runtime import compiled

# `NEREUS_PURE_PYTHON=1 python -m nereus.sim` runs the source build: before any kernel import.
compiled.from_environment()

from nereus.sim.world import SimFailure, World  # noqa: E402

DEFAULT_STEPS = 400

__all__ = ["DEFAULT_STEPS", "SimFailure", "World", "run_seed"]


def run_seed(
    seed: int,
    steps: int = DEFAULT_STEPS,
    *,
    lie_ms: int = 0,
    sync: bool = False,
    verbose: bool = False,
    edge_faults: bool = True,
) -> Counter[str]:
    """Run one seed in a fresh temporary directory; returns its figures or raises
    `SimFailure` naming the seed and the command that reproduces it."""
    with tempfile.TemporaryDirectory(prefix=f"nereus-sim-{seed}-") as root:
        world = World(
            seed, steps, root, lie_ms=lie_ms, sync=sync, verbose=verbose, edge_faults=edge_faults
        )
        try:
            return world.run()
        finally:
            world.close()
