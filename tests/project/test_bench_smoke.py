"""The benchmark suite's quick mode, run the way CI runs it: every bench completes and
reports every figure it declares.

No speed is asserted here (figures are measured in `bench/`, not judged in timed tests). What
is checked is that the suite still works end to end against the real broker and LMDB, so it
cannot rot between full runs: each bench's status is "ok", each figure has a value, a unit
and, where it is a ratio, the raw baseline measured in the same run; the table is printed;
the plots and per-bench JSON files are written; and no fire run delivered anything early.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.suite import NAMES
from tests.support import kafka_env, pulsar_env

kafka_bootstrap = kafka_env.kafka_bootstrap
pulsar_url = pulsar_env.pulsar_url
pulsar_admin_url = pulsar_env.pulsar_admin_url

ROOT = Path(__file__).resolve().parents[2]


# The quick suite in parts, so that the suite's workers run them side by side; the parts
# together are every bench. pulsar_fire uses the shared Pulsar broker and so runs with that
# broker's other tests (tests/conftest.py), on one worker.
LOCAL = ("kernel_apply", "overlays", "fire", "storage_apply", "cost", "replay_fold", "console")
KAFKA = ("http_api", "kafka_fire", "kafka_processes", "recovery")
PULSAR = ("pulsar_fire",)


def test_the_parts_are_every_bench() -> None:
    assert sorted((*LOCAL, *KAFKA, *PULSAR)) == sorted(NAMES)


@pytest.mark.slow
@pytest.mark.parametrize("benches", [LOCAL, KAFKA], ids=["local", "kafka"])
def test_quick_suite_runs_every_bench_and_reports_every_figure(
    benches: tuple[str, ...], kafka_bootstrap: str, tmp_path: Path
) -> None:
    _quick_run(benches, {"NEREUS_KAFKA_BOOTSTRAP": kafka_bootstrap}, tmp_path)


@pytest.mark.slow
def test_quick_pulsar_bench_reports_every_figure(
    pulsar_url: str, pulsar_admin_url: str, tmp_path: Path
) -> None:
    env = {"NEREUS_PULSAR_URL": pulsar_url, "NEREUS_PULSAR_ADMIN_URL": pulsar_admin_url}
    _quick_run(PULSAR, env, tmp_path)


def _quick_run(benches: tuple[str, ...], env: dict[str, str], tmp_path: Path) -> None:
    out = tmp_path / "results"
    run = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--only", ",".join(benches), "--out", str(out)],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,  # the output is in the assertion's message
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]

    suite = json.loads((out / "suite.json").read_text())
    assert suite["mode"] == "quick"
    assert suite["git"].get("commit"), suite["git"]
    statuses = {name: bench["status"] for name, bench in suite["benches"].items()}
    assert sorted(statuses) == sorted(benches), statuses
    assert all(s == "ok" for s in statuses.values()), statuses
    for name, bench in suite["benches"].items():
        assert (out / bench["file"]).is_file(), name

    figures = {f["id"]: f for f in suite["figures"]}
    assert figures, "every bench reports figures"
    assert len(figures) == len(suite["figures"]), "figure ids are unique"
    for fig in suite["figures"]:
        assert fig["status"] == "ok", fig
        assert isinstance(fig["value"], int | float), fig
        assert fig["unit"], fig
        if fig["ratio"] is not None:
            assert fig["baseline"], fig  # a ratio always stands beside its raw baseline
    if {"fire", "pulsar_fire"} & set(benches):
        early = [f for f in suite["figures"] if "early" in f["title"]]
        assert early and all(f["value"] == 0 for f in early), early

    for plot in suite["plots"]:
        assert (out / plot).stat().st_size > 0, plot
    if "fire" in benches:
        assert {"fire_lag.png", "apply_rate.png"} <= set(suite["plots"])
    for fig in suite["figures"]:
        assert fig["title"] in run.stdout, f"{fig['title']!r} missing from the printed table"
