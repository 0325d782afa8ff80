"""The directory lock, in one process: never two owners of a directory (`storage.lock`).

A hypothesis state machine opens and closes, in any order, the things that own directories
(`Nereus.open` of a data directory, which owns DIR and DIR/shard; `ShardStore.open` of a
shard store; a bare `lock_directory`, as a Kafka-mode process or a supervisor takes) on two
data directories, against a model that says which directories are owned. Every open must
succeed exactly when nothing it needs is owned, and be refused otherwise with `StoreLocked`
naming the first owned directory and this process's pid; `holder()` must see exactly the
owned directories. The processes' side of the rule is tests/storage/test_store_lock.py.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, invariant, rule

from nereus.adapters.local.embedded import Nereus
from nereus.storage.errors import StoreError
from nereus.storage.lock import LOCK_NAME, StoreLocked, holder, lock_directory
from nereus.storage.schema import StoreOptions
from nereus.storage.store import ShardStore

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = int(os.environ.get("NEREUS_LOCK_EXAMPLES", "25"))
# The structure walk forks a child per open: the lock is taken before it and is the same
# either way, so the machine skips it to run more steps.
FAST = StoreOptions(check_structure_on_open=False)
DIRECTORIES = 2


class Owner:
    """One successful open and the directories it owns, in the order it took them."""

    def __init__(self, owned: tuple[str, ...], close: Any) -> None:
        self.owned = owned
        self.close = close


class OneOwner(RuleBasedStateMachine):
    owners = Bundle("owners")

    def __init__(self) -> None:
        super().__init__()
        self.root = tempfile.mkdtemp(prefix="nereus-lock-")
        self.model: set[str] = set()  # the owned directories
        self.live: list[Owner] = []

    def _data(self, i: int) -> str:
        return os.path.join(self.root, f"data-{i}")

    def _try(self, needs: tuple[str, ...], open_: Any) -> Owner | None:
        busy = [d for d in needs if d in self.model]
        try:
            close = open_()
        except StoreLocked as exc:
            assert busy, f"refused although {needs} were free: {exc}"
            assert exc.path == busy[0], (exc.path, busy)
            assert exc.holder_pid == os.getpid()
            assert "this process" in str(exc)
            return None
        assert not busy, f"{busy} opened a second time"
        self.model.update(needs)
        self.live.append(Owner(needs, close))
        return self.live[-1]

    @rule(target=owners, i=st.integers(0, DIRECTORIES - 1))
    def open_nereus(self, i: int) -> Owner | None:
        data = self._data(i)

        def go() -> Any:
            return Nereus.open(data, assume_clock_error_ms=5, store_options=FAST).close

        return self._try((data, os.path.join(data, "shard")), go)

    @rule(target=owners, i=st.integers(0, DIRECTORIES - 1))
    def open_store(self, i: int) -> Owner | None:
        path = os.path.join(self._data(i), "shard")
        return self._try((path,), lambda: ShardStore.open(path, options=FAST).close)

    @rule(target=owners, i=st.integers(0, DIRECTORIES - 1))
    def lock_data(self, i: int) -> Owner | None:
        data = self._data(i)

        def go() -> Any:
            os.makedirs(data, exist_ok=True)
            return lock_directory(data).release

        return self._try((data,), go)

    @rule(owner=consumes(owners))
    def close(self, owner: Owner | None) -> None:
        if owner is None:
            return
        owner.close()
        self.live.remove(owner)
        self.model.difference_update(owner.owned)

    @invariant()
    def holder_sees_exactly_the_owned_directories(self) -> None:
        for i in range(DIRECTORIES):
            data = self._data(i)
            for path in (data, os.path.join(data, "shard")):
                seen = holder(path)
                if path in self.model:
                    assert seen is not None and seen.pid == os.getpid(), (path, seen)
                else:
                    assert seen is None, (path, seen)

    def teardown(self) -> None:
        for owner in self.live:
            owner.close()
        shutil.rmtree(self.root, ignore_errors=True)


OneOwner.TestCase.settings = settings(max_examples=EXAMPLES, stateful_step_count=15, deadline=None)
test_never_two_owners_of_one_directory = OneOwner.TestCase


def test_the_lock_says_who_holds_it_and_is_left_in_place(tmp_path: Path) -> None:
    path = str(tmp_path / "shard")
    store = ShardStore.open(path, options=FAST)
    seen = holder(path)
    assert seen is not None and seen.pid == os.getpid()
    assert "pytest" in seen.command or "python" in seen.command
    store.close()
    assert holder(path) is None
    # Never deleted: a removed file could be locked by one opener while another locks a new
    # one under the same name.
    assert os.path.exists(os.path.join(path, LOCK_NAME))
    ShardStore.open(path, options=FAST).close()


def test_a_read_only_open_here_beside_this_process_writer_is_refused(tmp_path: Path) -> None:
    path = str(tmp_path / "shard")
    with (
        ShardStore.open(path, options=FAST),
        pytest.raises(StoreError, match="this process has the store open for writing"),
    ):
        ShardStore.open(path, create=False, read_only=True)
    with pytest.raises(ValueError, match="cannot create"):
        ShardStore.open(path, read_only=True)


_WRITER = """
import sys
from nereus.runtime import compiled
compiled.from_environment()
from nereus.storage.schema import StoreOptions
from nereus.storage.store import ShardStore
ShardStore.open(sys.argv[1], create=False, options=StoreOptions()).close()
"""


def test_a_reader_takes_no_lock(tmp_path: Path) -> None:
    path = str(tmp_path / "shard")
    ShardStore.open(path, options=FAST).close()
    with ShardStore.open(path, create=False, read_only=True) as reader:
        assert holder(path) is None
        # A writer in another process opens the store while this one reads it.
        done = subprocess.run(
            [sys.executable, "-c", _WRITER, path],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert reader.meta.position == 0
        with pytest.raises(Exception, match="read-only"):
            reader.append([], 0)


def test_a_reader_never_migrates_an_older_store(tmp_path: Path) -> None:
    golden = (
        ROOT / "tests" / "support" / "golden" / "2026-12-commands-v1-export-v3-schema-5" / "store"
    )
    path = tmp_path / "store"
    shutil.copytree(golden, path)
    before = (path / "data.mdb").read_bytes()
    with pytest.raises(StoreError, match="schema version 5 must be migrated to"):
        ShardStore.open(str(path), create=False, read_only=True)
    assert (path / "data.mdb").read_bytes() == before
    with ShardStore.open(str(path), create=False) as writer:  # a writer migrates it
        assert writer.header.schema_version > 5
    with ShardStore.open(str(path), create=False, read_only=True) as reader:
        assert reader.header.schema_version == writer.header.schema_version
