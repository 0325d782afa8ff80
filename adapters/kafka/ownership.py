"""Shard ownership: group membership on the commands topic, and each owned shard's life.

Theory of operation: the process joins the consumer group on the commands topic (cooperative
sticky assignment; the membership consumer never fetches: its partitions are paused), with a
static member id kept in the data directory, so a restarted process takes its shards back at
once. Each assigned partition gets a shard: its LMDB store `DATA/shard-<p>`, a `KafkaLog`
(own reader, transactional writer), a destination and a `ShardRuntime` thread. On revocation
(or loss) the shard's runtime is stopped before the callback returns, its claims released
and its store closed; only then can the group give the partition to another process. A
shard whose log was fenced while still assigned here is reopened after a backoff (a new
`init_transactions`), unless the group takes it away first; a shard whose runtime halted is
closed and reported.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
from confluent_kafka import Consumer, KafkaException

from nereus.adapters.kafka.config import KafkaServiceConfig
from nereus.adapters.kafka.destination import KafkaDestination, KafkaDestinationConfig
from nereus.adapters.kafka.log import KafkaLog, KafkaLogConfig
from nereus.kernel.config import KernelConfig
from nereus.kernel.effects import EntryOutcome
from nereus.runtime.clock import ClockSource
from nereus.runtime.config import RuntimeConfig
from nereus.runtime.destination import Destination
from nereus.runtime.log import Logger
from nereus.runtime.metrics import Metrics, ScopedMetrics, drop_series
from nereus.runtime.shard import ShardRuntime
from nereus.storage import files
from nereus.storage.schema import StoreOptions
from nereus.storage.store import ShardStore


@dataclass
class OwnedShard:
    partition: int
    store: ShardStore
    log: KafkaLog
    destination: Destination
    runtime: ShardRuntime
    lock: threading.Lock = field(default_factory=threading.Lock)
    closed: bool = False


@dataclass(frozen=True)
class ShardParts:
    """What every shard this process owns is made with."""

    clock: ClockSource
    kernel_config: KernelConfig
    runtime_config: RuntimeConfig
    store_options: StoreOptions | None
    metrics: Metrics
    # The outcome of a command this process sent, folded by a shard owned here.
    on_reply: Callable[[str, Sequence[EntryOutcome]], None]
    destination_factory: Callable[[int], Destination] | None = None


class ShardOwnership:
    def __init__(
        self, config: KafkaServiceConfig, parts: ShardParts, log: Logger, stop: threading.Event
    ) -> None:
        self.config = config
        self.parts = parts
        self.log = log
        self._stop = stop
        self._destination_factory = parts.destination_factory or self._kafka_destination
        # Guarded by `lock`: the shards owned here, the partitions assigned, the shards to
        # reopen (monotonic time), the ones that halted (why).
        self.lock = threading.Lock()
        self.owned: dict[int, OwnedShard] = {}
        self._assigned: set[int] = set()
        self._reopen_at: dict[int, float] = {}
        self._halted: dict[int, str] = {}
        # Whether the group's assignment reached this member (and was not lost since): only
        # then is the set of shards it should own known (readiness).
        self.joined = False
        self._member_metadata: Any = None

    def _kafka_destination(self, partition: int) -> Destination:
        c = self.config
        return KafkaDestination(
            KafkaDestinationConfig(
                bootstrap=c.destination_bootstrap or c.bootstrap,
                topics=dict(c.destination_topics),
                delivery=c.destination_delivery,
                transactional_id=f"nereus-dest.{c.commands_topic}.{partition}",
                linger_ms=c.destination_linger_ms,
                client_config=dict(c.client_config),
            ),
            logger=self.log.bind(shard=partition),
        )

    # Reading ------------------------------------------------------------------------------

    def snapshot(self) -> dict[int, OwnedShard]:
        with self.lock:
            return dict(self.owned)

    def halted(self) -> dict[int, str]:
        with self.lock:
            return dict(self._halted)

    def shard_states(self) -> dict[int, str]:
        with self.lock:
            owned = dict(self.owned)
            assigned = set(self._assigned)
            halted = set(self._halted)
        states: dict[int, str] = {}
        for partition in sorted(assigned | set(owned) | halted):
            shard = owned.get(partition)
            if partition in halted:
                states[partition] = "halted"
            elif shard is None:
                states[partition] = "reopening"
            elif shard.runtime.is_recovered():
                states[partition] = "active"
            else:
                states[partition] = "catching_up"
        return states

    # Group membership ---------------------------------------------------------------------

    def _instance_id(self) -> str:
        """This data directory's static member id, made on its first start."""
        path = os.path.join(self.config.data_dir, "group-instance-id")
        try:
            with open(path) as f:
                found = f.read().strip()
            if found:
                return found
        except FileNotFoundError:
            pass
        made = f"nereus-{uuid.uuid4().hex}"
        with open(path + ".tmp", "w", opener=files.opener) as f:
            f.write(made + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(path + ".tmp", path)
        return made

    def serve_group(self) -> None:
        """The member's thread: serve the group protocol and look after the shards until
        the service stops, then let every shard go and leave."""
        c = self.config
        conf: dict[str, Any] = {
            **c.client_settings(),
            "client.id": "nereus-member",
            "group.id": c.group,
            "partition.assignment.strategy": "cooperative-sticky",
            "session.timeout.ms": c.session_timeout_ms,
            "heartbeat.interval.ms": c.heartbeat_interval_ms,
            "max.poll.interval.ms": c.max_poll_interval_ms,
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
        if c.static_membership:
            conf["group.instance.id"] = self._instance_id()
        member = Consumer(conf)
        member.subscribe(
            [c.commands_topic],
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_lost,
        )
        try:
            while not self._stop.is_set():
                member.poll(0.2)  # serves the group protocol; its partitions stay paused
                # Read here, in the member's own thread (the call blocks while another
                # thread polls); shard threads use the latest copy.
                self._member_metadata = member.consumer_group_metadata()
                self._supervise()
        finally:
            self._release_all("stopping")
            try:
                # A dynamic member leaves the group here and its shards move at once; a
                # static one keeps its place until its session times out.
                member.close()
            except (KafkaException, RuntimeError) as exc:
                self.log.warning("group_leave_failed", error=str(exc))

    def _group_metadata(self) -> Any:
        return self._member_metadata

    def _on_assign(self, consumer: Any, partitions: list[Any]) -> None:
        consumer.incremental_assign(partitions)
        self._member_metadata = consumer.consumer_group_metadata()
        if partitions:
            consumer.pause(partitions)
        for tp in partitions:
            with self.lock:
                self._assigned.add(tp.partition)
                self._halted.pop(tp.partition, None)
            self._open_shard(tp.partition)
        # After the shards are opened: a member that owns them is not "settled" before.
        self.joined = True
        self.log.info("shards_assigned", added=[tp.partition for tp in partitions])

    def _on_revoke(self, consumer: Any, partitions: list[Any]) -> None:
        self._let_go(partitions, "revoked")
        consumer.incremental_unassign(partitions)
        self.log.info("shards_revoked", removed=[tp.partition for tp in partitions])

    def _on_lost(self, consumer: Any, partitions: list[Any]) -> None:
        self.joined = False  # out of the group until the next assignment
        self._let_go(partitions, "lost")
        consumer.incremental_unassign(partitions)
        self.log.warning("shards_lost", removed=[tp.partition for tp in partitions])

    def _let_go(self, partitions: list[Any], reason: str) -> None:
        """Stop each shard before the callback returns: only then may the group hand the
        partition to another process."""
        for tp in partitions:
            with self.lock:
                self._assigned.discard(tp.partition)
                self._reopen_at.pop(tp.partition, None)
                self._halted.pop(tp.partition, None)
            self._close_shard(tp.partition, reason)

    # Shards -------------------------------------------------------------------------------

    def _open_shard(self, partition: int) -> None:
        c, parts = self.config, self.parts
        path = os.path.join(c.data_dir, f"shard-{partition}")
        logger = self.log.bind(shard=partition)
        try:
            store = ShardStore.open(
                path,
                shard_id=f"kafka:{c.commands_topic}:{partition}",
                config=parts.kernel_config,
                options=parts.store_options,
            )
        except Exception as exc:
            with self.lock:
                self._halted[partition] = f"cannot open {path}: {exc}"
            logger.error("shard_open_failed", error=str(exc))
            return
        metrics = ScopedMetrics(parts.metrics, {"shard": str(partition)})
        kafka_log = KafkaLog(
            store,
            KafkaLogConfig(
                bootstrap=c.bootstrap,
                topic=c.commands_topic,
                partition=partition,
                replies_topic=c.replies_topic,
                process_id=c.process_id,
                reply_window_ms=c.reply_window_ms,
                send_lease_ms=c.send_lease_ms,
                proof_interval_ms=c.proof_interval_ms,
                snapshot_interval_ms=c.snapshot_interval_ms,
                snapshot_bytes_per_tick=c.snapshot_bytes_per_tick,
                client_config=dict(c.client_config),
            ),
            group_metadata=self._group_metadata,
            on_reply=parts.on_reply,
            logger=logger,
            metrics=metrics,
        )
        try:
            destination = self._destination_factory(partition)
        except Exception:
            store.close()
            raise
        runtime = ShardRuntime(
            store,
            destination,
            parts.clock,
            config=msgspec.structs.replace(
                parts.runtime_config, owner=c.process_id, claim_namespace=kafka_log.tenure
            ),
            metrics=metrics,
            logger=logger,
            shard_log=kafka_log,
        )
        shard = OwnedShard(partition, store, kafka_log, destination, runtime)
        with self.lock:
            self.owned[partition] = shard
        runtime.start()
        logger.info("shard_opened", applied_position=store.meta.position)

    def _close_shard(self, partition: int, reason: str) -> None:
        with self.lock:
            shard = self.owned.pop(partition, None)
        if shard is None:
            return
        shard.runtime.stop(timeout_s=60)
        shard.runtime.release()
        with shard.lock:
            shard.closed = True
            shard.log.close()
            shard.destination.close()
            shard.store.close()
        drop_series(self.parts.metrics, {"shard": str(partition)})
        self.log.info("shard_closed", shard=partition, reason=reason)

    def _supervise(self) -> None:
        """Close the shards that halted or were lost; reopen a lost one still assigned here
        after the backoff."""
        for shard in self.snapshot().values():
            runtime = shard.runtime
            if runtime.halted is not None:
                with self.lock:
                    self._halted[shard.partition] = repr(runtime.halted)
                self._close_shard(shard.partition, "halted")
            elif runtime.lost is not None:
                self._close_shard(shard.partition, "lost")
                with self.lock:
                    if shard.partition in self._assigned:
                        backoff = self.config.reopen_backoff_ms / 1000
                        self._reopen_at[shard.partition] = time.monotonic() + backoff
        now = time.monotonic()
        with self.lock:
            for partition in [p for p in self._reopen_at if p not in self._assigned]:
                del self._reopen_at[partition]
            due = [p for p, at in self._reopen_at.items() if now >= at]
            for partition in due:
                del self._reopen_at[partition]
        for partition in due:
            self._open_shard(partition)

    def _release_all(self, reason: str) -> None:
        for partition in list(self.snapshot()):
            self._close_shard(partition, reason)
