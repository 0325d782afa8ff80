"""The generated spec tables must match the kernel's data (and the client answers')."""

from __future__ import annotations

from pathlib import Path

import pytest

from nereus.adapters.specdoc import render_all

SPECS = Path(__file__).resolve().parents[2] / "specs"


@pytest.mark.parametrize("name", sorted(render_all()))
def test_generated_spec_is_current(name: str) -> None:
    committed = (SPECS / name).read_text()
    assert committed == render_all()[name], f"specs/{name} is stale: run scripts/specgen"
