"""Crash windows of the store, each hit on purpose instead of by a lucky kill.

A durable write is a sequence of steps: the log entries put (`append`), the folded rows put
(`fold`), the new ShardMeta put (`meta`), all in one write transaction, then the commit and
its sync (`sync`). `ShardStore.fault_hook` names each window; these tests crash in every
one of them, for every kind of write (append, the group commit, apply), and hold the
reopened store to the contract: a crash inside the transaction leaves exactly the store as
it was before the write, a crash after the sync leaves exactly what was committed, and
either way the store equals the replay of its own log (`tests.support.crash_worker.check_reopened`).

Two more views of the same contract, which do not depend on where the hooks sit:

* every write transaction the store commits is a crash point: a copy of the data file taken
  right after each commit (what a killed process leaves behind) must reopen at a position
  some write call had before or after it (never half of a call) and equal its log's replay;
* the same windows in a child process that really dies by SIGKILL there, under the
  power-loss shim (`tests/support/powerloss.py`), and then loses power: what was synced survives,
  and the store is never half a write.
"""

from __future__ import annotations

import dataclasses
import random
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from nereus.storage.schema import StoreOptions
from nereus.storage.store import ShardStore
from tests.support.crash_worker import CONFIG, Workload, check_reopened
from tests.support.powerloss import child_env, cut_power
from tests.support.worker_process import wait_ready

ROOT = Path(__file__).resolve().parents[2]
SEED = 20261202
STEPS_BY_KIND = {
    "append": ("append", "sync"),
    "commit": ("append", "fold", "meta", "sync"),
    "apply": ("fold", "meta", "sync"),
}
CASES = [(kind, step) for kind, steps in STEPS_BY_KIND.items() for step in steps]
# Reopening skips the child-process page walk: these stores are written by this process.
OPTIONS = StoreOptions(check_structure_on_open=False)
WORKLOAD_STEPS = 60
WORKER = (sys.executable, "-m", "tests.support.crash_worker")


class Crash(BaseException):
    """The process 'dies' here: nothing after this point runs."""


def _positions(store: ShardStore) -> tuple[int, int]:
    return store.log_last_position, store.meta.position


def _durable(path: Path) -> tuple[int, int]:
    """(log end, applied) as a newly started process would find them now (from a copy of
    the data file, since LMDB opens an environment once per process)."""
    copy = path.parent / f"{path.name}.now"
    shutil.rmtree(copy, ignore_errors=True)
    copy.mkdir()
    shutil.copyfile(path / "data.mdb", copy / "data.mdb")
    with ShardStore.open(str(copy), config=CONFIG, options=OPTIONS) as store:
        return _positions(store)


def _drive(store: ShardStore, rng: random.Random, kinds: Callable[[], str]) -> Iterator[str]:
    """Writes of each kind in turn, yielding the kind of the write about to be made."""
    workload = Workload(rng, seq=store.log_last_position)
    for _ in range(WORKLOAD_STEPS):
        now_ms = workload.tick()
        items = workload.batch(store, now_ms)
        kind = kinds()
        yield kind
        if kind == "commit":
            store.commit(items, now_ms)
        elif kind == "append":
            store.append(items, now_ms)
        else:
            store.append(items, now_ms)
            yield "apply"
            store.apply_pending()


@pytest.mark.parametrize(("kind", "step"), CASES, ids=[f"{k}-{s}" for k, s in CASES])
def test_a_crash_in_each_window_of_each_write(tmp_path: Path, kind: str, step: str) -> None:
    path = tmp_path / "shard"
    rng = random.Random(SEED)
    store = ShardStore.open(str(path), config=CONFIG, options=OPTIONS)
    current = [""]
    hits = [0]
    seen: dict[str, tuple[int, int]] = {}

    def hook(name: str) -> None:
        if current[0] != kind or name != step:
            return
        hits[0] += 1
        if hits[0] < 3:  # the third such write: the store holds history by then
            return
        seen["before"] = _positions(store)  # nothing in memory has moved on yet
        if step == "sync":
            seen["durable"] = _durable(path)
        raise Crash(step)

    store.fault_hook = hook
    try:
        with pytest.raises(Crash):
            for current[0] in _drive(store, rng, lambda: rng.choice(("commit", "append", "x"))):
                pass
    finally:
        store.close()
    where = f"crash after {step} in {kind} (seed {SEED})"
    assert "before" in seen, f"{where}: the window was never reached"
    check_reopened(str(path), where)
    after = _durable(path)
    if step == "sync":
        assert after == seen["durable"] != seen["before"], where
    else:
        assert after == seen["before"], (
            f"{where}: a write interrupted in its transaction left {after}"
        )


class _SnapshottingEnv:
    """An LMDB environment that copies the data file after every write transaction commits:
    each copy is what a process killed right then would leave."""

    def __init__(self, env: Any, on_commit: Callable[[], None]) -> None:
        self._env = env
        self._on_commit = on_commit

    def begin(self, *args: Any, **kwargs: Any) -> Any:
        txn = self._env.begin(*args, **kwargs)
        return _Txn(txn, self._on_commit) if kwargs.get("write") else txn

    def __getattr__(self, name: str) -> Any:
        return getattr(self._env, name)


class _Txn:
    def __init__(self, txn: Any, on_commit: Callable[[], None]) -> None:
        self._txn = txn
        self._on_commit = on_commit

    def __enter__(self) -> _Txn:
        self._txn.__enter__()
        return self

    def __exit__(self, *exc: Any) -> Any:
        done = self._txn.__exit__(*exc)
        if exc[0] is None:
            self._on_commit()
        return done

    def commit(self) -> None:
        self._txn.commit()
        self._on_commit()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._txn, name)


def test_every_commit_boundary_is_a_consistent_store(tmp_path: Path) -> None:
    """However many transactions a write is made of, a crash between two of them must not
    leave half of it: the positions a copy reopens at are those before or after a write
    call, and its state is its log's replay."""
    path = tmp_path / "shard"
    rng = random.Random(SEED)
    store = ShardStore.open(str(path), config=CONFIG, options=OPTIONS)
    copies: list[tuple[Path, int]] = []  # (copy, index of the write call it was taken in)
    calls: list[tuple[int, int]] = [_positions(store)]  # positions before call i+1

    def snapshot() -> None:
        copy = tmp_path / f"copy-{len(copies)}"
        copy.mkdir()
        shutil.copyfile(path / "data.mdb", copy / "data.mdb")
        copies.append((copy, len(calls)))

    store._env = dataclasses.replace(store.env, env=_SnapshottingEnv(store.env.env, snapshot))
    try:
        for _kind in _drive(store, rng, lambda: rng.choice(("commit", "append", "x"))):
            calls.append(_positions(store))
        calls.append(_positions(store))
    finally:
        store.close()
    assert len(copies) >= WORKLOAD_STEPS, "fewer commits than write calls"
    # calls[i] is the position before call i and after call i-1.
    for copy, call in copies:
        where = f"after commit {copy.name} (seed {SEED})"
        check_reopened(str(copy), where)
        with ShardStore.open(str(copy), config=CONFIG, options=OPTIONS) as reopened_store:
            reopened = _positions(reopened_store)
        allowed = {calls[call - 1], calls[call]} if call < len(calls) else {calls[-1]}
        assert reopened in allowed, f"{where}: half a write: {reopened}, expected one of {allowed}"


@pytest.mark.parametrize("step", ["append", "fold", "meta", "sync"])
def test_sigkill_in_each_window_then_power_loss(tmp_path: Path, step: str) -> None:
    """A real process dies by SIGKILL in the window, then the power goes: synced writes
    survive and every write it was told about is there; nothing is half there."""
    path = tmp_path / "shard"
    shadows = tmp_path / "shadows"
    env = child_env(shadows)
    proc = subprocess.Popen(
        [*WORKER, str(path), str(SEED), "--acks", "--die-at", f"{step}:5"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    where = f"SIGKILL after {step}, then power loss (seed {SEED})"
    try:
        wait_ready(proc, where, 30)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL, f"{where}: {err.decode()[-2000:]}"
    lines = out.decode().splitlines()
    assert lines[-1] == f"dying {step}", f"{where}: {lines[-3:]}"
    acks = [line.split() for line in lines if line.startswith("ack")]
    cut_power(shadows, path / "data.mdb")
    check_reopened(str(path), where)
    with ShardStore.open(str(path), config=CONFIG) as store:
        applied, log_end = store.meta.position, store.log_last_position
        assert acks, f"{where}: nothing was acknowledged before the kill"
        told_applied = max(int(a[1]) for a in acks)
        told_end = max(int(a[2]) for a in acks)
        assert applied >= told_applied and log_end >= told_end, (
            f"{where}: acknowledged up to {told_end} (applied {told_applied}), "
            f"the store after the power loss holds {log_end} (applied {applied})"
        )
        # Nothing past what was acknowledged except the write the kill interrupted, and that
        # only once it had synced.
        if step != "sync":
            assert (log_end, applied) == (told_end, told_applied), where
