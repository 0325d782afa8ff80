"""Command RPC: commands out to their shards' partitions, outcomes back.

Theory of operation: `execute` produces each command in an envelope to its shard's partition
(an idempotent producer) with this process as `reply_to`, and waits for its outcome. The
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

from nereus.adapters.errors import Unavailable
from nereus.adapters.kafka.config import KafkaServiceConfig
from nereus.adapters.kafka.wire import (
    Envelope,
    command_shard,
    decode_reply,
    encode_envelope,
    watermarks,
)
from nereus.kernel.effects import EntryOutcome
from nereus.runtime.errors import Overloaded
from nereus.storage.store import Appendable

NO_OUTCOME = (
    "no outcome in time: the command's shard may have no owner right now "
    "(it may still be applied; a retry with the same txn is safe)"
)


class Waiter:
    """One command's outcome (or the error that stands for it), once it comes."""

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
        """Produce each command to its shard and wait for every outcome. The commands of one
        call are independent records (several shards): a failure answers Unavailable
        though some may have been appended; retrying a schedule with its txn is safe."""
        deadline = time.monotonic() + timeout_s
        ids: list[str] = []
        waiters: list[Waiter] = []
        try:
            self._produce(items, ids, waiters)
            for waiter in waiters:
                if not waiter.event.wait(max(deadline - time.monotonic(), 0)):
                    raise TimeoutError(NO_OUTCOME)
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
            return _outcomes(waiters)
        finally:
            self._forget(ids)

    def _produce(self, items: Sequence[Appendable], ids: list[str], waiters: list[Waiter]) -> None:
        """Produce each command, registering its waiter (in `ids`/`waiters` as it goes, so
        the caller forgets them whatever happens)."""
        producer = self._producer
        if producer is None:
            raise Unavailable("the Kafka service is not started")
        for record, payload in items:
            request_id = uuid.uuid4().hex
            waiter = Waiter()
            with self._waiters_lock:
                self._waiters[request_id] = waiter
            ids.append(request_id)
            waiters.append(waiter)
            envelope = Envelope(request_id, self.config.process_id, record, payload)
            try:
                producer.produce(
                    self.config.commands_topic,
                    value=encode_envelope(envelope),
                    partition=command_shard(record, self._shards),
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
                self.complete(request_id, None, f"the command was not appended: {err}")

        return on_delivery

    def complete(
        self, request_id: str, outcome: EntryOutcome | None, error: str | None = None
    ) -> None:
        """The outcome of a command this process sent (from a reply, or from the fold of a
        shard owned here)."""
        with self._waiters_lock:
            waiter = self._waiters.get(request_id)
        if waiter is not None:
            waiter.finish(outcome, error)

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
                self.complete(reply.request_id, reply.outcome)

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


def _outcomes(waiters: list[Waiter]) -> list[EntryOutcome]:
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
