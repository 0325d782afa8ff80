"""One LMDB environment per shard, with one named sub-database per table.

Theory of operation: everything a shard needs to restart exactly — its log, its materialized
tables, payload bytes, local claims and the store header — lives in one environment, so one
write transaction can change any of it atomically and one `sync` makes it durable.

A writer owns the store's directory while the environment is open (`storage.lock`, the file
`LOCK` beside `data.mdb`); readers (`read_only`: audits, exports) open it read-only beside a
running writer and take no lock.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import lmdb

from nereus.kernel.model import TABLES, Table
from nereus.storage import files
from nereus.storage.errors import StoreError
from nereus.storage.lmdbcheck import check_data_file
from nereus.storage.lock import DirectoryLock, holder, lock_directory
from nereus.storage.preflight import check_structure as walk_structure
from nereus.storage.schema import HEADER_KEY, check_schema

LOG_DB = b"log"  # position (8 bytes BE) -> framed LogEntry
PAYLOAD_BYTES_DB = b"payload_bytes"  # digest -> framed PayloadBlob
CLAIMS_DB = b"claims"  # "c" + claim sequence (8 bytes BE) -> framed PersistedClaim
META_DB = b"meta"  # header keys -> framed structs
LANE_TIMELINE_DB = b"lane_timeline"  # tenant NUL queue NUL timeline key -> b""
TIMER_INDEX_DB = b"timer_index"  # tenant NUL queue NUL timer key -> message id (live only)
# message id + position (8 bytes BE) + batch item (2 bytes BE) -> framed StoryMark
STORY_DB = b"story"
EXTRA_DBS = (
    LOG_DB,
    PAYLOAD_BYTES_DB,
    CLAIMS_DB,
    META_DB,
    LANE_TIMELINE_DB,
    TIMER_INDEX_DB,
    STORY_DB,
)
_NAMES = [t.value.encode() for t in TABLES] + list(EXTRA_DBS)
# Sub-databases a schema migration creates, by the version that brought them: a store of an
# older version lacks them until its migration runs (in `storage.schema.migrate`).
ADDED_BY_VERSION = {STORY_DB: 7}


@dataclass(frozen=True)
class Env:
    path: str
    env: Any
    tables: dict[Table, Any]
    log: Any
    payload_bytes: Any
    claims: Any
    meta: Any
    lane_timeline: Any
    timer_index: Any
    # None only between the open of a store older than schema 7 and its migration.
    story: Any
    # The directory's exclusive lock, held by a writer until `close`; None: a read-only open.
    lock: DirectoryLock | None = None

    data_file: str = field(init=False)  # every error names it: worked out once

    def __post_init__(self) -> None:
        object.__setattr__(self, "data_file", os.path.join(self.path, "data.mdb"))

    def state_dbs(self) -> dict[str, Any]:
        """The sub-databases that hold the shard's folded state, by name, in a fixed order:
        the tables, the payload bytes and the two derived indexes (not the log, the claims,
        the meta or the story index: the story is the log's history, not state, so a state
        moved elsewhere starts a story of its own at its floor)."""
        dbs: dict[str, Any] = {t.value: self.tables[t] for t in TABLES}
        dbs.update(
            payload_bytes=self.payload_bytes,
            lane_timeline=self.lane_timeline,
            timer_index=self.timer_index,
        )
        return dbs

    def create_story(self, txn: Any) -> None:
        """Create the story sub-database inside `txn`, the schema 7 migration's write
        transaction: it exists only if that transaction commits."""
        object.__setattr__(self, "story", self.env.open_db(STORY_DB, txn=txn, create=True))

    @property
    def read_only(self) -> bool:
        return self.lock is None

    def close(self) -> None:
        self.env.close()
        if self.lock is not None:
            self.lock.release()  # after the environment: nothing of ours writes here now


def _refuse_foreign(env: Any, data_file: str, ours: set[bytes], create: bool) -> set[bytes]:
    """Look, without writing, at what the environment's main database holds: only our
    sub-database names may be there. Anything else is another program's data; and with
    create=False an environment without our meta database is not a store to open. An
    existing store missing some of our sub-databases was written by an older layout: its
    header's version decides the refusal, before anything is created in it (creating them
    would make the store unreadable to the older build that can export it). Returns the
    sub-databases the store's own migration will create (`ADDED_BY_VERSION`): not opened
    here."""
    with env.begin() as txn, txn.cursor() as cursor:
        present = set(cursor.iternext(values=False))
    foreign = sorted(present - ours)
    if foreign:
        shown = ", ".join(repr(k) for k in foreign[:3])
        raise StoreError(data_file, f"another program's LMDB environment (it holds {shown})")
    if not create and META_DB not in present:
        raise StoreError(data_file, "no Nereus store here")
    missing = sorted(ours - present)
    if META_DB not in present or not missing:
        return set()
    with env.begin() as txn:
        raw = txn.get(HEADER_KEY, db=env.open_db(META_DB, txn=txn, create=False))
    if raw is not None:
        # An older version without a migration path is refused here, with its path.
        version = check_schema(raw, data_file).schema_version
        pending = {name for name in missing if ADDED_BY_VERSION.get(name, 0) > version}
        if len(pending) == len(missing):
            return pending
    shown = ", ".join(k.decode() for k in missing)
    raise StoreError(data_file, f"incomplete store: sub-databases missing ({shown})")


def open_env(
    path: str,
    *,
    map_size_bytes: int,
    sync: bool,
    create: bool,
    check_structure: bool = True,
    read_only: bool = False,
) -> Env:
    """Open the store's environment at `path`. A writer (the default) first takes the
    directory's exclusive lock (`storage.lock`), held until `Env.close`, so one process, and
    one open in it, writes a store at a time; `read_only` takes no lock and can only read."""
    if read_only and create:
        raise ValueError("a read-only open cannot create a store")
    data_file = os.path.join(path, "data.mdb")
    if not os.path.isdir(path):
        if not create:
            raise StoreError(path, "no store here (directory does not exist)")
        files.make_dirs(path)
    elif not create and not os.path.exists(data_file):
        raise StoreError(data_file, "no store here (data file missing)")
    writer = holder(path) if read_only else None
    if writer is not None and writer.pid == os.getpid():
        raise StoreError(
            path, "this process has the store open for writing: read through that open"
        )
    lock = None if read_only else lock_directory(path)
    try:
        # A live writer's file grows and reuses pages under a raw read; that writer checked
        # the file when it opened it, and the structure walk below reads through LMDB.
        if writer is None:
            check_data_file(data_file)
        if check_structure:
            walk_structure(path, data_file, _NAMES)
        return _open_lmdb(path, data_file, map_size_bytes, sync=sync, create=create, lock=lock)
    except BaseException:
        if lock is not None:
            lock.release()
        raise


def _open_lmdb(
    path: str,
    data_file: str,
    map_size_bytes: int,
    *,
    sync: bool,
    create: bool,
    lock: DirectoryLock | None,
) -> Env:
    names = _NAMES
    try:
        env = lmdb.open(
            path,
            map_size=map_size_bytes,
            max_dbs=len(names) + 2,
            sync=sync,
            metasync=sync,
            readahead=False,
            create=create,
            readonly=lock is None,
            mode=files.file_mode(),  # data.mdb and lock.mdb (py-lmdb's default is 0755)
        )
    except lmdb.Error as exc:
        raise StoreError(data_file, f"LMDB refused the environment: {exc}") from exc
    try:
        pending = _refuse_foreign(env, data_file, set(names), create)
        tables = {t: env.open_db(t.value.encode(), create=create) for t in TABLES}
        extra = {
            name: env.open_db(name, create=create) for name in EXTRA_DBS if name not in pending
        }
    except lmdb.Error as exc:
        env.close()
        raise StoreError(data_file, f"LMDB refused the environment: {exc}") from exc
    except StoreError:
        env.close()
        raise
    return Env(
        path=path,
        env=env,
        tables=tables,
        log=extra[LOG_DB],
        payload_bytes=extra[PAYLOAD_BYTES_DB],
        claims=extra[CLAIMS_DB],
        meta=extra[META_DB],
        lane_timeline=extra[LANE_TIMELINE_DB],
        timer_index=extra[TIMER_INDEX_DB],
        story=extra.get(STORY_DB),
        lock=lock,
    )
