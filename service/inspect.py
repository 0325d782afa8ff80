"""What an operator may look at: the read model of the console, and the port that answers it.

    inspection = service.inspection()                 # None where the service has none
    rows, more = inspection.obligations("acme", limit=100)
    story = inspection.story("acme", message_id("acme", "reminders", "k"))

Theory of operation: the console (`adapters.http.console`) renders what this module's
values hold and nothing else, so every figure on a page comes from one of these reads and a
test can check a read without a browser. Each read is bounded by its arguments (a page of
rows, a count that stops at a cap, a story's newest marks), never by the size of the store:
the console must not be able to slow the fire path by being looked at.

Tenancy is decided here, not by the page: every read that returns a tenant's data takes the
tenant and answers only rows of that tenant (a message id of another tenant is simply not
found). The shard-wide figures (`shards`) carry counts, never keys.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import msgspec

from nereus.storage.store import ShardStore

# A search by txn reads the newest log entries of each shard, up to this many entries or
# this many records, whichever comes first (there is no index by txn).
TXN_WINDOW_ENTRIES = 10_000
TXN_WINDOW_RECORDS = 20_000
# "Recent" deliveries and dead letters are those among the newest entries of each shard, up
# to this many entries or records: each publication found costs a message read, so the
# window is bounded by what a burst wrote, not by how many entries held it.
RECENT_WINDOW_ENTRIES = 2_000
RECENT_WINDOW_RECORDS = 4_000
# The obligations page sorts at most this many open attempts per shard by admission time
# (in-flight attempts are bounded by the per-lane claim bound, far below it).
OBLIGATIONS_SORT_CAP = 20_000
# A queue's live timers are counted up to this many; a page says "at least" past it.
LIVE_COUNT_CAP = 1_000


class ShardHealth(msgspec.Struct, frozen=True):
    """One shard as its owner sees it now."""

    shard: int
    owner: str
    state: str  # "active" | "recovering" | "halted" | "waiting for clock"
    reason: str | None
    clock_source: str
    clock_bound_ms: float | None  # None: unbounded
    log_position: int  # the last position in the shard log
    applied_position: int  # the last position folded into the store
    snapshot_age_s: float | None  # Kafka mode; None: no snapshot
    open_obligations: int  # attempts PUBLISHING or UNKNOWN
    unknown_attempts: int
    live_timers: int
    dead_letters_pending: int
    delivered: int
    canceled: int
    expired: int
    dead_lettered: int

    @property
    def fold_lag(self) -> int:
        return max(0, self.log_position - self.applied_position)


class QueueRow(msgspec.Struct, frozen=True):
    """A queue of one tenant with live timers."""

    queue: str
    live: int  # counted up to LIVE_COUNT_CAP
    live_capped: bool
    next_due_ms: int | None  # the earliest action time of its timeline


class Delivery(msgspec.Struct, frozen=True):
    """A publication the log recorded recently."""

    position: int
    persisted_at_ms: int
    queue: str
    timer_key: str
    message_id: str
    attempt_id: str
    deliver_at_ms: int
    destination: str
    partition: int
    offset: int
    timestamp_ms: int


class DeadLetter(msgspec.Struct, frozen=True):
    """A dead-lettered generation: its copy still owed, or written recently (at `copy`)."""

    queue: str
    timer_key: str
    message_id: str
    generation: int
    attempts_spent: int
    last_error: str | None
    position: int | None  # where the log recorded the copy; None: the copy is still owed
    persisted_at_ms: int | None
    copy: str | None  # destination[partition]@offset of the copy; None: still owed


class Event(msgspec.Struct, frozen=True):
    """One line of a timer's story: something the log recorded about it, at a position."""

    position: int
    persisted_at_ms: int | None  # None: the entry is below the log's floor (compacted)
    kind: str  # "command" | "admission" | "outcome" | "claim" | "expiry" | "dead letter" ...
    title: str
    verdict: str | None = None  # the code the fold answered (commands) or the result
    applied: bool | None = None
    generation: int | None = None
    attempt_id: str | None = None
    facts: tuple[tuple[str, str | int], ...] = ()  # an int is epoch ms: a time


class AttemptView(msgspec.Struct, frozen=True):
    attempt_id: str
    generation: int
    status: str
    destination: str
    claim_id: str
    owner: str
    admitted_position: int
    admitted_at_ms: int
    resolved_position: int | None
    resolved_at_ms: int | None
    disposition: str | None
    error_code: str | None
    evidence: tuple[tuple[str, str | int], ...]  # topic, partition, offset, timestamp
    absence: tuple[tuple[str, str | int], ...]  # the proof of absence, when one was recorded


class Story(msgspec.Struct, frozen=True):
    """A timer's whole story as far as the store can tell it."""

    message_id: str
    tenant: str
    queue: str
    timer_key: str
    status: str | None  # None: no row (never scheduled here, or only refused commands)
    generation: int | None
    deliver_at_ms: int | None
    expire_at_ms: int | None
    txn: str | None
    last_error: str | None
    events: tuple[Event, ...]
    attempts: tuple[AttemptView, ...]
    index_floor: int  # commands before this position are not in the story index
    older_left_out: bool  # more commands than a page holds: the oldest are not shown


class ObligationRow(msgspec.Struct, frozen=True):
    """An attempt the shard owes an answer for: PUBLISHING or UNKNOWN."""

    shard: int
    attempt_id: str
    message_id: str
    queue: str
    timer_key: str
    generation: int
    status: str
    admitted_at_ms: int
    age_ms: int
    waiting_for: str


class Inspection(Protocol):
    """The console's reads over a running service (see the module)."""

    def shards(self) -> list[ShardHealth]: ...

    def queues(self, tenant: str, limit: int) -> tuple[list[QueueRow], bool]:
        """The tenant's queues with live timers, in byte order, at most `limit`."""
        ...

    def recent_deliveries(self, tenant: str, queue: str | None, limit: int) -> list[Delivery]:
        """Publications of the tenant (of `queue`, if given) within each shard's recent window
        (`RECENT_WINDOW_ENTRIES`, `RECENT_WINDOW_RECORDS`), newest first."""
        ...

    def dead_letters(self, tenant: str, queue: str | None, limit: int) -> list[DeadLetter]:
        """The tenant's dead letters (of `queue`, if given): every copy still owed, then the
        copies written among the newest log entries, newest first."""
        ...

    def story(self, tenant: str, message_id: str) -> Story | None:
        """The message's story, or None when the tenant has no trace of it."""
        ...

    def message_of_attempt(self, tenant: str, attempt_id: str) -> str | None:
        """The message id an attempt id belongs to, if it is the tenant's."""
        ...

    def message_of_txn(self, tenant: str, txn: str) -> str | None:
        """The message the newest command of the tenant with this txn named, within each
        shard's txn window (`TXN_WINDOW_ENTRIES`, `TXN_WINDOW_RECORDS`)."""
        ...

    def obligations(self, tenant: str | None, limit: int) -> tuple[list[ObligationRow], bool]:
        """Open obligations, oldest admission first: the tenant's (None: every tenant's)."""
        ...

    def shard_stores(self) -> Mapping[int, ShardStore]:
        """The open stores of the shards this process holds, for an audit (`replay.audit`)
        to read: the stores are the service's own, never to be closed or written."""
        ...
