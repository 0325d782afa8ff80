"""The Kafka snapshot benches at a small size against the real broker, so that what they
measure at full size (minutes) stays runnable: the takeover bench restores a snapshot that
covers its whole history, and the snapshot-lag bench completes snapshots while it fires,
never early."""

from __future__ import annotations

from bench import kafka_snapshot_lag, kafka_takeover
from tests.support import kafka_env

kafka_bootstrap = kafka_env.kafka_bootstrap


def test_the_takeover_bench_folds_and_restores(kafka_bootstrap: str) -> None:
    r = kafka_takeover.one(kafka_bootstrap, live=2_000, history=6_000, timeout_s=120)
    assert r["records"] == 12  # 500 commands a record
    assert r["snapshot_rows"] > 2_000
    assert r["fold_from_offset_0_s"] > 0
    assert r["restore_s"] > 0


def test_the_snapshot_lag_bench_fires_while_snapshots_complete(kafka_bootstrap: str) -> None:
    r = kafka_snapshot_lag.run(kafka_bootstrap, live=2_000, rate=200, seconds=3, interval_ms=200)
    for phase in ("off", "on"):
        assert r[phase]["published"] == r[phase]["scheduled"] > 0
        assert r[phase]["early"] == 0
    assert r["off"]["snapshots_completed"] == 0
    assert r["on"]["snapshots_completed"] >= 1
    assert r["on"]["snapshot_bytes"] > 0
