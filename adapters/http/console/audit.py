"""The console's audit: `replay --verify` of one shard, on a thread, with its progress.

Theory of operation: an audit replays the shard's log from nothing (or its newest snapshot)
and compares the state reached with the store's, as `nereus replay --verify` does, over the
service's own open store (`replay.audit.replay_open`). It runs on one background thread at a
time per process: a second request while one runs is shown the running one instead, so the
console can never start more work than one replay. Its progress (entries folded of those to
fold) and its answer are kept until the next audit of that shard replaces them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from nereus.replay.audit import AuditCancelled, replay_open
from nereus.storage.errors import StoreError
from nereus.storage.store import ShardStore


@dataclass
class AuditJob:
    shard: int
    started_at_ms: int
    by: str
    state: str = "running"  # running | ok | mismatch | refused | failed | cancelled
    done: int = 0
    total: int = 0
    position: int | None = None
    entries_folded: int | None = None
    replay_digest: str | None = None
    store_digest: str | None = None
    difference: str | None = None
    finished_at_ms: int | None = None
    cancel: threading.Event = field(default_factory=threading.Event)

    @property
    def percent(self) -> float:
        return 100.0 * self.done / self.total if self.total else 0.0


class Audits:
    def __init__(self, stores: Callable[[], Mapping[int, ShardStore]]) -> None:
        self._stores = stores
        self._lock = threading.Lock()
        self._jobs: dict[int, AuditJob] = {}
        self._running: AuditJob | None = None

    def jobs(self) -> dict[int, AuditJob]:
        with self._lock:
            return dict(self._jobs)

    def start(self, shard: int, by: str) -> AuditJob | None:
        """The audit of `shard`, started now or already running (None: no such shard)."""
        store = self._stores().get(shard)
        if store is None:
            return None
        with self._lock:
            if self._running is not None and self._running.state == "running":
                return self._running
            job = AuditJob(shard, int(time.time() * 1000), by)
            self._jobs[shard] = self._running = job
        threading.Thread(
            target=self._run, args=(job, store), name=f"nereus-audit-{shard}", daemon=True
        ).start()
        return job

    def stop(self) -> None:
        with self._lock:
            if self._running is not None:
                self._running.cancel.set()

    def _run(self, job: AuditJob, store: ShardStore) -> None:
        def progress(done: int, total: int) -> None:
            job.done, job.total = done, total

        try:
            result, verified, digest = replay_open(
                store, verify=True, on_progress=progress, cancel=job.cancel
            )
        except AuditCancelled:
            job.state = "cancelled"
        except StoreError as exc:
            job.state, job.difference = "refused", str(exc)
        except Exception as exc:  # an audit that crashed says so on the page, not silently
            job.state, job.difference = "failed", repr(exc)
        else:
            job.position, job.entries_folded = result.position, result.entries_folded
            job.replay_digest, job.store_digest = result.digest, digest
            job.done = job.total = result.entries_folded
            job.state = "ok" if verified == "ok" else "mismatch"
            job.difference = None if verified == "ok" else verified
        job.finished_at_ms = int(time.time() * 1000)
