"""`nereus serve` tunes its own process's garbage collector; the library never does."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path

import pytest

from nereus.adapters.compose import lifecycle


@pytest.fixture
def collector() -> Iterator[None]:
    thresholds = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)


def test_the_service_freezes_start_up_and_collects_less_often(collector: None) -> None:
    before = gc.get_freeze_count()
    lifecycle.tune_gc()
    assert gc.get_threshold() == lifecycle.GC_THRESHOLDS
    assert gc.get_freeze_count() > before, "start-up objects are kept out of later passes"


def test_opening_the_library_leaves_the_collector_alone(tmp_path: Path) -> None:
    from nereus import Nereus  # noqa: PLC0415

    thresholds = gc.get_threshold()
    with Nereus.open(str(tmp_path), assume_clock_error_ms=5) as n:
        n.start()
        assert n.schedule("q", "k", b"x", delay_ms=60_000).ok
    assert gc.get_threshold() == thresholds
