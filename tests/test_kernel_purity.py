"""The kernel must stay sans-IO: parse every module and refuse impure imports."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

KERNEL = Path(__file__).resolve().parent.parent / "kernel"

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
    "subprocess",
    "pathlib",
    "io",
    "secrets",
    "multiprocessing",
    "signal",
}
# datetime is allowed only for its pure value types; `now()` and friends are the problem.
DATETIME_ALLOWED = {"timedelta", "timezone"}


def _modules() -> list[Path]:
    return sorted(KERNEL.rglob("*.py"))


def _violations(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                root = alias.name.split(".")[0]
                if root in FORBIDDEN or root == "datetime":
                    found.append(f"import {alias.name}")
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            root = module.split(".")[0]
            if node.level == 0 and root in FORBIDDEN:
                found.append(f"from {module} import ...")
            if root == "datetime":
                bad = [a.name for a in node.names if a.name not in DATETIME_ALLOWED]
                if bad:
                    found.append(f"from datetime import {', '.join(bad)}")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in {"open", "__import__", "eval", "exec", "input", "print"}
        ):
            found.append(f"call to {node.func.id}()")
    return found


def test_kernel_has_modules() -> None:
    assert len(_modules()) >= 5


@pytest.mark.parametrize("path", _modules(), ids=lambda p: p.name)
def test_kernel_module_is_pure(path: Path) -> None:
    assert _violations(path) == []


def test_the_checker_catches_impure_imports(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import time\nfrom os import path\nfrom datetime import datetime\n"
        "import storage.lmdb_store\nfrom lmdb import open as o\nopen('x')\n"
    )
    assert len(_violations(bad)) == 6
