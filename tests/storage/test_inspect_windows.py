"""The console's log windows (`storage.inspect.newest_entries`) over a real LMDB store: the
newest entries, newest first, ending at the entry that brings the records read to the budget,
so a window costs the records it holds, whatever size the entries were batched in.
tests/service/test_console_reads.py checks the pages' reads built on it."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nereus.kernel.records import Cancel, CommandBatch, Record
from nereus.storage import inspect as reads
from nereus.storage.store import ShardStore


def _entry(width: int, n: int) -> tuple[Record, None] | tuple[Record, tuple[None, ...]]:
    cancels = tuple(Cancel("t", "q", f"k{n}-{i}") for i in range(width))
    if width == 1:
        return cancels[0], None
    return CommandBatch(cancels), (None,) * width


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    widths=st.lists(st.integers(1, 40), min_size=1, max_size=30),
    limit=st.integers(1, 40),
    budget=st.one_of(st.none(), st.integers(1, 300)),
)
def test_a_window_is_the_newest_entries_up_to_the_one_reaching_its_record_budget(
    tmp_path_factory: pytest.TempPathFactory, widths: list[int], limit: int, budget: int | None
) -> None:
    store = ShardStore.open(str(tmp_path_factory.mktemp("window") / "shard"))
    try:
        entries = store.append([_entry(w, n) for n, w in enumerate(widths)], now_ms=1_000)
        with store.read() as view:
            window = list(reads.newest_entries(view, limit, budget))
        newest = [e.position for e in reversed(entries)]
        got = [e.position for e in window]
        assert got == newest[: len(got)], "not the newest, newest first"
        sizes = [widths[-1 - i] for i in range(len(got))]
        assert all(reads.width(e.record) == s for e, s in zip(window, sizes, strict=True))
        if budget is not None:
            assert sum(sizes[:-1]) < budget, "read past the entry that reached the budget"
        ended_early = len(got) < min(limit, len(widths))
        assert not ended_early or (budget is not None and sum(sizes) >= budget)
    finally:
        store.close()
