"""What importing a module really loads: a second guard of the import rules, at run time.

`tests/project/test_layers.py` judges the imports as written; this test imports a module in a fresh
interpreter and looks at `sys.modules`, so an import hidden from the parser (through
`importlib`, a re-export, a module that imports another on load) is caught too. The rules
checked (specs/layers.md): replay loads no edge at all; the tenancy and the configuration
file's schema load no edge (the adapters package's facade aside, which loads the embedded
library); an edge loads no other edge (the same facade aside).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

EDGE_PACKAGES = ("http", "cli", "kafka", "pulsar", "compose")

# module -> the adapters packages it must not load. `nereus.adapters` itself re-exports the
# embedded library (adapters/local) on import, so every module under nereus.adapters loads
# that package; the local edge is therefore judged by the parser test only.
CASES = {
    "nereus.replay.cli": ("nereus.adapters",),
    "nereus.adapters.tenancy": tuple(f"nereus.adapters.{e}" for e in EDGE_PACKAGES),
    "nereus.adapters.config_file": tuple(f"nereus.adapters.{e}" for e in EDGE_PACKAGES),
    "nereus.adapters.pulsar.config": tuple(
        f"nereus.adapters.{e}" for e in EDGE_PACKAGES if e != "pulsar"
    ),
    "nereus.adapters.http.contract": tuple(
        f"nereus.adapters.{e}" for e in EDGE_PACKAGES if e != "http"
    ),
}


def _loaded(module: str) -> list[str]:
    code = (
        "import importlib, json, sys\n"
        f"importlib.import_module({module!r})\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('nereus'))))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    names: list[str] = json.loads(out.stdout)
    return names


@pytest.mark.parametrize("module", sorted(CASES))
def test_a_module_loads_no_edge_it_may_not_import(module: str) -> None:
    loaded = _loaded(module)
    assert module in loaded
    forbidden = [
        name
        for name in loaded
        for prefix in CASES[module]
        if name == prefix or name.startswith(prefix + ".")
    ]
    assert forbidden == [], f"importing {module} loads {forbidden}"
