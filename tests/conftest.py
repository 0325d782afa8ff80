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

compiled.from_environment()


def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get("NEREUS_PURE_PYTHON"):
        return
    try:
        compiled.check()
    except compiled.StaleBuild as exc:
        raise pytest.UsageError(str(exc)) from None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """How pytest-xdist (`--dist loadgroup`, scripts/test) shares the tests out: a test
    module runs whole on one worker, in its own order, so a module-scoped fixture (a served
    directory, a built wheel, a broker of the module's own) is made once; and every test of
    the shared Pulsar broker runs on one worker, since some pause that broker (SIGSTOP) to
    make sends time out, which would fail any other test using it at that moment (Kafka tests
    that pause or stop a broker use one of their own, tests/own_broker.py). Modules with slow
    tests go first, so that the last module to start is a short one."""
    for item in items:
        shared = "pulsar_url" in getattr(item, "fixturenames", ())
        group = "shared-pulsar" if shared else item.nodeid.split("::")[0]
        item.add_marker(pytest.mark.xdist_group(group))
    slow_modules = {item.nodeid.split("::")[0] for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.nodeid.split("::")[0] not in slow_modules)


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
