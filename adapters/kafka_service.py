"""Kafka mode: one process among several sharing the shards of the Kafka commands topic.

    service = KafkaService(KafkaServiceConfig(bootstrap="127.0.0.1:9092", data_dir="data"),
                           clock=SystemClock(assumed_error_ms=5))
    service.start()
    outcomes = service.execute([schedule_record("reminders", "k", b"x", delay_ms=1000)], 30)

Theory of operation (decisions in `specs/kafka.md`):

* **Topics.** The commands topic's partitions are the shards (created if absent, with
  `message.timestamp.type=LogAppendTime` and no retention, and refused at start if its
  timestamps are not the broker's); replies travel on the replies topic.
* **Ownership.** The process joins the consumer group on the commands topic (cooperative
  sticky assignment; the membership consumer never fetches: its partitions are paused). Each
  assigned partition gets a shard: its LMDB store `DATA/shard-<p>`, a `KafkaLog` (own reader,
  transactional writer), a `KafkaDestination` and a `ShardRuntime` thread. On revocation
  (or loss) the shard's runtime is stopped before the callback returns, its claims dropped,
  and its store closed; only then can the group give the partition to another process. A
  shard whose log was fenced while still assigned here is reopened after a backoff (a new
  `init_transactions`), unless the group takes it away first.
* **Commands.** `execute` produces each command in an envelope to its shard's partition
  (idempotent producer) with this process as `reply_to`, and waits for the outcome: from the
  local shard's fold when the shard is owned here, else from the replies topic, which every
  process reads from its end (read_committed) and matches by request id. No other channel
  between processes exists.
* **Reads.** A peek needs the timer's shard owned here; a queue listing needs every shard
  (`ShardNotLocal` otherwise). Tenant usage for quotas is the sum over the shards this
  process owns, so with shards spread over processes a quota sees part of the usage.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._config import ConfigResource
from confluent_kafka.cimpl import NewTopic

from adapters.embedded import DEFAULT_TENANT, Peek, peek_store
from adapters.errors import ShardNotLocal, Unavailable
from adapters.kafka_destination import KafkaDestination, KafkaDestinationConfig
from adapters.kafka_log import KafkaLog, KafkaLogConfig
from adapters.kafka_wire import (
    Envelope,
    command_shard,
    decode_reply,
    default_process_id,
    encode_envelope,
    shard_for,
    watermarks,
)
from kernel.config import KernelConfig
from kernel.effects import EntryOutcome
from kernel.model import Message, TenantUsage
from runtime.clock import ClockSource
from runtime.config import RuntimeConfig
from runtime.destination import Destination
from runtime.errors import Overloaded
from runtime.log import Logger, NullLogger
from runtime.metrics import Metrics, ScopedMetrics, drop_series
from runtime.shard import ShardRuntime
from storage.schema import StoreOptions
from storage.store import Appendable, ShardStore

# Room above the payload ceiling for the envelope (record fields, headers, framing).
ENVELOPE_RESERVE_BYTES = 256 * 1024


class KafkaServiceConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    bootstrap: str
    data_dir: str
    commands_topic: str = "nereus.commands"
    replies_topic: str = "nereus.replies"
    group: str = "nereus-shards"
    # False: a client only (commands out, outcomes back through the replies topic); it joins
    # no group and never owns a shard, e.g. an application embedding the library beside the
    # `nereus serve --kafka` processes that own the shards.
    own_shards: bool = True
    # Partitions of the commands topic when this process creates it. If the topic exists,
    # its partition count is the shard count; a different explicit `shards` is refused.
    shards: int | None = None
    default_shards: int = 4
    replication_factor: int = -1  # -1: the broker's default
    process_id: str = msgspec.field(default_factory=default_process_id)
    # queue -> destination topic (a queue not listed publishes to the topic of its name).
    destination_topics: dict[str, str] = msgspec.field(default_factory=dict)
    # The cluster the timers are published to, if not the one holding the commands topic.
    destination_bootstrap: str | None = None
    destination_linger_ms: int = 5
    # "transactional": each shard's destination producer has the transactional id
    # "nereus-dest.<commands topic>.<shard>", so a new owner fences the old one's and proves
    # absence; "idempotent" for clusters that do not allow transactions (specs/kafka.md).
    destination_delivery: Literal["transactional", "idempotent"] = "transactional"
    session_timeout_ms: int = 6_000
    # Static group membership (`group.instance.id`, kept in DATA/group-instance-id): a
    # process restarted on the same data directory takes its shards back at once instead of
    # waiting for the group to time its previous incarnation out. The price, Kafka's own: a
    # process that stops for good hands its shards over only when its session times out.
    static_membership: bool = True
    heartbeat_interval_ms: int = 1_000
    max_poll_interval_ms: int = 60_000
    reopen_backoff_ms: int = 3_000
    reply_window_ms: int = 60_000
    send_lease_ms: int = 2_000
    proof_interval_ms: int = 1_000
    replies_retention_ms: int = 3_600_000
    admin_timeout_s: float = 30.0
    client_config: dict[str, str | int | float | bool] = msgspec.field(default_factory=dict)


class _Waiter:
    def __init__(self) -> None:
        self.event = threading.Event()
        self.outcome: EntryOutcome | None = None
        self.error: str | None = None
        self._lock = threading.Lock()
        self._callback: Callable[[], None] | None = None

    def finish(self, outcome: EntryOutcome | None, error: str | None) -> None:
        with self._lock:
            if self.event.is_set():
                return
            self.outcome, self.error = outcome, error
            self.event.set()
            callback = self._callback
        if callback is not None:
            callback()

    def on_done(self, callback: Callable[[], None]) -> None:
        """Call `callback` once finished (on the finishing thread), or at once if it is."""
        with self._lock:
            if not self.event.is_set():
                self._callback = callback
                return
        callback()


@dataclass
class _Shard:
    partition: int
    store: ShardStore
    log: KafkaLog
    destination: Destination
    runtime: ShardRuntime
    lock: threading.Lock = field(default_factory=threading.Lock)
    closed: bool = False


class KafkaService:
    """A `adapters.http.backend.TimerBackend` over the Kafka-partitioned shard log."""

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
        self._destination_factory = destination_factory or self._kafka_destination
        self.shards = 0
        self._owned: dict[int, _Shard] = {}
        self._assigned: set[int] = set()
        self._reopen_at: dict[int, float] = {}
        self._halted: dict[int, str] = {}
        self._shards_lock = threading.Lock()
        self._waiters: dict[str, _Waiter] = {}
        self._waiters_lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._producer: Any = None
        self._replies: Any = None
        self._member: Any = None
        self._member_metadata: Any = None
        self._started = False

    @property
    def kernel_config(self) -> KernelConfig:
        return self._kernel_config

    @property
    def metrics(self) -> Metrics:
        return self._metrics

    def _common(self) -> dict[str, Any]:
        conf: dict[str, Any] = {"bootstrap.servers": self.config.bootstrap}
        conf.update(self.config.client_config)
        return conf

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

    # Starting -----------------------------------------------------------------------------

    def start(self) -> None:
        if self._started:
            return
        self._started = True
        if self.config.own_shards:
            os.makedirs(self.config.data_dir, exist_ok=True)
        self.shards = self._ensure_topics()
        max_bytes = self._kernel_config.max_payload_bytes + ENVELOPE_RESERVE_BYTES
        self._producer = Producer(
            {
                **self._common(),
                "client.id": "nereus-commands",
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 1,
                "message.max.bytes": max_bytes,
            }
        )
        self._start_replies_reader()
        self._spawn("nereus-kafka-producer", self._serve_producer)
        self._spawn("nereus-kafka-replies", self._serve_replies)
        if self.config.own_shards:
            self._spawn("nereus-kafka-group", self._serve_group)
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

    def _ensure_topics(self) -> int:
        """Create the commands and replies topics if absent; check the commands topic."""
        c = self.config
        admin = AdminClient({**self._common(), "client.id": "nereus-admin"})
        wanted = c.shards or c.default_shards
        max_bytes = self._kernel_config.max_payload_bytes + ENVELOPE_RESERVE_BYTES
        commands = NewTopic(
            c.commands_topic,
            wanted,
            c.replication_factor,
            config={
                "message.timestamp.type": "LogAppendTime",
                "retention.ms": "-1",
                "retention.bytes": "-1",
                "cleanup.policy": "delete",
                "max.message.bytes": str(max_bytes),
            },
        )
        replies = NewTopic(
            c.replies_topic,
            wanted,
            c.replication_factor,
            config={"retention.ms": str(c.replies_retention_ms)},
        )
        futures = admin.create_topics([commands, replies], operation_timeout=c.admin_timeout_s)
        for name, future in futures.items():
            try:
                future.result(timeout=c.admin_timeout_s)
                self.log.info("topic_created", topic=name, partitions=wanted)
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise
        partitions = _wait_for_leaders(admin, c.commands_topic, c.admin_timeout_s)
        _wait_for_leaders(admin, c.replies_topic, c.admin_timeout_s)
        if c.shards is not None and partitions != c.shards:
            raise ValueError(
                f"{c.commands_topic} has {partitions} partitions, not {c.shards}: the shard "
                "count is the partition count, and changing it would move identities "
                "between shards"
            )
        resource = ConfigResource(ConfigResource.Type.TOPIC, c.commands_topic)
        entries = admin.describe_configs([resource])[resource].result(timeout=c.admin_timeout_s)
        ts_type = entries.get("message.timestamp.type")
        if ts_type is None or ts_type.value != "LogAppendTime":
            raise ValueError(
                f"{c.commands_topic} has message.timestamp.type="
                f"{ts_type.value if ts_type is not None else '?'}: the shard log's persistence "
                "time must be the broker's (LogAppendTime)"
            )
        return partitions

    # Commands -----------------------------------------------------------------------------

    def execute(self, items: Sequence[Appendable], timeout_s: float) -> list[EntryOutcome]:
        """Produce each command to its shard and wait for every outcome. The commands of one
        call are independent records (several shards): a failure answers Unavailable
        though some may have been appended; retrying a schedule with its txn is safe."""
        deadline = time.monotonic() + timeout_s
        ids: list[str] = []
        waiters: list[_Waiter] = []
        try:
            self._produce(items, ids, waiters)
            for waiter in waiters:
                if not waiter.event.wait(max(deadline - time.monotonic(), 0)):
                    raise TimeoutError(_NO_OUTCOME)
            return _outcomes(waiters)
        finally:
            self._forget(ids)

    async def execute_async(
        self, items: Sequence[Appendable], timeout_s: float
    ) -> list[EntryOutcome]:
        """`execute` for an event loop: the replies wake asyncio futures (the HTTP edge waits
        on many commands at once without a thread each)."""
        loop = asyncio.get_running_loop()
        ids: list[str] = []
        waiters: list[_Waiter] = []
        try:
            self._produce(items, ids, waiters)
            futures: list[asyncio.Future[None]] = []
            for waiter in waiters:
                future: asyncio.Future[None] = loop.create_future()
                waiter.on_done(_waker(loop, future))
                futures.append(future)
            try:
                await asyncio.wait_for(asyncio.gather(*futures), timeout_s)
            except TimeoutError:
                raise TimeoutError(_NO_OUTCOME) from None
            return _outcomes(waiters)
        finally:
            self._forget(ids)

    def _produce(self, items: Sequence[Appendable], ids: list[str], waiters: list[_Waiter]) -> None:
        """Produce each command, registering its waiter (in `ids`/`waiters` as it goes, so
        the caller forgets them whatever happens)."""
        if not self._started or self._producer is None:
            raise Unavailable("the Kafka service is not started")
        for record, payload in items:
            request_id = uuid.uuid4().hex
            waiter = _Waiter()
            with self._waiters_lock:
                self._waiters[request_id] = waiter
            ids.append(request_id)
            waiters.append(waiter)
            envelope = Envelope(request_id, self.config.process_id, record, payload)
            try:
                self._producer.produce(
                    self.config.commands_topic,
                    value=encode_envelope(envelope),
                    partition=command_shard(record, self.shards),
                    on_delivery=self._on_delivery(request_id),
                )
            except BufferError as exc:
                raise Overloaded("the command producer's queue is full") from exc
            except KafkaException as exc:
                raise Unavailable(f"cannot produce the command: {exc.args[0]}") from exc

    def _forget(self, ids: list[str]) -> None:
        with self._waiters_lock:
            for request_id in ids:
                self._waiters.pop(request_id, None)

    def _on_delivery(self, request_id: str) -> Callable[[Any, Any], None]:
        def on_delivery(err: Any, _msg: Any) -> None:
            if err is not None:
                self._complete(request_id, None, f"the command was not appended: {err}")

        return on_delivery

    def _complete(
        self, request_id: str, outcome: EntryOutcome | None, error: str | None = None
    ) -> None:
        with self._waiters_lock:
            waiter = self._waiters.get(request_id)
        if waiter is not None:
            waiter.finish(outcome, error)

    def _serve_producer(self) -> None:
        while not self._stop.is_set():
            self._producer.poll(0.1)

    # Replies ------------------------------------------------------------------------------

    def _start_replies_reader(self) -> None:
        c = self.config
        consumer = Consumer(
            {
                **self._common(),
                "client.id": "nereus-replies",
                "group.id": f"nereus-replies-{uuid.uuid4().hex}",
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
                "auto.offset.reset": "latest",
                "fetch.wait.max.ms": 100,
            }
        )
        meta = consumer.list_topics(c.replies_topic, timeout=c.admin_timeout_s)
        partitions = sorted(meta.topics[c.replies_topic].partitions)
        start: list[TopicPartition] = []
        for p in partitions:
            _low, high = watermarks(consumer, TopicPartition(c.replies_topic, p), c.admin_timeout_s)
            start.append(TopicPartition(c.replies_topic, p, high))
        consumer.assign(start)
        self._replies = consumer

    def _serve_replies(self) -> None:
        consumer = self._replies
        mine = self.config.process_id.encode()
        while not self._stop.is_set():
            first = consumer.poll(0.1)  # returns at the first record (consume would wait)
            if first is None:
                continue
            for m in [first, *consumer.consume(500, 0)]:
                if m.error() is not None or m.key() != mine:
                    continue
                try:
                    reply = decode_reply(m.value() or b"")
                except msgspec.DecodeError:
                    continue
                self._complete(reply.request_id, reply.outcome)

    # Group membership and shards ----------------------------------------------------------

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
        with open(path + ".tmp", "w") as f:
            f.write(made + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(path + ".tmp", path)
        return made

    def _serve_group(self) -> None:
        c = self.config
        conf: dict[str, Any] = {
            **self._common(),
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
        self._member = member
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
            with self._shards_lock:
                self._assigned.add(tp.partition)
                self._halted.pop(tp.partition, None)
            self._open_shard(tp.partition)
        self.log.info("shards_assigned", added=[tp.partition for tp in partitions])

    def _on_revoke(self, consumer: Any, partitions: list[Any]) -> None:
        self._let_go(partitions, "revoked")
        consumer.incremental_unassign(partitions)
        self.log.info("shards_revoked", removed=[tp.partition for tp in partitions])

    def _on_lost(self, consumer: Any, partitions: list[Any]) -> None:
        self._let_go(partitions, "lost")
        consumer.incremental_unassign(partitions)
        self.log.warning("shards_lost", removed=[tp.partition for tp in partitions])

    def _let_go(self, partitions: list[Any], reason: str) -> None:
        """Stop each shard before the callback returns: only then may the group hand the
        partition to another process."""
        for tp in partitions:
            with self._shards_lock:
                self._assigned.discard(tp.partition)
                self._reopen_at.pop(tp.partition, None)
                self._halted.pop(tp.partition, None)
            self._close_shard(tp.partition, reason)

    def _open_shard(self, partition: int) -> None:
        c = self.config
        path = os.path.join(c.data_dir, f"shard-{partition}")
        logger = self.log.bind(shard=partition)
        try:
            store = ShardStore.open(
                path,
                shard_id=f"kafka:{c.commands_topic}:{partition}",
                config=self._kernel_config,
                options=self.store_options,
            )
        except Exception as exc:
            with self._shards_lock:
                self._halted[partition] = f"cannot open {path}: {exc}"
            logger.error("shard_open_failed", error=str(exc))
            return
        metrics = ScopedMetrics(self._metrics, {"shard": str(partition)})
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
                client_config=dict(c.client_config),
            ),
            group_metadata=self._group_metadata,
            on_reply=self._complete,
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
            self.clock,
            config=msgspec.structs.replace(
                self.runtime_config, owner=c.process_id, claim_namespace=kafka_log.tenure
            ),
            metrics=metrics,
            logger=logger,
            shard_log=kafka_log,
        )
        shard = _Shard(partition, store, kafka_log, destination, runtime)
        with self._shards_lock:
            self._owned[partition] = shard
        runtime.start()
        logger.info("shard_opened", applied_position=store.meta.position)

    def _close_shard(self, partition: int, reason: str) -> None:
        with self._shards_lock:
            shard = self._owned.pop(partition, None)
        if shard is None:
            return
        shard.runtime.stop(timeout_s=60)
        shard.runtime.release()
        with shard.lock:
            shard.closed = True
            shard.log.close()
            shard.destination.close()
            shard.store.close()
        drop_series(self._metrics, {"shard": str(partition)})
        self.log.info("shard_closed", shard=partition, reason=reason)

    def _supervise(self) -> None:
        with self._shards_lock:
            shards = list(self._owned.values())
        for shard in shards:
            runtime = shard.runtime
            if runtime.halted is not None:
                with self._shards_lock:
                    self._halted[shard.partition] = repr(runtime.halted)
                self._close_shard(shard.partition, "halted")
            elif runtime.lost is not None:
                self._close_shard(shard.partition, "lost")
                with self._shards_lock:
                    if shard.partition in self._assigned:
                        backoff = self.config.reopen_backoff_ms / 1000
                        self._reopen_at[shard.partition] = time.monotonic() + backoff
        now = time.monotonic()
        with self._shards_lock:
            for partition in [p for p in self._reopen_at if p not in self._assigned]:
                del self._reopen_at[partition]
            due = [p for p, at in self._reopen_at.items() if now >= at]
            for partition in due:
                del self._reopen_at[partition]
        for partition in due:
            self._open_shard(partition)

    def _release_all(self, reason: str) -> None:
        with self._shards_lock:
            partitions = list(self._owned)
        for partition in partitions:
            self._close_shard(partition, reason)

    # Reads --------------------------------------------------------------------------------

    def peek(self, queue: str, timer_key: str, *, tenant: str = DEFAULT_TENANT) -> Peek:
        partition = shard_for(tenant, queue, timer_key, self.shards)
        with self._shards_lock:
            shard = self._owned.get(partition)
        if shard is None:
            raise ShardNotLocal(f"shard {partition} is not owned by this process")
        with shard.lock:
            if shard.closed or not shard.runtime.is_recovered():
                raise ShardNotLocal(f"shard {partition} is still catching up here")
            return peek_store(shard.store, shard.runtime, queue, timer_key, tenant=tenant)

    def list_timers(
        self, queue: str, after: str | None, limit: int, *, tenant: str = DEFAULT_TENANT
    ) -> tuple[list[Message], bool]:
        """Up to `limit` live timers of the queue with timer keys strictly after `after`, in
        UTF-8 byte order, and whether more follow (see `StoreView.list_timers`). A queue's
        timers are spread over every shard, so this needs all of them owned (and caught up)
        here, else ShardNotLocal. Each shard is read in its own snapshot, one after the
        other; every shard's page is merged in key order."""
        if limit < 1:
            raise ValueError(f"limit must be at least 1, not {limit}")
        with self._shards_lock:
            owned = dict(self._owned)
        missing = [p for p in range(self.shards) if p not in owned]
        if not self.shards or missing:
            raise ShardNotLocal(
                f"listing a queue reads every shard; shards {missing} are not owned by this process"
            )
        rows: list[Message] = []
        more = False
        for partition in range(self.shards):
            shard = owned[partition]
            with shard.lock:
                if shard.closed or not shard.runtime.is_recovered():
                    raise ShardNotLocal(f"shard {partition} is not readable here right now")
                with shard.store.read() as view:
                    page, truncated = view.list_timers(tenant, queue, after, limit)
            rows.extend(page)
            more = more or truncated
        rows.sort(key=lambda m: m.timer_key.encode())
        return rows[:limit], more or len(rows) > limit

    def tenant_usage(self, tenant: str = DEFAULT_TENANT) -> TenantUsage:
        """The tenant's live timers and their payload bytes, summed over the shards this
        process owns right now. In Kafka mode a quota therefore counts only those shards:
        with the shards spread over several processes each one sees part of the usage."""
        with self._shards_lock:
            owned = list(self._owned.values())
        live = size = 0
        for shard in owned:
            with shard.lock:
                if shard.closed:
                    continue
                with shard.store.read() as view:
                    usage = view.tenant_usage(tenant)
            live += usage.live
            size += usage.bytes
        return TenantUsage(live=live, bytes=size)

    def map_usage(self) -> float:
        """The fullest owned shard store's fraction of its LMDB map in use (0.0 if none)."""
        with self._shards_lock:
            owned = list(self._owned.values())
        fullest = 0.0
        for shard in owned:
            with shard.lock:
                if not shard.closed:
                    fullest = max(fullest, shard.store.map_usage())
        return fullest

    def shard_states(self) -> dict[int, str]:
        with self._shards_lock:
            owned = dict(self._owned)
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

    def owned_store(self, partition: int) -> ShardStore | None:
        with self._shards_lock:
            shard = self._owned.get(partition)
        return None if shard is None else shard.store

    def health(self) -> tuple[bool, dict[str, Any]]:
        states = self.shard_states()
        with self._shards_lock:
            halted = dict(self._halted)
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
        if self._replies is not None:
            self._replies.close()
            self._replies = None
        if self._producer is not None:
            self._producer.flush(5)
            self._producer = None
        with self._waiters_lock:
            waiters = list(self._waiters.values())
        for waiter in waiters:
            waiter.finish(None, "the service is stopping")
        self.log.info("kafka_service_stopped")


_NO_OUTCOME = (
    "no outcome in time: the command's shard may have no owner right now "
    "(it may still be applied; a retry with the same txn is safe)"
)


def _outcomes(waiters: list[_Waiter]) -> list[EntryOutcome]:
    outcomes: list[EntryOutcome] = []
    for waiter in waiters:
        if waiter.error is not None:
            raise Unavailable(waiter.error)
        assert waiter.outcome is not None
        outcomes.append(waiter.outcome)
    return outcomes


def _waker(loop: asyncio.AbstractEventLoop, future: asyncio.Future[None]) -> Callable[[], None]:
    def wake() -> None:
        # Runs on a Kafka client thread: never raise there, even once the loop is closed.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(_resolve, future)

    return wake


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _wait_for_leaders(admin: Any, topic: str, timeout_s: float) -> int:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            meta = admin.list_topics(topic, timeout=5).topics.get(topic)
        except KafkaException:
            meta = None
        if (
            meta is not None
            and meta.error is None
            and meta.partitions
            and all(p.leader >= 0 for p in meta.partitions.values())
        ):
            return len(meta.partitions)
        if time.monotonic() >= deadline:
            raise TimeoutError(f"topic {topic} has no leaders after {timeout_s} s")
        time.sleep(0.1)
