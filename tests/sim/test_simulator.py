"""The deterministic whole-shard simulator (`sim/`), run over a few seeds in the suite.

Each seed drives the real kernel, store and runtime through clock trouble, destination
faults, crashes and concurrent commands, and audits every promise at the end (see
`sim.audit`). `NEREUS_SIM_SEEDS` (default 40) sets how many seeds run and
`NEREUS_SIM_STEPS` (default 400) their length; a failure names its seed and prints
`python -m nereus.sim --seed S --steps K`. The seeds must reach what the audit checks (a
NOT_PUBLISHED report after UNKNOWN and one for a record the broker holds, both from a lying
destination; sends held by a clock that stepped back after the Admission's commit; the
clock's ends landing exactly on actionAt and expireAt): `test_the_seeds_reach_every_check`
counts them. The last tests prove the audit is not vacuous: a clock that lies beyond its
bound, a destination that hides a write, and a fence that "proves" a present record absent
are all caught.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from nereus.kernel.records import NotPublished
from nereus.runtime.destination import FinishedSearch, Lookup, Search, SearchOutcome, SendResult
from nereus.sim import SimFailure, World, run_seed
from nereus.sim import destination as sim_destination
from tests.support.runtime_harness import env_int

SEEDS = env_int("NEREUS_SIM_SEEDS", 40)
STEPS = env_int("NEREUS_SIM_STEPS", 400)


# The figures of the seeds run in this session, for the reach test (which runs any seed
# the session did not, so it also stands alone).
FIGURES: dict[int, Counter[str]] = {}
# What the CI seeds must reach, each at least this often.
REACHED = {
    "reach_not_published_after_unknown_refused": 1,
    "reach_not_published_of_written_refused": 1,
    "lie_not_published_after_unknown": 1,
    "lie_not_published_of_written": 1,
    "sends_held_by_step_back": 1,
    "reach_write_at_exact_action_time": 1,
    "clock_landed_earliest_on_action_at": 1,
    "clock_landed_latest_on_expire_at": 1,
    "clock_landed_earliest_on_expire_at": 1,
    "proven_absent": 1,
}


@pytest.mark.parametrize("seed", range(SEEDS))
def test_seed_keeps_every_promise(seed: int) -> None:
    figures = run_seed(seed, STEPS)
    FIGURES[seed] = figures
    assert figures["generations_checked"] > 0


def test_the_seeds_reach_every_check() -> None:
    total: Counter[str] = Counter()
    for seed in range(SEEDS):
        total += FIGURES[seed] if seed in FIGURES else run_seed(seed, STEPS)
    reached = {name: total[name] for name in REACHED}
    print(f"{SEEDS} seeds x {STEPS} steps reached: {reached}")
    short = {name: n for name, n in reached.items() if n < REACHED[name]}
    assert short == {}, f"checks the seeds no longer reach: {short}"
    # The lies that reached the kernel were all refused (an accepted one fails its seed).
    assert total["reach_not_published_after_unknown"] == 0
    assert total["reach_not_published_of_written"] == 0


def test_a_seed_replays_exactly(tmp_path: Path) -> None:
    prints = []
    for run in ("a", "b"):
        world = World(7, 200, str(tmp_path / run))
        try:
            figures = world.run()
            prints.append((world.fingerprint(), figures))
        finally:
            world.close()
    assert prints[0] == prints[1]


def test_a_clock_lying_beyond_its_bound_is_caught() -> None:
    with pytest.raises(SimFailure) as caught:
        run_seed(0, 200, lie_ms=3_000)
    assert "before deliverAt" in caught.value.reason or "early" in caught.value.reason
    assert "python -m nereus.sim --seed 0 --steps 200" in str(caught.value)


def test_a_destination_that_hides_a_write_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """A timeout after the write reported as a definite failure: the absence is a lie, and
    the retry it allows is a duplicate with no UNKNOWN behind it."""
    honest = sim_destination.SimDestination._report

    def lying(self: sim_destination.SimDestination, result: SendResult) -> None:
        r = result.result
        if getattr(r, "detail", None) == sim_destination.TIMEOUT_AFTER_WRITE:
            result = SendResult(
                result.attempt_id,
                result.message_id,
                result.generation,
                NotPublished("retriable", "lie"),
            )
        honest(self, result)

    monkeypatch.setattr(sim_destination.SimDestination, "_report", lying)
    with pytest.raises(SimFailure) as caught:
        for seed in range(20):
            run_seed(seed, 300)
    assert "NOT_PUBLISHED but the broker holds it" in caught.value.reason


def test_a_fence_that_proves_a_present_record_absent_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A fenced destination whose complete search misses a record it holds: the proof of
    absence it hands recovery is a lie, and the audit finds the record the NOT_PUBLISHED
    outcome denies. (Also shows the seeds reach recovery's proof of absence at all.)"""

    honest = sim_destination.SimDestination.search
    lied: set[int] = set()

    def lying(
        self: sim_destination.SimDestination,
        lookups: Sequence[Lookup],
        wake: Callable[[], None],
    ) -> Search:
        if self._fence is None or id(self) in lied:
            return honest(self, lookups, wake)
        lied.add(id(self))  # recovery's search, the first of the incarnation
        outcome = SearchOutcome({}, complete=True, fence=self._fence, searched="nothing read")
        return FinishedSearch(outcome)

    monkeypatch.setattr(sim_destination.SimDestination, "search", lying)
    with pytest.raises(SimFailure) as caught:
        for seed in range(SEEDS):
            run_seed(seed, STEPS)
    assert "NOT_PUBLISHED but the broker holds it" in caught.value.reason
