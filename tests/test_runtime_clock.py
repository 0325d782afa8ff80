"""The runtime reads time only from its clock source: no module under runtime/ imports a
clock (`time`, `datetime`) of its own, so a tick does the same with the same readings on any
thread, in the loop, on a caller's thread or in the simulator.

One exception, named here: the embedded shard log times its group commits for the
`nereus_commit_duration_seconds` histogram, a measurement that decides nothing.
"""

from __future__ import annotations

import ast
from pathlib import Path

RUNTIME = Path(__file__).resolve().parent.parent / "runtime"
CLOCKS = {"time", "datetime"}
MEASURES_ONLY = {"shardlog.py"}


def _clock_imports(path: Path) -> list[str]:
    found: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.split(".")[0] in CLOCKS]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            module = node.module or ""
            found += [module] if module.split(".")[0] in CLOCKS else []
    return found


def test_no_runtime_module_reads_a_clock_of_its_own() -> None:
    modules = sorted(RUNTIME.glob("*.py"))
    assert len(modules) > 10
    reading = {p.name: _clock_imports(p) for p in modules}
    assert {name for name, found in reading.items() if found} == MEASURES_ONLY
