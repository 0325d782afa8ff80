"""LMDB data files seen from outside, for the tests of storage/lmdbcheck.py.

`newest_meta` reads the two meta pages with a few struct unpacks of its own (not the module
under test), `pages_past_eof` says how many pages the newest meta counts that the file does
not hold, and `build_short_store` makes a real shard store in that state: a commit schedules
a large payload and cancels it, so LMDB allocates an overflow run at the end of the file and
frees it again before the commit writes it. `build_full_store` makes the ordinary kind, whose
file holds every page up to the last one counted.

`lmdb_verdict` asks LMDB itself, in a forked child, whether it can read every row of the
main database and of each named database and, with `write`, also commit a write transaction
(a writer reads the free list). A file LMDB cannot use kills the child with SIGBUS.
`ask_in_child` is that forked child, for any question about such a file: a signal that kills
it is an answer, never the end of the test run.
"""

from __future__ import annotations

import faulthandler
import json
import os
import random
import signal
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import lmdb

from nereus import kernel as k
from nereus.service.arguments import schedule_record
from nereus.storage.store import ShardStore
from tests.support.builders import T0_MS


@dataclass(frozen=True)
class MetaPage:
    psize: int
    free_root: int
    main_root: int
    last_pg: int
    txnid: int


def newest_meta(data_file: Path) -> MetaPage:
    with data_file.open("rb") as f:
        head = f.read(152)
        (psize,) = struct.unpack_from("<I", head, 40)
        f.seek(psize)
        metas = [head, f.read(152)]
    pages = [
        MetaPage(
            psize,
            *struct.unpack_from("<Q", blob, 80),
            *struct.unpack_from("<Q", blob, 128),
            *struct.unpack_from("<QQ", blob, 136),
        )
        for blob in metas
    ]
    return max(pages, key=lambda m: m.txnid)


def pages_past_eof(data_file: Path) -> int:
    """Pages up to the newest meta's last page that the file does not wholly hold."""
    meta = newest_meta(data_file)
    return max(0, meta.last_pg + 1 - data_file.stat().st_size // meta.psize)


KEPT = 12  # schedules kept by build_short_store, each with a KEPT_SIZE payload
KEPT_SIZE = 20_000


def kept_payload(i: int) -> bytes:
    return random.Random(i).randbytes(KEPT_SIZE)


def build_short_store(path: Path) -> None:
    """A shard store whose newest meta page counts pages past the end of its file: each
    commit keeps one schedule and schedules-then-cancels a 100 KB payload."""
    rng = random.Random(15)
    with ShardStore.open(str(path)) as store:
        for i in range(KEPT):
            store.commit(
                [
                    schedule_record("q", f"keep{i}", kept_payload(i), delay_ms=3_600_000),
                    schedule_record("q", "gone", rng.randbytes(100_000), delay_ms=3_600_000),
                    (k.Cancel("default", "q", "gone"), None),
                ],
                T0_MS + i,
            )
    assert pages_past_eof(path / "data.mdb") > 0, "the write pattern no longer leaves a gap"


def build_full_store(path: Path) -> None:
    """A shard store written the ordinary way, whose file holds every page its newest meta
    counts: its last page is one the last commit wrote (LMDB puts the free list's new root
    there), so a copy cut by exactly that page is one LMDB cannot write to."""
    rng = random.Random(16)
    with ShardStore.open(str(path)) as store:
        for i in range(KEPT):
            items = [
                schedule_record(
                    "q", f"full{i}-{j}", rng.randbytes(rng.choice((50, 3_000))), delay_ms=3_600_000
                )
                for j in range(10)
            ]
            store.commit(items, T0_MS + i)
    assert pages_past_eof(path / "data.mdb") == 0, "the write pattern now leaves a gap"


@dataclass(frozen=True)
class Verdict:
    signal: str | None  # the signal that killed the child, if one did
    rows: dict[str, int]  # database name ("" for the main one) -> rows read
    said: str

    @property
    def usable(self) -> bool:
        return self.signal is None and bool(self.rows)


def lmdb_verdict(path: Path, *, write: bool = False) -> Verdict:
    """What LMDB makes of the environment at `path`, asked in a forked child: read every
    row of every database and, with `write`, commit a write (a writer reads the free list)."""
    answer = ask_in_child(lambda: json.dumps(_read_every_row(str(path), write)))
    if answer.signal is not None:
        return Verdict(answer.signal, {}, answer.said)
    return Verdict(None, json.loads(answer.said) if answer.exit_code == 0 else {}, answer.said)


@dataclass(frozen=True)
class ChildAnswer:
    signal: str | None  # the signal that killed the child, if one did
    exit_code: int  # 0 when the question returned, 3 when it raised
    said: str  # what the question returned, or the repr of what it raised


def ask_in_child(question: Callable[[], str]) -> ChildAnswer:
    """Run `question` in a forked child with the fault handler off (a SIGBUS there is an
    answer, not a crash to report) and bring back what it said through a pipe."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: answer through the pipe, never return
        code = 0
        try:
            os.close(read_fd)
            faulthandler.disable()
            os.write(write_fd, question().encode())
        except BaseException as exc:
            os.write(write_fd, repr(exc).encode()[:2000])
            code = 3
        os._exit(code)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as pipe:
        said = pipe.read().decode(errors="replace")
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return ChildAnswer(signal.Signals(os.WTERMSIG(status)).name, -1, said)
    return ChildAnswer(None, os.WEXITSTATUS(status), said)


def _read_every_row(path: str, write: bool) -> dict[str, int]:
    env = lmdb.open(path, max_dbs=64, readonly=not write, create=False, readahead=False)
    rows: dict[str, int] = {}
    with env.begin() as txn:
        names = list(txn.cursor().iternext(values=False))
        rows[""] = len(names)
        for name in names:
            db = env.open_db(name, txn=txn, create=False)
            rows[name.decode()] = sum(1 for _ in txn.cursor(db=db).iternext(values=True))
    if write:
        db = env.open_db(b"lmdb-files-probe")
        with env.begin(write=True, db=db) as txn:
            txn.put(b"\xff-lmdb-files-probe", b"x" * 50_000)
        with env.begin(write=True, db=db) as txn:
            txn.delete(b"\xff-lmdb-files-probe")
    env.close()
    return rows
