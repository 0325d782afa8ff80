"""`python -m nereus.replay.audit_child`: the console's audit in a process of its own.

Against real stores and real processes: the child says what it does in JSON lines (its pid,
its progress, then one answer), verifies a store while a writer in another process keeps
committing to it, names the first difference of a tampered store, refuses a store it cannot
trust with the file and the reason, and never outlives the process that started it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import pytest

from nereus import kernel as k
from nereus.replay.audit_child import (
    EXIT_MISMATCH,
    EXIT_OK,
    EXIT_REFUSED,
    Line,
    Progress,
    Refused,
    Started,
    Verified,
    decode_line,
)
from nereus.storage.codec import encode_row
from nereus.storage.store import ShardStore
from tests.support.builders import T0_MS, mid, schedule
from tests.support.worker_process import gone

PAYLOAD = b"payload"
TIMERS = 3_000
BATCH = 500


def _store(path: Path, timers: int = TIMERS) -> None:
    with ShardStore.open(str(path)) as store:
        for start in range(0, timers, BATCH):
            items = [(schedule(f"k{i}"), PAYLOAD) for i in range(start, start + BATCH)]
            store.commit(items, T0_MS)


def _child(path: Path, *, stdin: int | None = subprocess.PIPE) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "nereus.replay.audit_child", str(path)]
    return subprocess.Popen(command, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _lines(proc: subprocess.Popen[bytes]) -> tuple[int, list[Line], str]:
    """The child's exit status, lines and stderr. Its stdin stays open until it ends (not
    `communicate`, which closes it first): an end of stdin is its parent's death."""
    assert proc.stdout is not None and proc.stderr is not None and proc.stdin is not None
    out = proc.stdout.read()
    err = proc.stderr.read()
    code = proc.wait(60)
    proc.stdin.close()
    return code, [decode_line(raw) for raw in out.splitlines()], err.decode()


def test_the_child_verifies_a_store_and_says_so_in_json_lines(tmp_path: Path) -> None:
    _store(tmp_path / "shard")
    code, lines, err = _lines(_child(tmp_path / "shard"))
    assert code == EXIT_OK, err
    first, *middle, last = lines
    assert isinstance(first, Started)
    assert first.parent_pid == os.getpid() and first.pid not in (os.getpid(), 0)
    assert middle and all(isinstance(line, Progress) for line in middle)
    assert middle[-1] == Progress(TIMERS, TIMERS)
    assert isinstance(last, Verified)
    assert last.difference is None and last.replay_digest == last.store_digest
    assert (last.position, last.entries_folded) == (TIMERS, TIMERS)


def test_the_child_verifies_beside_a_writer_that_keeps_committing(tmp_path: Path) -> None:
    """The writer (this process) holds the store's lock; the child opens it read-only and
    compares the state of one read snapshot with the replay up to that state's position."""
    path = tmp_path / "shard"
    _store(path)
    with ShardStore.open(str(path)) as writer:
        proc = _child(path)
        n = 0
        while proc.poll() is None and n < 200:
            writer.commit([(schedule(f"more{n}"), PAYLOAD)], T0_MS + n)
            n += 1
        code, lines, err = _lines(proc)
        end = writer.meta.position
    assert code == EXIT_OK, err
    assert n > 0, "the writer committed while the child read"
    last = lines[-1]
    assert isinstance(last, Verified) and last.difference is None, last
    assert TIMERS <= last.position <= end
    assert last.replay_digest == last.store_digest


def test_the_child_names_the_first_difference_of_a_tampered_store(tmp_path: Path) -> None:
    path = tmp_path / "shard"
    _store(path, timers=BATCH)
    with ShardStore.open(str(path)) as store:
        with store.read() as base:
            row = base.get(k.Table.MESSAGES, mid("k7").encode())
        assert isinstance(row, k.Message)
        tampered = msgspec.structs.replace(row, txn="tampered")
        with store.env.env.begin(write=True) as txn:
            db = store.env.tables[k.Table.MESSAGES]
            txn.put(mid("k7").encode(), encode_row(k.Table.MESSAGES, tampered), db=db)
    code, lines, _ = _lines(_child(path))
    assert code == EXIT_MISMATCH
    last = lines[-1]
    assert isinstance(last, Verified) and last.replay_digest != last.store_digest
    assert last.difference is not None and "tampered" in last.difference


@pytest.mark.parametrize("damage", ["missing", "not_lmdb", "empty_dir"])
def test_the_child_refuses_a_store_it_cannot_trust(tmp_path: Path, damage: str) -> None:
    path = tmp_path / "shard"
    if damage != "missing":
        path.mkdir()
    if damage == "not_lmdb":
        (path / "data.mdb").write_bytes(b"this is no LMDB file" * 512)
    code, lines, err = _lines(_child(path))
    assert code == EXIT_REFUSED, err
    assert isinstance(lines[0], Started)
    last = lines[-1]
    assert isinstance(last, Refused)
    assert str(path) in last.message, last.message


def test_the_child_ends_when_the_process_that_started_it_dies(tmp_path: Path) -> None:
    """A parent killed outright (no code of its own runs) closes the child's stdin: the
    child stops within its orphan bound. The child is held stopped meanwhile, so it cannot
    simply have finished first."""
    _store(tmp_path / "shard")
    parent_code = (
        "import subprocess, sys, time\n"
        "p = subprocess.Popen([sys.executable, '-m', 'nereus.replay.audit_child', sys.argv[1]],"
        " stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)\n"
        "print(p.pid, flush=True)\n"
        "time.sleep(120)\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", parent_code, str(tmp_path / "shard")], stdout=subprocess.PIPE
    )
    assert parent.stdout is not None
    child_pid = int(parent.stdout.readline())
    try:
        os.kill(child_pid, signal.SIGSTOP)
        parent.kill()
        parent.wait()
        os.kill(child_pid, signal.SIGCONT)
        deadline = time.monotonic() + 20
        while not gone(child_pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert gone(child_pid), "the audit outlived the process that started it"
    finally:
        if not gone(child_pid):
            os.kill(child_pid, signal.SIGKILL)
