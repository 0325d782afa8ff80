"""The README's library examples must run as written (each block after a readme-example
marker; every wait in them has a deadline)."""

from __future__ import annotations

import ast
import re
import tempfile
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"


def _examples() -> list[str]:
    text = README.read_text()
    blocks = []
    for marker in re.finditer(r"<!-- readme-example", text):
        match = re.search(r"```python\n(.*?)```", text[marker.start() :], re.S)
        assert match is not None, "a readme-example marker without its python block"
        blocks.append(match.group(1))
    assert blocks, "the README lost its library example"
    return blocks


@pytest.mark.parametrize("index", range(len(_examples())))
def test_readme_library_example_runs(
    index: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    code = _examples()[index]
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    exec(compile(code, f"README.md example {index + 1}", "exec"), {})


@pytest.mark.parametrize("index", range(len(_examples())))
def test_every_wait_in_the_examples_has_a_deadline(index: int) -> None:
    """A wait for a delivery must fail when it never comes, not hang the suite: a `while`
    loop needs an assert in its body, a consumer's wait an `idle_timeout_s`."""
    tree = ast.parse(_examples()[index])
    for loop in (n for n in ast.walk(tree) if isinstance(n, ast.While)):
        asserts = [n for n in ast.walk(loop) if isinstance(n, ast.Assert)]
        assert asserts, f"the wait loop at example line {loop.lineno} has no deadline"
    for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call)):
        func = call.func
        consumer_wait = (
            isinstance(func, ast.Attribute)
            and func.attr in ("run", "records")
            and not (isinstance(func.value, ast.Name) and func.value.id == "asyncio")
        )
        if consumer_wait:
            keywords = {k.arg for k in call.keywords}
            assert "idle_timeout_s" in keywords, f"the wait at example line {call.lineno}"
