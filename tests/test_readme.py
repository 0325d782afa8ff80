"""The README's library example must run as written."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"


def _example() -> str:
    text = README.read_text()
    marker = text.index("<!-- readme-example")
    match = re.search(r"```python\n(.*?)```", text[marker:], re.S)
    assert match is not None, "the README lost its library example"
    return match.group(1)


def test_readme_library_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code = _example()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "README.md", "exec"), {})
