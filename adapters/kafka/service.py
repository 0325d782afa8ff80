"""Kafka mode: one process among several sharing the shards of the Kafka commands topic.

    service = KafkaService(KafkaServiceConfig(bootstrap="127.0.0.1:9092", data_dir="data"),
                           clock=SystemClock(assumed_error_ms=5))
    service.start()
    outcomes = service.execute([schedule_record("reminders", "k", b"x", delay_ms=1000)], 30)

Theory of operation (decisions in `specs/kafka.md`): the service is the front of four parts,
each in a module of its own.

* **Topics** (`adapters.kafka.topics`): the commands topic's partitions are the shards
  (created if absent, with `message.timestamp.type=LogAppendTime` and no retention, and
  refused at start if its timestamps are not the broker's); replies travel on the replies
  topic.
* **Ownership** (`adapters.kafka.ownership`): the process joins the consumer group on the
  commands topic; each assigned partition gets a shard (store, `KafkaLog`, destination,
  `ShardRuntime` thread), stopped before the group may give it to another process.
* **Commands** (`adapters.kafka.rpc`): `execute` produces each command to its shard's
  partition and waits for the outcome, from the local shard's fold when the shard is owned
  here, else from the replies topic. No other channel between processes exists.
* **Reads** (`adapters.kafka.reads`): a peek needs the timer's shard owned here; a queue
  listing needs every shard (`ShardNotLocal` otherwise); tenant usage is the sum over the
  shards owned here.

A service that owns shards owns its data directory from `start` to `close` (`storage.lock`,
`DATA/LOCK`): a second one on the same directory is refused at start, naming the holder.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from typing import Any

from nereus.adapters.kafka import reads
from nereus.adapters.kafka.config import KafkaServiceConfig
from nereus.adapters.kafka.inspect import MergedInspection, answer_sibling, kafka_inspection
from nereus.adapters.kafka.ownership import ShardOwnership, ShardParts
from nereus.adapters.kafka.rpc import CommandRpc
from nereus.adapters.kafka.siblings import Part, Siblings, merge_parts
from nereus.adapters.kafka.topics import ensure_topics
from nereus.kernel.config import KernelConfig
from nereus.kernel.effects import EntryOutcome
from nereus.kernel.keys import DEFAULT_TENANT
from nereus.kernel.model import Message, TenantUsage
from nereus.kernel.records import Appendable, Cancel
from nereus.runtime.clock import ClockSource
from nereus.runtime.config import RuntimeConfig
from nereus.runtime.destination import Destination
from nereus.runtime.guard import check_items
from nereus.runtime.log import Logger, NullLogger
from nereus.runtime.metrics import Metrics
from nereus.service.audit_view import AuditPort
from nereus.service.clock_bound import clock_problem
from nereus.service.errors import ShardNotLocal
from nereus.service.inspect import Inspection
from nereus.service.readiness import (
    OWNERSHIP_UNSETTLED,
    STOPPING,
    Reason,
    clock_reason,
    shard_reasons,
)
from nereus.service.results import Peek
from nereus.storage import files
from nereus.storage.lock import DirectoryLock, lock_directory
from nereus.storage.schema import StoreOptions
from nereus.storage.store import ShardStore

# KafkaServiceConfig lives in adapters.kafka.config; it is imported from here as before.
__all__ = ["ENVELOPE_RESERVE_BYTES", "KafkaService", "KafkaServiceConfig"]

# Room above the payload ceiling for the envelope (record fields, headers, framing).
ENVELOPE_RESERVE_BYTES = 256 * 1024


class KafkaService:
    """The application layer's port (`service.port.TimerService`) over the
    Kafka-partitioned shard log."""

    # Shard reads take the shard's lock, which a tick holds: off the event loop.
    inline_reads = False

    def __init__(
        self,
        config: KafkaServiceConfig,
        *,
        clock: ClockSource,
        kernel_config: KernelConfig | None = None,
        runtime_config: RuntimeConfig | None = None,
        store_options: StoreOptions | None = None,
        destination_factory: Callable[[int], Destination] | None = None,
        metrics: Metrics | None = None,
        logger: Logger | None = None,
    ) -> None:
        self.config = config
        self.clock = clock
        self._kernel_config = kernel_config or KernelConfig()
        self.runtime_config = runtime_config or RuntimeConfig()
        self.store_options = store_options
        self._metrics = metrics or Metrics()
        self.log = (logger or NullLogger()).bind(process=config.process_id)
        self.shards = 0
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._started = False
        # The data directory's lock while the service owns shards there (`start`..`close`).
        self._lock: DirectoryLock | None = None
        max_bytes = self._kernel_config.max_payload_bytes + ENVELOPE_RESERVE_BYTES
        self.rpc = CommandRpc(config, max_bytes, self._stop)
        parts = ShardParts(
            clock=clock,
            kernel_config=self._kernel_config,
            runtime_config=self.runtime_config,
            store_options=store_options,
            metrics=self._metrics,
            on_reply=self.rpc.complete,
            destination_factory=destination_factory,
        )
        self.ownership = ShardOwnership(config, parts, self.log, self._stop)
        # The other processes of this machine under one supervisor (`serve --processes`).
        self.siblings: Siblings | None = None

    @property
    def kernel_config(self) -> KernelConfig:
        return self._kernel_config

    @property
    def metrics(self) -> Metrics:
        return self._metrics

    # Starting -----------------------------------------------------------------------------

    def start(self) -> None:
        if self._started:
            return
        if self.config.own_shards:
            files.make_dirs(self.config.data_dir)
            # Its shard stores and its static member id are this process's alone: a second
            # process on the directory would share the member id and fence this one.
            self._lock = lock_directory(self.config.data_dir)
        self._started = True
        max_bytes = self._kernel_config.max_payload_bytes + ENVELOPE_RESERVE_BYTES
        self.shards = ensure_topics(self.config, max_bytes, self.log)
        self.rpc.start(self.shards)
        self._spawn("nereus-kafka-producer", self.rpc.serve_producer)
        self._spawn("nereus-kafka-replies", self.rpc.serve_replies)
        if self.config.own_shards:
            self._spawn("nereus-kafka-group", self.ownership.serve_group)
        self.log.info(
            "kafka_service_started",
            commands_topic=self.config.commands_topic,
            shards=self.shards,
            group=self.config.group if self.config.own_shards else None,
        )

    def _spawn(self, name: str, target: Callable[[], None]) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    # Commands -----------------------------------------------------------------------------

    def execute(self, items: Sequence[Appendable], timeout_s: float) -> list[EntryOutcome]:
        """Produce each command to its shard and wait for every outcome (`adapters.kafka.rpc`)."""
        # The owner would drop a record it cannot decode, and this call would wait for it.
        check_items(items)
        return self.rpc.execute(items, timeout_s)

    async def execute_async(
        self, items: Sequence[Appendable], timeout_s: float
    ) -> list[EntryOutcome]:
        check_items(items)
        return await self.rpc.execute_async(items, timeout_s)

    async def cancel_async(
        self, items: Sequence[Appendable], may_append: Callable[[], bool], timeout_s: float
    ) -> list[EntryOutcome] | None:
        """Every cancel is appended here, with a token; without one, None (refuse it) when
        the stores owned here show that it cancels no pending timer (`reads.cancels_nothing`),
        and appended all the same when they cannot show it (its shard is elsewhere)."""
        if may_append():
            return await self.execute_async(items, timeout_s)
        cancels = [record for record, _payload in items if isinstance(record, Cancel)]
        # Off the event loop: the judgement waits on the shards' locks, as reads do.
        if len(cancels) == len(items) and await asyncio.to_thread(
            reads.cancels_nothing, self.ownership.snapshot(), self.shards, cancels
        ):
            return None
        return await self.execute_async(items, timeout_s)

    # Reads --------------------------------------------------------------------------------

    def peek(self, queue: str, timer_key: str, *, tenant: str = DEFAULT_TENANT) -> Peek:
        """From the shard's store, here or, under a supervisor, in a sibling process."""
        if not self.config.own_shards:
            raise ShardNotLocal("a client-only instance owns no shard: peek through a service")
        try:
            return self.peek_here(tenant, queue, timer_key)
        except ShardNotLocal:
            if self.siblings is None:
                raise
            return self.siblings.peek(tenant, queue, timer_key)

    def peek_here(self, tenant: str, queue: str, timer_key: str) -> Peek:
        owned = self.ownership.snapshot()
        return reads.peek(owned, self.shards, queue, timer_key, tenant=tenant)

    def list_timers(
        self, queue: str, after: str | None, limit: int, *, tenant: str = DEFAULT_TENANT
    ) -> tuple[list[Message], bool]:
        """The queue's live timers after `after` in key byte order, merged over every shard
        (all of which must be owned and caught up here, or in this supervisor's other
        processes, else ShardNotLocal)."""
        if not self.config.own_shards:
            raise ShardNotLocal("a client-only instance owns no shard: list through a service")
        owned = self.ownership.snapshot()
        if self.siblings is None:
            return reads.list_timers(owned, self.shards, queue, after, limit, tenant=tenant)
        if limit < 1:
            raise ValueError(f"limit must be at least 1, not {limit}")
        parts = [self.part_here(tenant, queue, after, limit)]
        parts += self.siblings.parts(tenant, queue, after, limit)
        return merge_parts(parts, self.shards, limit)

    def part_here(self, tenant: str, queue: str, after: str | None, limit: int) -> Part:
        return reads.local_part(self.ownership.snapshot(), tenant, queue, after, limit)

    def tenant_usage(self, tenant: str = DEFAULT_TENANT) -> TenantUsage:
        """Summed over the shards this process owns right now: in Kafka mode a quota counts
        only those."""
        return reads.tenant_usage(self.ownership.snapshot(), tenant)

    def map_usage(self) -> float:
        return reads.map_usage(self.ownership.snapshot())

    def shard_states(self) -> dict[int, str]:
        return self.ownership.shard_states()

    def owned_store(self, partition: int) -> ShardStore | None:
        shard = self.ownership.snapshot().get(partition)
        return None if shard is None else shard.store

    def readiness(self) -> list[Reason]:
        """Why this process does not serve every shard it should (`service.readiness`)."""
        reasons: list[Reason] = []
        if self._stop.is_set():
            reasons.append(Reason(STOPPING, "the service is stopping"))
        if not self._started:
            reasons.append(Reason(OWNERSHIP_UNSETTLED, "the service has not started"))
        elif self.config.own_shards and not self.ownership.joined:
            reasons.append(Reason(OWNERSHIP_UNSETTLED, "no assignment from the group yet"))
        halted = self.ownership.halted()
        for partition, state in self.shard_states().items():
            reasons += shard_reasons(
                partition, halted=halted.get(partition), recovered=state == "active"
            )
        if self.config.own_shards:  # a client-only process fires nothing: no clock needed
            reasons += clock_reason(clock_problem(self.clock))
        return reasons

    def inspection(self) -> Inspection:
        """The console's reads over the shards this process owns now, each read under the
        shard's lock, and under a supervisor its siblings' too (`adapters.kafka.inspect`)."""
        local = kafka_inspection(self.ownership, self.config.process_id)
        return local if self.siblings is None else MergedInspection(local, self.siblings)

    def inspect_here(self, call: str, args: list[Any], audits: AuditPort | None = None) -> Any:
        """A sibling's console read, answered from the shards this process owns, or its
        audit call, answered by this process's `audits` (the console's)."""
        local = kafka_inspection(self.ownership, self.config.process_id)
        return answer_sibling(local, call, args, audits)

    def health(self) -> tuple[bool, dict[str, Any]]:
        states = self.shard_states()
        halted = self.ownership.halted()
        ok = self._started and not halted and not self._stop.is_set()
        return ok, {
            "ok": ok,
            "mode": "kafka",
            "process": self.config.process_id,
            "shards": self.shards,
            "owned": {str(p): s for p, s in states.items()},
            "halted": {str(p): e for p, e in halted.items()},
        }

    # Stopping -----------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the shards, leave the group (the shards move to the other processes), and
        stop reading replies."""
        self._stop.set()
        for thread in self._threads:
            thread.join(90)
        self._threads = []
        self.rpc.close()
        if self._lock is not None:
            self._lock.release()
        self.log.info("kafka_service_stopped")
