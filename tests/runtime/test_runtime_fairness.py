"""Fairness of due discovery: a hot lane's backlog cannot delay a quiet lane by more than a
quantum, judged by the ORDER of service, never by wall time.

The runtime tests drive `ShardRuntime.tick()` by hand under a `SimulatedClock` against a
real LMDB store holding 100,000 due timers in one lane ("hot"); the order of service is the
order in which sends reach the local destination's `before_send` hook (each send also checks
that its attempt is durably PUBLISHING). The backlog is built once per module, committed in
batches straight through `ShardStore.commit`, and copied for each test.

`runtime.drr.DeficitRoundRobin` is also tested on its own: quanta, rotation positions that
survive between runs, lanes joining and leaving, and (with hypothesis) that no lane with work
waits longer than a bounded number of other lanes' items.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nereus.adapters.clock import SimulatedClock
from nereus.kernel.codes import Code
from nereus.kernel.keys import message_id
from nereus.runtime.config import RuntimeConfig
from nereus.runtime.drr import DeficitRoundRobin, Lane
from nereus.service.arguments import schedule_record
from nereus.storage.schema import StoreOptions
from nereus.storage.store import ShardStore
from tests.support.runtime_harness import T0_MS, Harness

HOT_TIMERS = 100_000
BUILD_BATCH = 5_000
HOT_DUE_MS = T0_MS + 1_000
ERROR_MS = 5
# A 100k-timer store: walking every row for invariants on each open would dominate the test.
OPTIONS = StoreOptions(check_invariants_on_open=False)
SLACK = 2  # "a quantum plus a small constant"
SMALL_BACKLOG = 5_000

CONFIGS = {
    "default": RuntimeConfig(),
    "small-quanta": RuntimeConfig(lane_quantum=4, tenant_quantum=8, max_admissions_per_tick=64),
    "uneven-budget": RuntimeConfig(max_admissions_per_tick=100),
}


def _configs() -> list[Any]:
    return [pytest.param(cfg, id=name) for name, cfg in CONFIGS.items()]


def _build(root: Path, timers: int) -> Path:
    with ShardStore.open(str(root / "shard"), options=OPTIONS) as store:
        for start in range(0, timers, BUILD_BATCH):
            items = [
                schedule_record(
                    "hot", f"h{i:06d}", b"hot", deliver_at_ms=HOT_DUE_MS, txn=f"hot-{i}"
                )
                for i in range(start, min(start + BUILD_BATCH, timers))
            ]
            store.commit(items, T0_MS)
        assert store.meta.counters.scheduled == timers
    return root


@pytest.fixture(scope="module")
def backlog(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The 100k-timer hot lane the issue asks for."""
    return _build(tmp_path_factory.mktemp("backlog"), HOT_TIMERS)


@pytest.fixture(scope="module")
def small_backlog(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Enough for the other configurations, whose ticks serve 64 or 100 items."""
    return _build(tmp_path_factory.mktemp("small-backlog"), SMALL_BACKLOG)


@pytest.fixture
def hot(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Harness]:
    config: RuntimeConfig = getattr(request, "param", CONFIGS["default"])
    big = config == CONFIGS["default"]
    source: Path = request.getfixturevalue("backlog" if big else "small_backlog")
    shutil.copytree(source, tmp_path / "run")
    h = Harness(
        tmp_path / "run",
        SimulatedClock(T0_MS, error_ms=ERROR_MS),
        config=config,
        store_options=OPTIONS,
    )
    assert h.store.meta.counters.scheduled == (HOT_TIMERS if big else SMALL_BACKLOG)
    yield h
    h.close()


def _served(h: Harness, start: int = 0) -> list[str]:
    return [s.prepared.message_id for s in h.sends[start:]]


def _tick_until_sent(h: Harness, mid: str, max_ticks: int = 20) -> int:
    """Tick until `mid` is sent; returns its index in the order of service."""
    for _ in range(max_ticks):
        served = _served(h)
        if mid in served:
            return served.index(mid)
        h.tick()
    served = _served(h)
    assert mid in served, f"not served within {max_ticks} ticks ({len(served)} sends)"
    return served.index(mid)


@pytest.mark.parametrize("hot", _configs(), indirect=True)
def test_a_quiet_lane_due_with_the_backlog_is_served_within_one_lane_quantum(
    hot: Harness,
) -> None:
    h, cfg = hot, hot.runtime.config
    quiet = h.schedule("only", b"quiet", queue="quiet", deliver_at_ms=HOT_DUE_MS)
    assert quiet.code is Code.SCHEDULED and quiet.message_id is not None
    h.clock.advance(HOT_DUE_MS - T0_MS + ERROR_MS)
    h.tick()
    backlog = h.store.meta.counters.scheduled
    assert h.runtime.metrics.value("nereus_due_backlog") == backlog > 0
    index = _tick_until_sent(h, quiet.message_id)
    assert index <= cfg.lane_quantum + SLACK, f"quiet served {index}th"
    h.tick(2)
    assert len(_served(h)) > index + 1, "the hot lane stopped being served"
    assert not h.problems, h.problems[:3]


@pytest.mark.parametrize("hot", _configs(), indirect=True)
def test_a_quiet_lane_that_becomes_due_mid_backlog_waits_at_most_one_quantum(
    hot: Harness,
) -> None:
    """The hot lane is being served tick after tick; quiet timers become due one after
    another. Each is sent within a quantum of the sends made after it became due: the
    rotation resumes where it stopped instead of rescanning the hot lane first."""
    h, cfg = hot, hot.runtime.config
    quiet_due = [HOT_DUE_MS + 1_000 + 200 * i for i in range(4)]
    mids = []
    for i, due in enumerate(quiet_due):
        r = h.schedule(f"quiet-{i}", b"quiet", queue="quiet", deliver_at_ms=due)
        assert r.code is Code.SCHEDULED and r.message_id is not None
        mids.append(r.message_id)
    h.clock.advance(HOT_DUE_MS - T0_MS + ERROR_MS)
    h.tick(3)
    assert len(h.sends) >= 3 * min(cfg.max_admissions_per_tick, cfg.lane_quantum)
    assert not set(mids) & set(_served(h)), "a quiet timer was sent before it was due"

    for mid, due in zip(mids, quiet_due, strict=True):
        h.clock.advance(due + ERROR_MS - h.clock.now_ms())
        assert h.clock.interval().earliest_ms >= due
        became_due = len(h.sends)
        index = _tick_until_sent(h, mid) - became_due
        assert 0 <= index <= cfg.lane_quantum + SLACK, f"quiet served {index} sends after due"
        h.tick()  # the hot lane goes on
    hot_sent = [m for m in _served(h) if m not in mids]
    assert hot_sent, "the hot lane was not served"
    assert h.store.meta.counters.scheduled > 0, "the test needs a hot lane that is still hot"
    assert not h.problems, h.problems[:3]


@pytest.mark.parametrize("hot", _configs(), indirect=True)
def test_a_quiet_tenant_is_served_within_one_quantum_of_a_hot_tenant(hot: Harness) -> None:
    h, cfg = hot, hot.runtime.config
    h.clock.advance(HOT_DUE_MS - T0_MS + ERROR_MS)
    h.tick(2)
    assert h.sends
    due = h.clock.now_ms() + 50
    quiet = h.schedule("calm-1", b"calm", queue="quiet", tenant="calm", deliver_at_ms=due)
    assert quiet.code is Code.SCHEDULED
    mid = message_id("calm", "quiet", "calm-1")
    assert mid not in _served(h)
    h.clock.advance(50 + ERROR_MS)
    assert h.clock.interval().earliest_ms >= due
    became_due = len(h.sends)
    index = _tick_until_sent(h, mid) - became_due
    bound = min(cfg.lane_quantum, 2 * cfg.tenant_quantum) + SLACK
    assert 0 <= index <= bound, f"the quiet tenant was served {index} sends after due"
    assert not h.problems, h.problems[:3]


# DeficitRoundRobin on its own --------------------------------------------------------------


class Backlogs:
    """A `take` over per-lane backlogs (None: endless) that records every call."""

    def __init__(self, backlogs: dict[Lane, int | None]) -> None:
        self.left = dict(backlogs)
        self.calls: list[tuple[Lane, int, int]] = []

    def active(self) -> list[Lane]:
        return sorted(lane for lane, n in self.left.items() if n is None or n > 0)

    def __call__(self, lane: Lane, want: int) -> int:
        n = self.left[lane]
        got = want if n is None else min(n, want)
        if n is not None:
            self.left[lane] = n - got
        self.calls.append((lane, want, got))
        return got


def test_drr_rejects_empty_quanta() -> None:
    with pytest.raises(ValueError):
        DeficitRoundRobin(0, 1)
    with pytest.raises(ValueError):
        DeficitRoundRobin(1, 0)


def test_drr_lane_quantum_bounds_each_visit_and_lanes_take_turns() -> None:
    lanes = [("t", "a"), ("t", "b"), ("t", "c")]
    take = Backlogs(dict.fromkeys(lanes))
    drr = DeficitRoundRobin(tenant_quantum=100, lane_quantum=3)
    drr.sync(lanes)
    assert drr.run(30, take) == 30
    assert [w for _, w, _ in take.calls] == [3] * 10
    assert [lane for lane, _, _ in take.calls] == (lanes * 4)[:10]


def test_drr_tenant_quantum_bounds_each_tenant_visit() -> None:
    x1, x2, y1 = ("x", "1"), ("x", "2"), ("y", "1")
    take = Backlogs(dict.fromkeys([x1, x2, y1]))
    drr = DeficitRoundRobin(tenant_quantum=4, lane_quantum=10)
    drr.sync([x1, x2, y1])
    assert drr.run(24, take) == 24
    tenants = [lane[0] for lane, _, _ in take.calls]
    assert tenants == ["x", "y"] * 3
    assert all(got == 4 for _, _, got in take.calls)
    # Within tenant x the lanes still alternate.
    assert [lane for lane, _, _ in take.calls if lane[0] == "x"] == [x1, x2, x1]


def test_drr_positions_persist_across_runs() -> None:
    lanes = [("t", "a"), ("t", "b"), ("u", "c")]
    take = Backlogs(dict.fromkeys(lanes))
    drr = DeficitRoundRobin(tenant_quantum=1, lane_quantum=1)
    for _ in range(6):
        drr.sync(lanes)
        assert drr.run(1, take) == 1
    # One item per run, and each run resumes after the last lane served.
    assert [lane for lane, _, _ in take.calls] == [
        ("t", "a"),
        ("u", "c"),
        ("t", "b"),
        ("u", "c"),
        ("t", "a"),
        ("u", "c"),
    ]


def test_drr_a_lane_that_runs_dry_forfeits_its_deficit() -> None:
    a, b = ("t", "a"), ("t", "b")
    take = Backlogs({a: 1, b: None})
    drr = DeficitRoundRobin(tenant_quantum=100, lane_quantum=5)
    for _ in range(5):
        drr.sync([a, b])
        drr.run(10, take)
    take.left[a] = None  # a burst arrives in the once-idle lane
    take.calls.clear()
    drr.sync([a, b])
    drr.run(40, take)
    assert max(w for lane, w, _ in take.calls if lane == a) <= 5


def test_drr_lanes_join_at_the_end_and_leave_cleanly() -> None:
    a, b, c = ("t", "a"), ("t", "b"), ("t", "c")
    take = Backlogs({a: None, b: None, c: None})
    drr = DeficitRoundRobin(tenant_quantum=100, lane_quantum=2)
    drr.sync([a, b])
    drr.run(2, take)  # a
    drr.sync([a, b, c])  # c joins behind b
    drr.run(4, take)
    assert [lane for lane, _, _ in take.calls] == [a, b, c]
    take.calls.clear()
    drr.sync([a, c])  # b leaves
    drr.run(8, take)
    assert b not in {lane for lane, _, _ in take.calls}
    assert {lane for lane, _, _ in take.calls} == {a, c}
    take.calls.clear()
    drr.sync([])
    assert drr.run(8, take) == 0
    assert take.calls == []
    drr.sync([b])
    assert drr.run(2, take) == 2
    assert [lane for lane, _, _ in take.calls] == [b]


def test_drr_a_turn_cut_short_by_the_budget_banks_no_deficit() -> None:
    hot, quiet = ("t", "hot"), ("t", "quiet")
    take = Backlogs({hot: None, quiet: 0})
    drr = DeficitRoundRobin(tenant_quantum=64, lane_quantum=32)
    for _ in range(3):
        drr.sync(take.active())
        drr.run(100, take)  # 32 + 32 + 32 + 4: the last turn is cut by the budget
    take.left[quiet] = 1
    take.calls.clear()
    drr.sync(take.active())
    drr.run(100, take)
    lanes = [lane for lane, _, _ in take.calls]
    ahead = sum(got for _, _, got in take.calls[: lanes.index(quiet)])
    assert ahead <= 32, f"{ahead} items of the hot lane went before the newly due lane"


@st.composite
def _scenarios(
    draw: st.DrawFn,
) -> tuple[dict[Lane, int | None], int, int, list[int]]:
    lanes: dict[Lane, int | None] = {}
    for t in range(draw(st.integers(1, 4))):
        for q in range(draw(st.integers(1, 4))):
            lanes[(f"t{t}", f"q{q}")] = draw(st.one_of(st.none(), st.integers(0, 60)))
    tenant_q = draw(st.integers(1, 12))
    lane_q = draw(st.integers(1, 12))
    budgets = draw(st.lists(st.integers(1, 80), min_size=1, max_size=40))
    return lanes, tenant_q, lane_q, budgets


@settings(max_examples=300, deadline=None)
@given(_scenarios())
def test_drr_is_work_conserving_bounded_and_starves_no_lane(
    scenario: tuple[dict[Lane, int | None], int, int, list[int]],
) -> None:
    lanes, tenant_q, lane_q, budgets = scenario
    take = Backlogs(lanes)
    drr = DeficitRoundRobin(tenant_q, lane_q)
    n_tenants = len({t for t, _ in lanes})
    ring = {t: sum(1 for u, _ in lanes if u == t) for t, _ in lanes}
    endless = [lane for lane, n in lanes.items() if n is None]
    # Items served to other lanes since each endless lane's last turn.
    waited: dict[Lane, int] = dict.fromkeys(endless, 0)
    for budget in budgets:
        active = take.active()
        drr.sync(active)
        backlog = sum(
            budget if take.left[lane] is None else take.left[lane] or 0 for lane in active
        )
        first = len(take.calls)
        served = drr.run(budget, take)
        calls = take.calls[first:]
        assert served == sum(got for _, _, got in calls) == min(budget, backlog)
        used = 0
        for lane, want, got in calls:
            assert lane in active
            assert 1 <= want <= budget - used
            used += got
            for other in endless:
                if other == lane:
                    waited[other] = 0
                else:
                    waited[other] += got
                    bound = (ring[other[0]] + 1) * n_tenants * 2 * tenant_q
                    assert waited[other] <= bound, f"{other} waited {waited[other]} > {bound}"
        # With two or more tenants in the ring, consecutive calls of one tenant are one
        # visit, and a visit never serves more than its deficit (<= 2 tenant quanta).
        if len({t for t, _ in active}) >= 2:
            block_tenant, block = None, 0
            for (tenant, _), _, got in calls:
                block = block + got if tenant == block_tenant else got
                block_tenant = tenant
                assert block <= 2 * tenant_q
