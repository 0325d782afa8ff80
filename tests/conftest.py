"""Suite-wide setup: which kernel build the tests run against, and the root logger put back
after every test.

The tests run the compiled kernel that `pip install -e .` builds (setup.py), and refuse to
start when a compiled module is older than its source, since the edit would not be tested.
`NEREUS_PURE_PYTHON=1 .venv/bin/pytest` runs them against the kernel's Python source instead.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator

import pytest

from nereus.runtime import compiled
from tests.support.shared_broker import shared_use

compiled.from_environment()


def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get("NEREUS_PURE_PYTHON"):
        return
    try:
        compiled.check()
    except compiled.StaleBuild as exc:
        raise pytest.UsageError(str(exc)) from None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Modules with slow tests first, each module's tests in their own order, so that under
    pytest-xdist (`--dist loadfile`, scripts/test: a module runs whole on one worker, and a
    module-scoped fixture is made once) the last module to start is a short one."""
    slow_modules = {item.nodeid.split("::")[0] for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.nodeid.split("::")[0] not in slow_modules)


@pytest.fixture(autouse=True)
def _shared_pulsar_broker(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test of the shared Pulsar broker holds it shared while it runs, so that one that
    pauses it waits for the others (tests/support/shared_broker.py)."""
    if "pulsar_url" not in request.fixturenames:
        yield
        return
    with shared_use(request.getfixturevalue("pulsar_url")):
        yield


def pytest_report_header(config: pytest.Config) -> str:
    return f"nereus kernel: {compiled.describe()}"


@pytest.fixture(autouse=True)
def _root_logging_restored() -> Iterator[None]:
    """A test that runs `nereus serve` in-process installs the service's JSON handler on the
    root logger, writing to the stream pytest captured for that test; put the logger back,
    or threads of later tests log into a closed stream."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
