"""The console's audit of a shard as every process shows it, and the port that starts one.

Theory of operation: an audit (`replay --verify` of one shard) runs beside the process that
holds the shard's store (`adapters.http.console.audit`); under `nereus serve --processes`
the page asking about it may be answered by another process, which asks the holder over
the private sibling port (`adapters.kafka.inspect`). What crosses that port is an
`AuditView`, a value: a copy of the job as it stood when asked, never the job itself.
"""

from __future__ import annotations

from typing import Final, Protocol

import msgspec

# An audit's states: one while it runs, then exactly one of the others for good.
STATES: Final = ("running", "ok", "mismatch", "refused", "failed", "cancelled")


class AuditView(msgspec.Struct, frozen=True):
    """One audit of `shard`: who started it and when, how far it got, and its answer."""

    shard: int
    started_at_ms: int
    by: str
    state: str  # one of STATES
    done: int = 0  # entries folded so far, of `total`
    total: int = 0
    pid: int | None = None  # the audit's own process, once it started
    parent_pid: int | None = None  # the process holding the shard, which started it
    position: int | None = None
    entries_folded: int | None = None
    replay_digest: str | None = None
    store_digest: str | None = None
    difference: str | None = None  # the first difference, or why it was refused or failed
    finished_at_ms: int | None = None

    @property
    def percent(self) -> float:
        return 100.0 * self.done / self.total if self.total else 0.0


class AuditPort(Protocol):
    """Starts audits and says how they stand: of the shards held here, or under
    `--processes` of every shard of the machine."""

    def jobs(self) -> dict[int, AuditView]:
        """The latest audit of each shard that had one."""
        ...

    def start(self, shard: int, by: str) -> AuditView | None:
        """The audit of `shard` started now, or the one already running (one at a time per
        process); None when no process here holds `shard`."""
        ...
