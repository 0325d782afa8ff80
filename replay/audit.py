"""Replaying an open store, and comparing the state it reached with the store's own.

    result, verified, live = replay_open(store, verify=True, on_progress=print)

Theory of operation: `nereus replay` (which opens a store read-only beside the service that
writes it) and the console's audit (which asks the running service's own open store: LMDB
must not open one environment twice in a process) run the same steps here. A verification
reads the store's state in one read transaction and replays the log up to that state's own
position, from the newest snapshot below it if the log was compacted, so a writer moving on
meanwhile changes neither side. The fold runs in memory, or into a scratch LMDB store when
the state to rebuild covers more than `AUTO_DISK_POSITIONS` positions (`fold="auto"`).
`on_progress(done, total)` is called as entries are folded; a `cancel` event stops a fold
between entries (`AuditCancelled`). `open_read_only` is how both open a store they only read
from another process than its writer's: no lock, no write, no invariant check at open (the
verification is the check).
"""

from __future__ import annotations

import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext

from nereus.kernel.config import KernelConfig
from nereus.kernel.digest import state_digest
from nereus.kernel.records import LogEntry
from nereus.kernel.state import State
from nereus.replay.disk import replay_on_disk
from nereus.replay.fold import ReplayResult, replay
from nereus.replay.verify import first_difference
from nereus.storage.errors import StoreError
from nereus.storage.memory import MemoryStore
from nereus.storage.schema import StoreOptions
from nereus.storage.snapshot import latest_snapshot, read_snapshot, read_snapshot_header
from nereus.storage.store import ShardStore

# Past this many positions (about a gigabyte of Python objects if they were all live timers)
# `fold="auto"` folds on disk.
AUTO_DISK_POSITIONS = 1_000_000

Progress = Callable[[int, int], None]


class AuditCancelled(Exception):
    """The fold was asked to stop (`cancel` was set)."""


def open_read_only(path: str) -> ShardStore:
    """The store at `path`, opened beside whichever process writes it (StoreError: none
    there, or one that cannot be trusted, with the file and the reason)."""
    options = StoreOptions(check_invariants_on_open=False)
    return ShardStore.open(path, options=options, create=False, read_only=True)


def replay_open(
    store: ShardStore,
    *,
    to: int | None = None,
    verify: bool = False,
    fold: str = "auto",
    scratch: str | None = None,
    on_progress: Progress | None = None,
    cancel: threading.Event | None = None,
) -> tuple[ReplayResult, str | None, str | None]:
    """Replay `store`'s log to `to` (or its end); with `verify`, to the store's applied
    position, and compare: "ok", or the first difference found; and the store's own state
    digest (with `verify`)."""
    with store.state_view() if verify else nullcontext() as live:
        if live is not None:
            target = live.meta.position
        else:
            target = store.log_last_position if to is None else to
        snapshot, first = snapshot_below(store, target)
        entries = _cancellable(store.iter_log(first + 1, target), cancel)
        with folded(
            entries,
            store.config,
            snapshot=snapshot,
            first=first,
            last=target,
            fold=fold,
            scratch=scratch,
            on_progress=on_progress,
        ) as (result, replayed):
            if result.position != target:
                raise StoreError(
                    store.env.data_file,
                    f"log ends at position {result.position}, before position {target}",
                )
            if live is None:
                return result, None, None
            digest = state_digest(live)
            if digest == result.digest:
                return result, "ok", digest
            return result, first_difference(live, replayed) or "digests differ", digest


def _cancellable(entries: Iterator[LogEntry], cancel: threading.Event | None) -> Iterator[LogEntry]:
    for n, entry in enumerate(entries):
        if cancel is not None and n % 1024 == 0 and cancel.is_set():
            raise AuditCancelled("the replay was cancelled")
        yield entry


def snapshot_below(store: ShardStore, target: int) -> tuple[str | None, int]:
    """The snapshot a replay to `target` starts from (None: the log's start), and its
    position."""
    path = latest_snapshot(store)
    if path is None:
        return None, 0
    header = read_snapshot_header(path)
    if target < header.position:
        raise StoreError(
            path,
            f"the log below position {store.log_info.floor} was compacted; "
            f"the earliest reconstructible position is {header.position}",
        )
    return path, header.position


@contextmanager
def folded(
    entries: Iterator[LogEntry],
    config: KernelConfig,
    *,
    snapshot: str | None,
    first: int,
    last: int,
    fold: str = "auto",
    scratch: str | None = None,
    on_progress: Progress | None = None,
) -> Iterator[tuple[ReplayResult, State]]:
    """Fold `entries` (after `snapshot`, at position `first`, if given) up to `last`, in
    memory or on disk as `fold` says; yields the result and the state reached."""
    total = max(last - first, 0)

    def on_entry(position: int) -> None:
        if on_progress is not None:
            on_progress(position - first, total)

    on_disk = fold == "disk" or (fold == "auto" and last > AUTO_DISK_POSITIONS)
    if not on_disk:
        start: MemoryStore | None = None
        if snapshot is not None:
            _, start = read_snapshot(snapshot, config)
        memory, result = replay(entries, config, start=start, on_entry=on_entry)
        yield result, memory.state
        return
    directory = tempfile.mkdtemp(prefix="nereus-replay-", dir=scratch)
    try:
        disk, result = replay_on_disk(
            entries, config, directory, snapshot=snapshot, on_entry=on_entry
        )
        try:
            with disk.state_view() as state:
                yield result, state
        finally:
            disk.close()
    finally:
        shutil.rmtree(directory, ignore_errors=True)
