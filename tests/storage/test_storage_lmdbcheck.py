"""The pre-open check of LMDB data files (storage/lmdbcheck.py) agrees with LMDB itself.

LMDB's newest meta page may count pages that its file never received: a commit that
allocates an overflow run at the end of the file and frees it again writes neither
(issue 15, item 3). Such a store is complete and must open. A file cut short where LMDB
would read a page must still be refused, naming the file, before LMDB maps it. Each verdict
is checked against LMDB's own, asked in a forked child (tests/support/lmdb_files.py): a file the
check accepts can be read in full and written by LMDB, one it refuses kills LMDB with SIGBUS.
"""

from __future__ import annotations

import functools
import hashlib
import random
import shutil
import struct
from collections.abc import Callable
from pathlib import Path

import lmdb
import pytest

from nereus.storage import lmdbcheck
from nereus.storage.errors import StoreError
from nereus.storage.lmdbcheck import check_data_file
from nereus.storage.store import ShardStore
from tests.support.lmdb_files import (
    KEPT,
    build_full_store,
    build_short_store,
    kept_payload,
    lmdb_verdict,
    newest_meta,
    pages_past_eof,
)

SHARD_DATABASES = 15


def build_short_env(path: Path, *, gap: bool = True) -> None:
    """An LMDB environment of another shape, written with python-lmdb directly: values of
    every size, a DUPSORT database with sub-trees of duplicates and a DUPFIXED one, then a
    commit that puts and deletes a 300 KB value once the free list has pages to reuse (with
    `gap`; without, the file holds every page up to the last one counted)."""
    rng = random.Random(3)
    env = lmdb.open(str(path), map_size=1 << 30, max_dbs=8)
    plain = env.open_db(b"plain")
    dups = env.open_db(b"dups", dupsort=True)
    fixed = env.open_db(b"fixed", dupsort=True, dupfixed=True)
    with env.begin(write=True) as txn:
        for i in range(300):
            txn.put(b"k%04d" % i, rng.randbytes(rng.choice((10, 500, 9_000))), db=plain)
        for i in range(3_000):
            txn.put(b"d%d" % (i % 4), b"duplicate %06d" % i, db=dups)
            txn.put(b"f%d" % (i % 3), struct.pack(">Q", i), db=fixed)
    with env.begin(write=True) as txn:
        for i in range(0, 300, 2):
            txn.delete(b"k%04d" % i, db=plain)
    if gap:
        with env.begin(write=True) as txn:
            txn.put(b"big", rng.randbytes(300_000), db=plain)
            txn.delete(b"big", db=plain)
    env.close()
    assert (pages_past_eof(path / "data.mdb") > 0) == gap, "the write pattern changed"


def _built_once(folder: str, name: str, build: Callable[[Path], None]) -> object:
    """A module-scoped fixture: the path `name` in a fresh folder, written by `build` once
    for the module's tests (they only read it, or copy it)."""

    @pytest.fixture(scope="module")
    def fixture(tmp_path_factory: pytest.TempPathFactory) -> Path:
        path = tmp_path_factory.mktemp(folder) / name
        build(path)
        return path

    return fixture


short_store = _built_once("store", "shard", build_short_store)
short_env = _built_once("env", "env", build_short_env)
full_store = _built_once("full-store", "shard", build_full_store)
full_env = _built_once("full-env", "env", functools.partial(build_short_env, gap=False))


@pytest.fixture(params=["as_shipped", "free_list_answer_ignored"])
def steps(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The check as shipped, or with the free list's answer (step 2) ignored, so that the
    reachability walk (step 3) decides every case alone. The free-list tree is still walked
    (a writer reads it)."""
    if request.param == "free_list_answer_ignored":
        walk_free_list = lmdbcheck._Walk.free_list_covers_the_gap

        def walked_but_ignored(self: lmdbcheck._Walk) -> bool:
            walk_free_list(self)
            return False

        monkeypatch.setattr(lmdbcheck._Walk, "free_list_covers_the_gap", walked_but_ignored)
    return str(request.param)


def cut_copy(source: Path, size: int, where: Path) -> Path:
    """A copy of the environment at `source` whose data file keeps its first `size` bytes."""
    shutil.rmtree(where, ignore_errors=True)
    where.mkdir(parents=True)
    with (source / "data.mdb").open("rb") as f:
        (where / "data.mdb").write_bytes(f.read(size))
    return where / "data.mdb"


def refusal(data_file: Path) -> StoreError | None:
    try:
        check_data_file(str(data_file))
    except StoreError as exc:
        return exc
    return None


# The false refusal ------------------------------------------------------------------------


def test_a_shard_store_with_pages_counted_past_the_end_of_its_file_opens(
    short_store: Path, tmp_path: Path
) -> None:
    data_file = short_store / "data.mdb"
    assert pages_past_eof(data_file) > 0
    verdict = lmdb_verdict(short_store)
    assert verdict.usable, verdict
    assert len(verdict.rows) == 1 + SHARD_DATABASES
    assert verdict.rows["payload_bytes"] == KEPT
    assert refusal(data_file) is None
    shutil.copytree(short_store, tmp_path / "shard")
    # Every pre-open check (this one, the structure walk, the invariants), then reads.
    with ShardStore.open(str(tmp_path / "shard"), create=False) as store:
        entries = list(store.iter_log())
        assert len(entries) == store.meta.position == verdict.rows["log"]
        for i in range(KEPT):
            payload = kept_payload(i)
            assert store.payload(hashlib.sha256(payload).hexdigest()) == payload


@pytest.mark.parametrize("source", ["short_store", "short_env"])
def test_files_with_pages_past_their_end_pass_each_step(
    request: pytest.FixtureRequest, source: str, steps: str
) -> None:
    """Also an environment of another shape (DUPSORT sub-trees, DUPFIXED pages), and also
    when the reachability walk alone decides."""
    path: Path = request.getfixturevalue(source)
    assert pages_past_eof(path / "data.mdb") > 0
    verdict = lmdb_verdict(path)
    assert verdict.usable, verdict
    if source == "short_env":
        assert verdict.rows["fixed"] == verdict.rows["dups"] == 3_000
    assert refusal(path / "data.mdb") is None


# Real truncations -------------------------------------------------------------------------


def overflow_run_of(data_file: Path, value: bytes) -> tuple[int, int]:
    """(first page, page count) of the overflow run holding `value`, found by its bytes."""
    psize = newest_meta(data_file).psize
    blob = data_file.read_bytes()
    at = blob.find(value)
    assert at > 0 and blob.find(value, at + 1) < 0, "the value must be stored exactly once"
    first = at // psize  # the value starts on the run's first page, after a small frame
    pgno, _pad, flags, count = struct.unpack_from("<QHHI", blob, first * psize)
    assert pgno == first and flags & 0x04 and count > 1, "not the start of an overflow run"
    return first, count


@pytest.mark.parametrize(
    "where",
    ["inside_the_free_list_root", "inside_an_overflow_run", "at_the_main_root", "half"],
)
def test_a_truncated_short_store_is_refused_naming_the_file(
    short_store: Path, tmp_path: Path, where: str
) -> None:
    data_file = short_store / "data.mdb"
    meta = newest_meta(data_file)
    psize = meta.psize
    if where == "inside_the_free_list_root":
        size = meta.free_root * psize + psize // 2
    elif where == "inside_an_overflow_run":
        first, count = overflow_run_of(data_file, kept_payload(KEPT // 2))
        size = (first + count // 2) * psize + 100
    elif where == "at_the_main_root":
        size = meta.main_root * psize
    else:
        size = data_file.stat().st_size // 2
    cut = cut_copy(short_store, size, tmp_path / "cut")
    error = refusal(cut)
    assert error is not None, f"a cut at {size} bytes was accepted"
    assert error.path == str(cut)
    assert str(error).startswith(f"{cut}: truncated: the file is {size} bytes"), str(error)
    assert "page" in str(error) and "referenced from" in str(error), str(error)
    verdict = lmdb_verdict(cut.parent, write=True)
    assert verdict.signal == "SIGBUS", f"LMDB did not need the cut pages: {verdict}"
    with pytest.raises(StoreError) as caught:
        ShardStore.open(str(cut.parent), create=False)
    assert caught.value.path == str(cut)


@pytest.mark.parametrize("source", ["short_store", "short_env", "full_store", "full_env"])
def test_every_cut_is_refused_exactly_when_lmdb_would_crash(
    request: pytest.FixtureRequest, tmp_path: Path, source: str, steps: str
) -> None:
    """Cut the file at every page boundary: the check accepts exactly the copies LMDB can
    read in full and write to (the cuts that remove only free pages leave a complete file)
    and refuses the others, which make LMDB die of SIGBUS. A cut inside a page counts that
    page as missing: it gets the verdict of the cut at the page's start (LMDB would read
    zeros for the rest of the page, not the page that was written). The full files (every
    page up to the newest meta's last one present) have the cut that removes exactly their
    last page, which their last commit wrote and a writer needs."""
    path: Path = request.getfixturevalue(source)
    data_file = path / "data.mdb"
    psize = newest_meta(data_file).psize
    pages = data_file.stat().st_size // psize
    accepted: dict[int, bool] = {}
    for page in range(2, pages + 1):  # the last "cut" keeps the whole file
        copy = cut_copy(path, page * psize, tmp_path / "cut")
        error = refusal(copy)
        verdict = lmdb_verdict(copy.parent, write=True)
        where = f"cut at page {page}: {error}; LMDB: {verdict}"
        if error is None:
            assert verdict.usable, where
        else:
            assert error.path == str(copy) and "truncated" in error.problem, where
            assert verdict.signal == "SIGBUS", where
        accepted[page] = error is None
    assert accepted[pages] and not all(accepted.values()), accepted
    if source.startswith("full"):
        assert pages_past_eof(data_file) == 0
        assert not accepted[pages - 1], "the last page of a full file must be needed"
    for page in [*range(2, pages, 4), pages - 1]:
        for inside in (1, psize // 2, psize - 1):
            copy = cut_copy(path, page * psize + inside, tmp_path / "cut")
            error = refusal(copy)
            assert (error is None) == accepted[page], f"cut inside page {page}: {error}"
            if error is None:
                assert lmdb_verdict(copy.parent, write=True).usable
