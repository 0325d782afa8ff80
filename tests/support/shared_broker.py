"""One shared Pulsar broker for tests on several pytest-xdist workers, and the one test
that pauses it.

Theory of operation: every test that takes the `pulsar_url` fixture holds a shared `flock`
on a lock file named after the broker's URL for the whole test (tests/conftest.py); a test
that pauses the broker (SIGSTOP, to make sends time out) converts its hold to an exclusive
one for the pause (`paused_alone`), so it waits for every other Pulsar test in flight to
finish and no other starts until the broker answers again. A flock goes with its process,
so a worker that dies frees it. (pytest-xdist's own `xdist_group` cannot do this here: on
pytest 9.2 the group suffix it writes into a test's id no longer takes effect.)
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

_held: dict[str, int] = {}


def _lock_path(url: str) -> str:
    digest = hashlib.sha256(url.encode()).hexdigest()[:16]
    return os.path.join(tempfile.gettempdir(), f"nereus-tests-pulsar-{digest}.lock")


@contextmanager
def shared_use(url: str) -> Iterator[None]:
    fd = os.open(_lock_path(url), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        _held[url] = fd
        yield
    finally:
        _held.pop(url, None)
        os.close(fd)  # releases the lock


@contextmanager
def paused_alone(url: str) -> Iterator[None]:
    """Exclusive use of the broker for the block: only inside a test that holds the shared
    use (conversion keeps one lock per test, so the test never waits for itself)."""
    fd = _held[url]
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_SH)
