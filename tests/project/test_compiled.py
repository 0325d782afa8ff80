"""The compiled modules (mypyc, setup.py) and their Python source are the same program."""

from __future__ import annotations

import importlib.machinery
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nereus.runtime import compiled

ROOT = Path(__file__).resolve().parents[2]

SIM = """
import runpy, sys
from nereus.runtime import compiled
if sys.argv[1] == "source":
    compiled.prefer_source()
sys.argv = ["sim", "--seeds", "3", "--seed", "101"]
try:
    runpy.run_module("nereus.sim", run_name="__main__")
finally:
    print("compiled:", ",".join(compiled.compiled_modules()) or "-", file=sys.stderr)
"""


def _sim(build: str) -> tuple[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "NEREUS_PURE_PYTHON"}
    done = subprocess.run(
        [sys.executable, "-c", SIM, build],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    figures = [f for f in done.stdout.split() if not f.startswith("seconds=")]
    return " ".join(figures), done.stderr.strip().splitlines()[-1]


def test_compiled_and_source_kernels_agree_on_simulated_histories() -> None:
    if not compiled.extensions() and not os.environ.get("CI"):
        pytest.skip("no compiled kernel here (installed with NEREUS_PURE_PYTHON=1)")
    built, built_modules = _sim("compiled")
    source, source_modules = _sim("source")
    assert "nereus.kernel.reducer" in built_modules
    assert "storage.store" in built_modules
    # The store's hot jobs, each a module of its own: the fold, the log's table, the indexes.
    for hot in ("storage.fold", "storage.log_table", "storage.indexes", "storage.claims"):
        assert hot in built_modules, hot
    assert "runtime.shard" in built_modules
    assert source_modules == "compiled: -"
    assert built == source


def test_an_extension_older_than_its_source_is_refused(tmp_path: Path) -> None:
    ext = tmp_path / f"step{importlib.machinery.EXTENSION_SUFFIXES[0]}"
    ext.write_bytes(b"")
    source = tmp_path / "step.py"
    source.write_text("")
    now = time.time()
    os.utime(source, (now - 5, now - 5))
    compiled.check([tmp_path])  # built after its source: fine
    os.utime(source, (now + 5, now + 5))
    with pytest.raises(compiled.StaleBuild, match=r"step\.py is newer than its compiled module"):
        compiled.check([tmp_path])


def test_only_a_source_checkout_is_checked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An installed wheel's files get their mtimes in extraction order: never stale."""
    package = tmp_path / "kernel"
    package.mkdir()
    (package / f"step{importlib.machinery.EXTENSION_SUFFIXES[0]}").write_bytes(b"")
    source = package / "step.py"
    source.write_text("")
    later = time.time() + 5
    os.utime(source, (later, later))
    monkeypatch.setattr(compiled, "ROOT", tmp_path)
    assert compiled.stale() == []
    (tmp_path / "setup.py").write_text("")
    assert [line.split()[0] for line in compiled.stale()] == [str(source)]
