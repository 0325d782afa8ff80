"""The fire-lag chart's windows: they end on the wall clock's ten-second boundaries whenever a
sampler started, and the windows of several processes, summed bucket by bucket, are the
windows of one process that saw every observation (the chart of `serve --processes`)."""

from __future__ import annotations

from pathlib import Path

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from nereus.adapters.http.console.lag import (
    FIRE_LAG,
    SAMPLE_S,
    WINDOWS,
    LagDeltas,
    LagSampler,
    quantile,
    summarize,
)
from nereus.adapters.http.console.lag_merge import machine_view, merge
from nereus.adapters.kafka.siblings import Part, SiblingDirectory, SiblingReader, Siblings
from nereus.runtime.metrics import LAG_BUCKETS_S, Metrics, ScopedMetrics, drop_series
from nereus.service.errors import ShardNotLocal
from nereus.service.results import Peek

T0_S = 1_700_000_000.0  # a boundary: a multiple of SAMPLE_S


def test_windows_end_on_the_clocks_boundaries_whenever_the_sampler_started() -> None:
    early, late = LagSampler(Metrics()), LagSampler(Metrics())
    early.sample(T0_S + 0.4)
    late.sample(T0_S + 9.9)
    for sampler in (early, late):
        sampler.sample(T0_S + 10.02)  # the thread wakes a little past the boundary
        sampler.sample(T0_S + 10.5)  # a second wake-up in the same window records nothing
    assert [w.end_s for w in early.windows(T0_S + 13)] == [T0_S + 10, T0_S + 20]
    assert [w.end_s for w in late.windows(T0_S + 13)] == [T0_S + 10, T0_S + 20]


def test_a_page_reads_the_boundary_a_late_sampler_thread_has_not_reached() -> None:
    metrics = Metrics()
    sampler = LagSampler(metrics)
    sampler.sample(T0_S + 1)
    metrics.observe(FIRE_LAG, 0.003)
    # The thread has not woken at T0+10 yet (stopped, busy): the page files the reading there.
    windows = sampler.windows(T0_S + 12)
    assert [(w.end_s, w.published) for w in windows] == [(T0_S + 10, 1), (T0_S + 20, 0)]
    assert windows[0].p50_s == 0.005


def test_a_shard_that_moves_away_takes_no_count_out_of_the_windows() -> None:
    root = Metrics()
    sampler = LagSampler(root)
    ScopedMetrics(root, {"shard": "0"}).observe(FIRE_LAG, 0.5)
    sampler.sample(T0_S)
    ScopedMetrics(root, {"shard": "1"}).observe(FIRE_LAG, 0.002)
    drop_series(root, {"shard": "0"})  # a rebalance forgets the moved shard's series
    (window,) = sampler.windows(T0_S + 5)
    assert window.published == 1 and window.p99_s == 0.0025


def test_the_quantile_is_the_upper_bound_of_its_bucket() -> None:
    bounds = [0.01, 0.1, 1.0]
    assert quantile(bounds, [], 0.5) is None
    assert quantile(bounds, [0, 0, 0, 0], 0.5) is None
    assert quantile(bounds, [50, 49, 1, 0], 0.5) == 0.01
    assert quantile(bounds, [50, 49, 1, 0], 0.99) == 0.1
    assert quantile(bounds, [50, 49, 0, 1], 0.999) == float("inf")


def test_merge_leaves_out_other_buckets_and_windows_past_the_askers() -> None:
    own = LagDeltas([0.1, 1.0], [(T0_S + 10, [1, 0, 0]), (T0_S + 20, [0, 1, 0])])
    newer = LagDeltas([0.1, 1.0], [(T0_S + 20, [2, 0, 0]), (T0_S + 30, [5, 0, 0])])
    other_buckets = LagDeltas([0.5], [(T0_S + 20, [7, 0])])
    never_observed = LagDeltas([], [(T0_S + 10, []), (T0_S + 20, [])])
    merged, used = merge([own, newer, other_buckets, never_observed])
    assert used == 3
    assert merged == LagDeltas([0.1, 1.0], [(T0_S + 10, [1, 0, 0]), (T0_S + 20, [2, 1, 0])])
    long = LagDeltas([1.0], [(T0_S + 10 * i, [1, 0]) for i in range(WINDOWS + 5)])
    assert len(merge([long])[0].windows) == WINDOWS + 1


_lag_s = st.one_of(
    st.sampled_from([0.0, *LAG_BUCKETS_S, 60.5]),  # on a bound: the bucket's own edge
    st.floats(0.0, 120.0, allow_nan=False),
)


@settings(max_examples=80, deadline=None)
@given(
    processes=st.lists(
        # per process: when its sampler started in the first window, and per window (the
        # last one still open) its observations and how late its sampler woke past the end
        st.tuples(
            st.floats(0.0, SAMPLE_S - 0.01),
            st.lists(st.tuples(st.lists(_lag_s, max_size=6), st.floats(0.0, 0.5)), max_size=4),
        ),
        min_size=1,
        max_size=4,
    ),
    windows=st.integers(1, 4),
)
def test_merged_windows_are_the_windows_of_one_histogram_of_every_observation(
    processes: list[tuple[float, list[tuple[list[float], float]]]], windows: int
) -> None:
    everything = Metrics()  # one process that saw every observation
    alone = LagSampler(everything)
    alone.sample(T0_S)
    own = [Metrics() for _ in processes]
    samplers = [LagSampler(m) for m in own]
    for sampler, (started_s, _) in zip(samplers, processes, strict=True):
        sampler.sample(T0_S + started_s)
    for w in range(windows):
        end_s = T0_S + SAMPLE_S * (w + 1)
        for metrics, sampler, (_, per_window) in zip(own, samplers, processes, strict=True):
            lags_s, woke_s = per_window[w] if w < len(per_window) else ([], 0.0)
            metrics.observe_many(FIRE_LAG, lags_s)
            everything.observe_many(FIRE_LAG, lags_s)
            if w < windows - 1:  # the last window is read open, by the page
                sampler.sample(end_s + woke_s)
        if w < windows - 1:
            alone.sample(end_s)
    now_s = T0_S + SAMPLE_S * windows - 1
    # Encoded and decoded, as a sibling's answer travels.
    parts = [
        msgspec.msgpack.decode(msgspec.msgpack.encode(s.deltas(now_s)), type=LagDeltas)
        for s in samplers
    ]
    merged, used = merge(parts)
    assert used == len(processes)
    assert summarize(merged) == alone.windows(now_s)
    for end_s, counts in merged.windows:  # each merged count is the sum of the processes'
        theirs = [dict(p.windows)[end_s] for p in parts]
        for i, c in enumerate(counts):
            assert c == sum(t[i] for t in theirs if t)


def _no_peek(tenant: str, queue: str, key: str) -> Peek:
    raise ShardNotLocal("not here")


def _no_part(tenant: str, queue: str, after: str | None, limit: int) -> Part:
    return Part([], [], False)


def test_the_chart_sums_the_siblings_that_answer_and_counts_the_others(tmp_path: Path) -> None:
    own, theirs = Metrics(), Metrics()
    own_sampler, their_sampler = LagSampler(own), LagSampler(theirs)

    def answer() -> bytes:
        # what `Console.lag_answer` does: the first question starts the sibling's sampler
        their_sampler.start()
        return msgspec.msgpack.encode(their_sampler.deltas())

    reader = SiblingReader("secret", _no_peek, _no_part, lambda: "", lag=answer)
    reader.start()
    try:
        registry = SiblingDirectory(str(tmp_path), "process-0")
        SiblingDirectory(str(tmp_path), "process-1").register(reader.address)
        # Registered, then gone without unregistering (killed): nothing listens there.
        SiblingDirectory(str(tmp_path), "process-2").register("127.0.0.1:1")
        siblings = Siblings(registry, "secret")
        own_sampler.start()
        assert machine_view(own_sampler, siblings.lag).windows[-1].published == 0
        own.observe_many(FIRE_LAG, [0.003, 0.003])
        theirs.observe_many(FIRE_LAG, [0.003, 0.2, 0.2])
        view = machine_view(own_sampler, siblings.lag)
        assert Siblings(registry, "wrong").lag() == [None, None]
    finally:
        reader.stop()
        own_sampler.stop()
        their_sampler.stop()
    assert (view.covered, view.processes) == (2, 3)
    assert sum(w.published for w in view.windows) == 5
    busy = [w for w in view.windows if w.published]
    if len(busy) == 1:  # else a boundary passed between the two processes' observations
        assert busy[0].p50_s == 0.005 and busy[0].p99_s == 0.25


def test_one_process_alone_draws_its_own_windows() -> None:
    metrics = Metrics()
    sampler = LagSampler(metrics)
    sampler.sample()
    metrics.observe(FIRE_LAG, 0.04)
    view = machine_view(sampler, None)
    assert (view.covered, view.processes) == (1, None)
    assert sum(w.published for w in view.windows) == 1
