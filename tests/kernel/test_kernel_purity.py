"""The kernel must stay sans-IO: parse every module and refuse impure imports.

The scan is only as good as the set of files it reads, so the set is stated here in full: a
kernel module added, renamed or moved out of `kernel/` fails `test_the_kernel_is_exactly_
these_modules` until it is listed (and so scanned). Imports are judged by their module path
as written, `nereus.` prefix or not: `from nereus.storage import x` is as impure as
`import storage`.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

KERNEL = Path(__file__).resolve().parents[2] / "kernel"

# Every module of the kernel package, by path inside `kernel/`.
KERNEL_MODULES = frozenset(
    {
        "__init__.py",
        "codes.py",
        "native.py",
        "commands.py",
        "config.py",
        "digest.py",
        "effects.py",
        "failure.py",
        "invariants.py",
        "keys.py",
        "model.py",
        "mutations.py",
        "overlay.py",
        "records.py",
        "reducer.py",
        "rules.py",
        "specdoc.py",
        "state.py",
        "step.py",
        "timing.py",
        "validation.py",
    }
)

FORBIDDEN = {
    "time",
    "random",
    "uuid",
    "os",
    "socket",
    "threading",
    "asyncio",
    "lmdb",
    "confluent_kafka",
    "storage",
    "runtime",
    "adapters",
    "replay",
    "sim",
    "bench",
    "subprocess",
    "pathlib",
    "io",
    "secrets",
    "multiprocessing",
    "signal",
    "select",
    "shutil",
    "tempfile",
    "logging",
    "sys",
    "ctypes",
    "importlib",
    "urllib",
    "http",
}
# datetime is allowed only for its pure value types; `now()` and friends are the problem.
DATETIME_ALLOWED = {"timedelta", "timezone"}
CALLS = {"open", "__import__", "eval", "exec", "input", "print", "breakpoint", "compile"}


def _modules() -> list[Path]:
    return sorted(KERNEL.rglob("*.py"))


def _impure(module: str) -> bool:
    parts = module.split(".")
    if parts[0] == "nereus":
        # nereus.kernel.x is the kernel itself; anything else under nereus is above it.
        return len(parts) > 1 and parts[1] != "kernel"
    return parts[0] in FORBIDDEN


def _violations(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if _impure(alias.name) or alias.name.split(".")[0] == "datetime":
                    found.append(f"import {alias.name}")
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level == 0 and _impure(module):
                found.append(f"from {module} import ...")
            if node.level == 0 and module == "nereus":
                # _rust: the Rust twins of kernel.native's pure functions (native/src/lib.rs).
                found += [
                    f"from nereus import {a.name}"
                    for a in node.names
                    if a.name not in ("kernel", "_rust")
                ]
            if module.split(".")[0] == "datetime":
                bad = [a.name for a in node.names if a.name not in DATETIME_ALLOWED]
                if bad:
                    found.append(f"from datetime import {', '.join(bad)}")
        elif (
            isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in CALLS
        ):
            found.append(f"call to {node.func.id}()")
    return found


def test_the_kernel_is_exactly_these_modules() -> None:
    found = {str(p.relative_to(KERNEL)) for p in _modules()}
    assert found - KERNEL_MODULES == set(), "new kernel modules: list them in KERNEL_MODULES"
    assert KERNEL_MODULES - found == set(), "kernel modules gone: drop them from KERNEL_MODULES"


@pytest.mark.parametrize("name", sorted(KERNEL_MODULES))
def test_kernel_module_is_pure(name: str) -> None:
    path = KERNEL / name
    assert path.is_file(), f"{path} is missing"
    assert _violations(path) == []


def test_the_checker_catches_impure_imports(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import time\nfrom os import path\nfrom datetime import datetime\n"
        "import storage.lmdb_store\nfrom lmdb import open as o\nopen('x')\n"
        "from nereus.storage.store import ShardStore\nimport nereus.runtime.shard\n"
        "from nereus import adapters\nfrom nereus.sim import world\n"
    )
    assert len(_violations(bad)) == 10


def test_the_checker_accepts_the_kernel_importing_itself(tmp_path: Path) -> None:
    good = tmp_path / "good.py"
    good.write_text(
        "from nereus.kernel.codes import Code\nimport nereus.kernel.timing\n"
        "from nereus import kernel\nfrom datetime import timedelta\nimport msgspec\n"
    )
    assert _violations(good) == []
