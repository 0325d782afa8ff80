"""The two benches outside the suite that measure a store as a whole, run small: the
migrating open of a schema-5 store (`bench.migration`) and a state's export and import
(`bench.transfer`) must finish and report every figure (no speed is asserted)."""

from __future__ import annotations

from bench import migration, transfer


def test_the_migration_bench_migrates_and_reports() -> None:
    result = migration.run(2_000)
    assert result["live_timers"] == 2_000
    assert result["table_rows"] >= 2 * 2_000  # a message and a timeline row a timer at least
    assert result["migrating_open_s"] > 0 and result["rows_per_s"] > 0


def test_the_transfer_bench_moves_every_row_and_reports() -> None:
    result = transfer.run(2_000)
    assert result["rows"] >= 4 * 2_000  # message, timeline and the two index rows a timer
    assert result["chunks"] >= 1 and result["megabytes"] > 0 and result["rows_per_s"] > 0
