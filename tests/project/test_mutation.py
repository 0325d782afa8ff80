"""The mutation score's catalogue, and its quick run (`bench/mutation.py`, `bench/mutants.py`).

Every mutant must still apply to the source as it is: a snippet that no longer occurs
exactly once (code moved, renamed or rewritten) fails here, naming the mutant to retarget,
so that a refactor cannot quietly leave a rule unguarded. The quick run then breaks a few
rules for real (a time rule, an attempt-ledger row, the send gate, durability and a
transaction boundary) and requires the suite to catch each; the full run (45 minutes or so,
`python -m bench.mutation`) is in RELIABILITY.md.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bench.mutants import CATALOGUE
from bench.mutation import check_catalogue

ROOT = Path(__file__).resolve().parents[2]
# The kinds of safety rule the catalogue must cover (issue 22), by mutant id prefix.
KINDS = {
    "T": "time rules",
    "A": "admission checks",
    "E": "expiry checks",
    "O": "proofs of absence",
    "L": "lifecycle and attempt rows",
    "G": "the send gate",
    "R": "recovery",
    "S": "durability",
    "B": "transaction boundaries",
    "M": "batch records and the row memo (issue 19)",
    "K": "one owner per store (issue 30, item 2)",
    "Z": "sealed at rest and private files (issue 31, item 5)",
    "N": "a tenant's deliveries are its own (issue 31, item 4)",
    "H": "which timer a delivery is: the key on every record (issue 32, item 3)",
    "W": "loud on an unbounded clock, and readiness (issue 32, items 1 and 2)",
    "C": "one code list and one result shape (issue 32, item 4)",
    "U": "consumers at least once, woken across processes (issue 32, item 5)",
    "F": "the framing of stored values, in both builds (issue 34)",
    "X": "the compiled folds of the fire's records, against the reducer (issue 34)",
    "V": "the operator console's tenancy, sessions and CSRF (issue 35)",
}


def test_every_mutant_applies_to_the_source() -> None:
    assert check_catalogue(ROOT) == []


def test_the_catalogue_covers_every_kind_of_rule() -> None:
    assert len(CATALOGUE) >= 23
    assert {m.id[0] for m in CATALOGUE} == set(KINDS)
    assert [m.id for m in CATALOGUE if not m.tests] == []
    assert len([m for m in CATALOGUE if m.quick_tests]) >= 5


def test_a_snippet_that_does_not_occur_once_is_refused(tmp_path: Path) -> None:
    (tmp_path / "kernel").mkdir()
    (tmp_path / "kernel" / "timing.py").write_text("x = 1\nx = 1\n")
    problems = check_catalogue(tmp_path, CATALOGUE[:1])
    assert problems and "occurs 0 times" in problems[0]


@pytest.mark.timeout(900)
def test_the_quick_mutants_are_caught() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.mutation", "--quick"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=850,
        check=False,
    )
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    quick = len([m for m in CATALOGUE if m.quick_tests])
    assert f"mutation score: {quick}/{quick} caught" in done.stdout
