"""The size limits of product code, kept by parsing every product module.

A module stays under 500 lines, a class under 300, a function under 70 (STYLE.md, items 9
and 10), so that each can be read in one sitting. A class or function is measured from its
`class`/`def` line to its last line, docstring and nested code included, so a nested helper
counts twice: once alone and once inside its owner. Data literals get no exemption: a table
too long for its module moves to a data file or is generated.

The product is every layer folder that `nereus/` links (kernel, storage, runtime, service,
replay, sim, adapters) plus `nereus/` itself; the set is stated here in full and checked
against the links, so a new layer cannot escape the scan by not being listed.
"""

from __future__ import annotations

import ast
from pathlib import Path

MODULE_LINES_MAX = 500
CLASS_LINES_MAX = 300
FUNCTION_LINES_MAX = 70

LAYERS = frozenset({"kernel", "storage", "runtime", "service", "replay", "sim", "adapters"})


def _root() -> Path:
    # Found by walking up rather than by a fixed depth, so the test may move between folders.
    for folder in Path(__file__).resolve().parents:
        if (folder / "pyproject.toml").is_file() and (folder / "nereus").is_dir():
            return folder
    raise AssertionError("no project root above this test")


ROOT = _root()


def _product_modules() -> list[Path]:
    found = [p for layer in sorted(LAYERS) for p in (ROOT / layer).rglob("*.py")]
    found += [p for p in (ROOT / "nereus").glob("*.py") if not p.is_symlink()]
    return sorted(found)


class _Definitions(ast.NodeVisitor):
    """Every class and function with its qualified name and lines, nested ones too, under
    `if`, `try`, `with` or `match` as well as at the top."""

    def __init__(self) -> None:
        self.found: list[tuple[str, str, int]] = []
        self._names: list[str] = []

    def _define(self, node: ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        assert node.end_lineno is not None
        self._names.append(node.name)
        kind = "class" if isinstance(node, ast.ClassDef) else "function"
        self.found.append((kind, ".".join(self._names), node.end_lineno - node.lineno + 1))
        self.generic_visit(node)
        self._names.pop()

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self._define(node)

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self._define(node)

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> None:
        self._define(node)


def oversized(source: str, where: str) -> dict[str, str]:
    """Every part of `source` over its limit, keyed `where` (the module) or `where:Qual.name`,
    each with its measure."""
    found: dict[str, str] = {}
    module_lines = len(source.splitlines())
    if module_lines > MODULE_LINES_MAX:
        found[where] = f"module of {module_lines} lines (max {MODULE_LINES_MAX})"
    limits = {"class": CLASS_LINES_MAX, "function": FUNCTION_LINES_MAX}
    definitions = _Definitions()
    definitions.visit(ast.parse(source))
    for kind, name, lines in definitions.found:
        if lines > limits[kind]:
            found[f"{where}:{name}"] = f"{kind} of {lines} lines (max {limits[kind]})"
    return found


def _product_offenders() -> dict[str, str]:
    found: dict[str, str] = {}
    for path in _product_modules():
        found.update(oversized(path.read_text(), str(path.relative_to(ROOT))))
    return found


def test_the_product_is_exactly_these_layers() -> None:
    linked = {p.name for p in (ROOT / "nereus").iterdir() if p.is_symlink() and p.is_dir()}
    assert linked == LAYERS


def test_no_product_module_class_or_function_is_over_its_limit() -> None:
    offenders = _product_offenders()
    assert offenders == {}, "split these:\n" + "\n".join(
        f"  {k}: {v}" for k, v in offenders.items()
    )


def _function(name: str, body_lines: int, indent: str = "") -> str:
    body = "".join(f"{indent}    x{i} = {i}\n" for i in range(body_lines))
    return f"{indent}def {name}() -> None:\n{body}"


def test_the_checker_measures_a_function_from_def_to_last_line() -> None:
    assert oversized(_function("fits", FUNCTION_LINES_MAX - 1), "m.py") == {}
    assert oversized(_function("too_long", FUNCTION_LINES_MAX), "m.py") == {
        "m.py:too_long": "function of 71 lines (max 70)"
    }


def test_the_checker_counts_the_docstring_and_names_nested_offenders() -> None:
    docstring = '        """Three\n        lines\n        long."""\n'
    body = "".join(f"        x{i} = {i}\n" for i in range(FUNCTION_LINES_MAX - 3))
    source = "class Owner:\n    def method(self) -> None:\n" + docstring + body
    assert oversized(source, "m.py") == {"m.py:Owner.method": "function of 71 lines (max 70)"}
    shorter = (
        "class Owner:\n    def method(self) -> None:\n" + docstring + body[body.index("\n") + 1 :]
    )
    assert oversized(shorter, "m.py") == {}


def test_the_checker_catches_an_oversized_class() -> None:
    methods = "".join(_function(f"m{i}", 9, indent="    ") for i in range(30))
    source = "class Big:\n" + methods + "    pass\n"
    assert oversized(source, "m.py") == {"m.py:Big": "class of 302 lines (max 300)"}


def test_the_checker_catches_an_oversized_module_and_definitions_under_if() -> None:
    source = "import sys\n" * 450 + "if sys:\n" + _function("hidden", 71, indent="    ")
    assert oversized(source, "m.py") == {
        "m.py": "module of 523 lines (max 500)",
        "m.py:hidden": "function of 72 lines (max 70)",
    }


def test_the_limits_themselves_are_allowed() -> None:
    assert oversized("x = 1\n" * MODULE_LINES_MAX, "m.py") == {}
    methods = "".join(_function(f"m{i}", 9, indent="    ") for i in range(29))
    at_limit = "class Fits:\n" + methods + "    pass\n" * 9
    assert len(at_limit.splitlines()) == CLASS_LINES_MAX
    assert oversized(at_limit, "m.py") == {}
    assert oversized(at_limit + "    pass\n", "m.py") == {
        "m.py:Fits": "class of 301 lines (max 300)"
    }
