"""The shard log port: how a tick's records reach the shard log and get folded.

Theory of operation: `ShardRuntime` gathers what must enter the log (commands, outcomes,
Admissions, claim results, expiries) and hands it to a `ShardLog`, which makes it durable
and folds whatever became durable into the shard store, returning each folded entry with its
effects only after the fold is committed. Two logs implement the port:

* `EmbeddedLog` (the default): the log lives in the shard's own LMDB environment;
  `commit` is `ShardStore.commit`, append and fold in one write transaction and one sync,
  so a tick's records are folded in the same call that appended them.
* `adapters.kafka.log.KafkaLog`: the log is a Kafka topic partition. `commit` folds what
  the consumer has read (committed records only) and then produces the tick's records in
  one Kafka transaction; they are folded when they come back from the consumer, in a later
  tick. Until then `settled()` is False and the runtime proposes nothing new, so no proposal
  is made twice. A log that has lost its ownership (a fenced producer) raises `ShardLost`.

A Publish effect therefore still only arises from an Admission that the log made durable
and the store folded.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Protocol

from nereus.kernel.records import Appendable, LogEntry
from nereus.runtime.metrics import Metrics
from nereus.storage.claims import ClaimWriter
from nereus.storage.errors import StoreError
from nereus.storage.store import Applied, ShardStore


class ShardLost(RuntimeError):
    """This process no longer owns the shard (its log writer was fenced or the shard was
    revoked). Not a fault of the shard: the runtime stops without halting, and whoever owns
    the shard now recovers its open attempts from the log."""


class ShardLog(Protocol):
    # Whether client commands may be submitted through the runtime's intake queue.
    accepts_commands: bool

    def open(self) -> None:
        """Prepare to write (idempotent). Kafka: fence any former owner, start reading."""
        ...

    def caught_up(self) -> bool:
        """Everything durable in the log when this owner started has been folded: open
        attempts in the store are now exactly the ones recovery must resolve."""
        ...

    def settled(self) -> bool:
        """Caught up, and every record this owner wrote has been folded: the store reflects
        all of this owner's proposals, so due discovery may propose again."""
        ...

    def pending(self) -> bool:
        """There is something to fold or to write even without new records."""
        ...

    def commit(
        self,
        items: Sequence[Appendable],
        now_ms: int,
        also: ClaimWriter,
    ) -> tuple[list[LogEntry], list[Applied]]:
        """Make `items` durable in the log and fold what became durable. Returns the entries
        the items became (if they were folded in this call: the embedded log) and every
        entry folded by this call with its effects, after the fold is committed. `also`
        writes the runtime's claim rows through the store's claims port
        (`storage.claims.ClaimRows`) in the fold's store transaction."""
        ...

    def send_allowed(self) -> bool:
        """Whether a send may start now. Kafka: this owner proved recently enough that it
        still owns the shard."""
        ...

    def wait(self, timeout_s: float, wake: threading.Event) -> None:
        """Sleep up to `timeout_s`, returning early when `wake` is set or the log has new
        records to fold."""
        ...

    def close(self) -> None: ...


COMMIT_SECONDS = "nereus_commit_duration_seconds"
# A group commit: from ~0.3 ms (a small tick on a fast disk) to a stalled fsync.
COMMIT_BUCKETS_S = (0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.5, 2.0)


class EmbeddedLog:
    """The shard log in the shard store's own LMDB environment (the embedded default).
    With `metrics`, each group commit's duration (append, fold and the durable sync) is
    observed in `nereus_commit_duration_seconds`."""

    accepts_commands = True

    def __init__(self, store: ShardStore, metrics: Metrics | None = None) -> None:
        source = store.source
        if source is not None:
            # Its positions are the topic's: an entry appended here would be a second history
            # at the same positions, and the store could no longer follow its partition.
            raise StoreError(
                store.path,
                f"follows the Kafka shard log {source.topic}[{source.partition}]; an embedded "
                "shard log cannot append to it",
            )
        self.store = store
        self.metrics = metrics
        if metrics is not None:
            metrics.describe(
                COMMIT_SECONDS,
                "histogram",
                "Group commits of the embedded shard log: append, fold and LMDB's synced commit.",
            )

    def open(self) -> None:
        return None

    def caught_up(self) -> bool:
        return True

    def settled(self) -> bool:
        return True

    def pending(self) -> bool:
        return self.store.log_last_position > self.store.meta.position

    def commit(
        self,
        items: Sequence[Appendable],
        now_ms: int,
        also: ClaimWriter,
    ) -> tuple[list[LogEntry], list[Applied]]:
        # Every command (and every item with payload bytes) came in through
        # `ShardRuntime.submit`, whose guard checked and normalized it.
        if self.metrics is None:
            return self.store.commit(items, now_ms, also=also, guarded=True)
        started = time.perf_counter()
        done = self.store.commit(items, now_ms, also=also, guarded=True)
        self.metrics.observe(COMMIT_SECONDS, time.perf_counter() - started, None, COMMIT_BUCKETS_S)
        return done

    def send_allowed(self) -> bool:
        return True

    def wait(self, timeout_s: float, wake: threading.Event) -> None:
        wake.wait(timeout_s)

    def close(self) -> None:
        return None
