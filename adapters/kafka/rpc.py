"""Command RPC: commands out to their shards' partitions, outcomes back.

Theory of operation: `execute` produces the commands of one call to their shards' partitions
(an idempotent producer) with this process as `reply_to`, and waits for their outcomes. The
commands of a call that go to one shard travel as one record (`COMMANDS_V1`, their payloads
beside it), cut so that a record stays within the topic's message size; the reply to it
holds every item's outcome. The
outcome comes from the local shard's fold when the shard is owned here (`complete`, called
by the shard's log), else from the replies topic, which every process reads from its end
(read_committed) and matches by request id. No other channel between processes exists. A
command that could not be appended answers `Unavailable`; one whose outcome does not come in
time answers `TimeoutError` (it may still be applied; a retry with the same txn is safe).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import msgspec
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from nereus.adapters.kafka.config import KafkaServiceConfig
from nereus.adapters.kafka.wire import (
    Envelope,
    command_shard,
    decode_reply,
    encode_envelope,
    watermarks,
)
from nereus.kernel.effects import EntryOutcome
from nereus.kernel.records import Appendable, encode_record
from nereus.runtime.batching import MAX_BATCH_ITEMS, command_record
from nereus.runtime.errors import Overloaded
from nereus.service.errors import Unavailable

# What a batch envelope needs beyond its items' records and payloads (request id, reply
# address, framing), and each item beyond its own encoding (array framing, a payload slot).
ENVELOPE_ROOM_BYTES = 4096
ITEM_ROOM_BYTES = 16

NO_OUTCOME = (
    "no outcome in time: the command's shard may have no owner right now "
    "(it may still be applied; a retry with the same txn is safe)"
)


class Waiter:
    """The outcomes of one produced record, one per command it carries (or the error that
    stands for them), once they come."""

    def __init__(self, count: int = 1) -> None:
        self.event = threading.Event()
        self.count = count
        self.shard = -1
        self.outcomes: Sequence[EntryOutcome] = ()
        self.error: str | None = None
        self._lock = threading.Lock()
        self._callback: Callable[[], None] | None = None

    def finish(self, outcomes: Sequence[EntryOutcome] | None, error: str | None) -> None:
        if error is None and (outcomes is None or len(outcomes) != self.count):
            error = f"the reply holds {len(outcomes or ())} outcomes for {self.count} commands"
        with self._lock:
            if self.event.is_set():
                return
            self.outcomes, self.error = outcomes or (), error
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


class CommandRpc:
    def __init__(
        self, config: KafkaServiceConfig, max_message_bytes: int, stop: threading.Event
    ) -> None:
        self.config = config
        self._max_message_bytes = max_message_bytes
        self._stop = stop
        self._shards = 0
        self._waiters: dict[str, Waiter] = {}
        self._waiters_lock = threading.Lock()
        self._producer: Any = None
        self._replies: Any = None

    def start(self, shards: int) -> None:
        """Open the command producer and start reading replies from the topic's end."""
        self._shards = shards
        self._producer = Producer(
            {
                **self.config.client_settings(),
                "client.id": "nereus-commands",
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 1,
                "message.max.bytes": self._max_message_bytes,
            }
        )
        c = self.config
        consumer = Consumer(
            {
                **c.client_settings(),
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

    # Commands -----------------------------------------------------------------------------

    def execute(self, items: Sequence[Appendable], timeout_s: float) -> list[EntryOutcome]:
        """Produce the commands to their shards and wait for every outcome. The commands of
        one call are independent records when they go to several shards (or do not fit one):
        a failure answers Unavailable though some may have been appended; retrying a
        schedule with its txn is safe."""
        deadline = time.monotonic() + timeout_s
        ids: list[str] = []
        waiters: list[Waiter] = []
        try:
            self._produce(items, ids, waiters)
            for waiter in waiters:
                if not waiter.event.wait(max(deadline - time.monotonic(), 0)):
                    raise TimeoutError(NO_OUTCOME)
            return _outcomes(items, self._shards, waiters)
        finally:
            self._forget(ids)

    async def execute_async(
        self, items: Sequence[Appendable], timeout_s: float
    ) -> list[EntryOutcome]:
        """`execute` for an event loop: the replies wake asyncio futures (the HTTP edge waits
        on many commands at once without a thread each)."""
        loop = asyncio.get_running_loop()
        ids: list[str] = []
        waiters: list[Waiter] = []
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
                raise TimeoutError(NO_OUTCOME) from None
            return _outcomes(items, self._shards, waiters)
        finally:
            self._forget(ids)

    def _produce(self, items: Sequence[Appendable], ids: list[str], waiters: list[Waiter]) -> None:
        """Produce the commands, one record per shard (and size cut), registering each
        record's waiter (in `ids`/`waiters` as it goes, so the caller forgets them whatever
        happens). The waiters' outcomes, concatenated, are in the order of `items`: callers
        hand in one shard's commands at a time or accept the order `_order` restores."""
        producer = self._producer
        if producer is None:
            raise Unavailable("the Kafka service is not started")
        for shard, group in self._groups(items):
            request_id = uuid.uuid4().hex
            waiter = Waiter(len(group))
            waiter.shard = shard
            with self._waiters_lock:
                self._waiters[request_id] = waiter
            ids.append(request_id)
            waiters.append(waiter)
            record, payload = command_record(group)
            envelope = Envelope(request_id, self.config.process_id, record, payload)
            try:
                producer.produce(
                    self.config.commands_topic,
                    value=encode_envelope(envelope),
                    partition=shard,
                    on_delivery=self._on_delivery(request_id),
                )
            except BufferError as exc:
                raise Overloaded("the command producer's queue is full") from exc
            except KafkaException as exc:
                raise Unavailable(f"cannot produce the command: {exc.args[0]}") from exc

    def _groups(self, items: Sequence[Appendable]) -> list[tuple[int, list[Appendable]]]:
        """The commands by shard, in order of first appearance, each shard's cut into runs
        of at most `MAX_BATCH_ITEMS` whose payloads fit one record."""
        by_shard: dict[int, list[list[Appendable]]] = {}
        room: dict[int, int] = {}
        budget = self._max_message_bytes - ENVELOPE_ROOM_BYTES
        for item in items:
            record, payload = item
            shard = command_shard(record, self._shards)
            size = ITEM_ROOM_BYTES + len(encode_record(record))
            size += len(payload) if isinstance(payload, bytes) else 0
            runs = by_shard.setdefault(shard, [])
            most = MAX_BATCH_ITEMS if self.config.command_batches else 1
            if not runs or len(runs[-1]) >= most or room[shard] < size:
                runs.append([])
                room[shard] = budget
            runs[-1].append(item)
            room[shard] -= size
        return [(shard, run) for shard, runs in by_shard.items() for run in runs]

    def _forget(self, ids: list[str]) -> None:
        with self._waiters_lock:
            for request_id in ids:
                self._waiters.pop(request_id, None)

    def _on_delivery(self, request_id: str) -> Callable[[Any, Any], None]:
        def on_delivery(err: Any, _msg: Any) -> None:
            if err is not None:
                self.complete(request_id, None, f"the command was not appended: {err}")

        return on_delivery

    def complete(
        self,
        request_id: str,
        outcomes: Sequence[EntryOutcome] | None,
        error: str | None = None,
    ) -> None:
        """The outcomes of a record this process sent (from a reply, or from the fold of a
        shard owned here)."""
        with self._waiters_lock:
            waiter = self._waiters.get(request_id)
        if waiter is not None:
            waiter.finish(outcomes, error)

    # Threads ------------------------------------------------------------------------------

    def serve_producer(self) -> None:
        while not self._stop.is_set():
            self._producer.poll(0.1)

    def serve_replies(self) -> None:
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
                self.complete(reply.request_id, reply.answers())

    def close(self) -> None:
        """After the threads stopped: close the clients and fail every command still
        waiting."""
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


def _outcomes(
    items: Sequence[Appendable], shards: int, waiters: list[Waiter]
) -> list[EntryOutcome]:
    """Each item's outcome, in the order of `items` (the waiters hold them by shard)."""
    for waiter in waiters:
        if waiter.error is not None:
            raise Unavailable(waiter.error)
    by_shard: dict[int, list[EntryOutcome]] = {}
    for waiter in waiters:
        by_shard.setdefault(waiter.shard, []).extend(waiter.outcomes)
    taken: dict[int, int] = {}
    ordered: list[EntryOutcome] = []
    for record, _payload in items:
        shard = command_shard(record, shards)
        at = taken.get(shard, 0)
        ordered.append(by_shard[shard][at])
        taken[shard] = at + 1
    return ordered


def _waker(loop: asyncio.AbstractEventLoop, future: asyncio.Future[None]) -> Callable[[], None]:
    def wake() -> None:
        # Runs on a Kafka client thread: never raise there, even once the loop is closed.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(_resolve, future)

    return wake


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
