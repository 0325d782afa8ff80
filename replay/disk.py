"""Replay into a scratch LMDB store: a fold whose memory does not grow with the state.

Theory of operation: the in-memory fold (`replay.fold`) holds every row of the state as a
Python object, about 1 KB per live timer, so a shard with ten million timers needs ~10 GB
to audit. Here the same entries are folded by `ShardStore.apply` into a store in a scratch
directory, one write transaction per batch: the reducer's overlay holds one batch, the
state lives in the file (the page cache, which the kernel can reclaim), and the process's
own memory stays bounded by the batch. The scratch store is a materialization only: no
fsync (a crash of the audit loses nothing that matters), no copy of the log, no checks at
open. Its result is the same `ReplayResult`, and its state a `State` the digest, the
obligations and `--verify` read exactly as they read the in-memory one.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from itertools import islice

from nereus.kernel.config import KernelConfig
from nereus.kernel.effects import EntryOutcome
from nereus.kernel.records import LogEntry
from nereus.replay.fold import ReplayResult, result_of
from nereus.storage.request import STATE_ONLY
from nereus.storage.schema import StoreOptions
from nereus.storage.snapshot import load_snapshot
from nereus.storage.store import ShardStore

SCRATCH = StoreOptions(sync=False, check_invariants_on_open=False, check_structure_on_open=False)
BATCH_ENTRIES = 2_000


def replay_on_disk(
    entries: Iterable[LogEntry],
    config: KernelConfig,
    scratch: str,
    *,
    snapshot: str | None = None,
    on_entry: Callable[[int], None] | None = None,
    batch_entries: int = BATCH_ENTRIES,
) -> tuple[ShardStore, ReplayResult]:
    """Fold `entries` into a new store at `scratch` (an empty or missing directory),
    starting from `snapshot` (a snapshot file, restored and checked first) if given. The
    caller reads the state with `state_view()`, then closes the store and removes the
    directory."""
    store = ShardStore.open(scratch, config=config, options=SCRATCH)
    try:
        if snapshot is not None:
            load_snapshot(snapshot, store)
        counts: Counter[str] = Counter()
        folded = 0
        source = iter(entries)
        while batch := list(islice(source, batch_entries)):
            for entry, effects in store.apply(batch, STATE_ONLY):
                for effect in effects:
                    if isinstance(effect, EntryOutcome):  # one per record, or per batch item
                        counts[str(effect.code)] += 1
                if on_entry is not None:
                    on_entry(entry.position)
            folded += len(batch)
        with store.state_view() as state:
            result = result_of(state, folded, counts)
    except BaseException:
        store.close()
        raise
    return store, result
