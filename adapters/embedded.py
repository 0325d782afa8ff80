"""The library API: one shard on a directory, with the local destination by default.

    from adapters import Nereus

    with Nereus.open("data", assume_clock_error_ms=5) as nereus:
        nereus.start()                                   # the runtime in a thread
        r = nereus.schedule("reminders", "trial:acme:day7", b"{}", delay_ms=1000)
        print(r.status, r.message_id, r.deliver_at_ms)
        print(nereus.peek("reminders", "trial:acme:day7"))

Theory of operation: a thin facade over `runtime.ShardRuntime`: it opens the shard store
(`DIR/shard`) and the local destination (`DIR/destination`), builds records from plain
arguments (payload bytes are hashed here; the log holds only the digest), and waits for each
command's durable outcome. `run_async()` runs the same loop for asyncio users.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import uuid
from collections.abc import Sequence
from typing import Any

import msgspec

from adapters.clock import SystemClock
from adapters.local_destination import LocalDestination
from kernel.codes import Code
from kernel.config import KernelConfig
from kernel.effects import EntryOutcome
from kernel.keys import message_id
from kernel.model import Message, Table
from kernel.records import Cancel, Reschedule, Schedule
from runtime.clock import ClockSource
from runtime.config import RuntimeConfig
from runtime.destination import Destination
from runtime.log import Logger, NullLogger
from runtime.metrics import Metrics
from runtime.shard import ShardRuntime
from runtime.shardlog import EmbeddedLog
from storage.schema import StoreOptions
from storage.store import Appendable, ShardStore

DEFAULT_TENANT = "default"

OK_CODES = frozenset({Code.SCHEDULED, Code.RESCHEDULED, Code.UNCHANGED, Code.CANCELED})


class Result(msgspec.Struct, frozen=True):
    """The answer to one command, after it is durable."""

    ok: bool
    status: str
    queue: str
    timer_key: str
    txn: str | None
    message_id: str | None
    deliver_at_ms: int | None
    attempt_id: str | None = None
    evidence: dict[str, Any] | None = None


class Peek(msgspec.Struct, frozen=True):
    found: bool
    queue: str
    timer_key: str
    status: str | None = None
    partition: str | None = None
    deliver_at_ms: int | None = None
    expire_at_ms: int | None = None
    txn: str | None = None
    message_id: str | None = None
    generation: int | None = None
    version: int | None = None
    payload: str | None = None  # base64, as stored (never decrypted)
    encrypted: bool | None = None
    producer_sub: str | None = None
    attempts: int | None = None
    last_error: str | None = None
    claimed: bool | None = None
    created_at_ms: int | None = None
    updated_at_ms: int | None = None


def to_result(outcome: EntryOutcome, queue: str, timer_key: str) -> Result:
    evidence = msgspec.to_builtins(outcome.evidence) if outcome.evidence else None
    return Result(
        ok=outcome.code in OK_CODES,
        status=str(outcome.code),
        queue=queue,
        timer_key=timer_key,
        txn=outcome.txn,
        message_id=outcome.message_id,
        deliver_at_ms=outcome.deliver_at_ms,
        attempt_id=outcome.attempt_id,
        evidence=evidence,
    )


def schedule_record(
    queue: str,
    timer_key: str,
    payload: bytes,
    *,
    tenant: str = DEFAULT_TENANT,
    delay_ms: int | None = None,
    deliver_at_ms: int | None = None,
    expire_at_ms: int | None = None,
    lifetime_ms: int | None = None,
    txn: str | None = None,
    partition: str | None = None,
    headers: Sequence[tuple[str, str]] = (),
    expected_version: int | None = None,
    producer_sub: str | None = None,
    encrypted: bool = False,
) -> Appendable:
    if delay_ms is None and deliver_at_ms is None:
        delay_ms = 0
    record = Schedule(
        tenant=tenant,
        queue=queue,
        timer_key=timer_key,
        txn=txn or uuid.uuid4().hex,
        payload_digest=hashlib.sha256(payload).hexdigest(),
        payload_size=len(payload),
        deliver_at_ms=deliver_at_ms,
        delay_ms=delay_ms,
        expire_at_ms=expire_at_ms,
        lifetime_ms=lifetime_ms,
        partition_key=partition,
        headers=tuple(headers),
        expected_version=expected_version,
        producer_sub=producer_sub,
        encrypted=encrypted,
    )
    return record, payload


class TimerCommands:
    """schedule / reschedule / cancel built as records and run by `_run`, which each mode
    implements: the embedded shard commits them itself, the Kafka mode produces them to the
    commands topic (`adapters.kafka_library.KafkaNereus`)."""

    def _run(self, items: Sequence[Appendable]) -> list[EntryOutcome]:
        raise NotImplementedError

    def schedule(self, queue: str, timer_key: str, payload: bytes, **options: Any) -> Result:
        item = schedule_record(queue, timer_key, payload, **options)
        return to_result(self._run([item])[0], queue, timer_key)

    def reschedule(
        self,
        queue: str,
        timer_key: str,
        *,
        delay_ms: int | None = None,
        deliver_at_ms: int | None = None,
        expire_at_ms: int | None = None,
        lifetime_ms: int | None = None,
        txn: str | None = None,
        tenant: str = DEFAULT_TENANT,
        expected_version: int | None = None,
    ) -> Result:
        record = Reschedule(
            tenant=tenant,
            queue=queue,
            timer_key=timer_key,
            txn=txn or uuid.uuid4().hex,
            deliver_at_ms=deliver_at_ms,
            delay_ms=delay_ms if delay_ms is not None or deliver_at_ms is not None else 0,
            expire_at_ms=expire_at_ms,
            lifetime_ms=lifetime_ms,
            expected_version=expected_version,
        )
        return to_result(self._run([(record, None)])[0], queue, timer_key)

    def cancel(
        self,
        queue: str,
        timer_key: str,
        *,
        txn: str | None = None,
        tenant: str = DEFAULT_TENANT,
        expected_version: int | None = None,
    ) -> Result:
        record = Cancel(tenant, queue, timer_key, expected_version=expected_version, txn=txn)
        return to_result(self._run([(record, None)])[0], queue, timer_key)


class Nereus(TimerCommands):
    def __init__(self, store: ShardStore, destination: Destination, runtime: ShardRuntime) -> None:
        self.store = store
        self.destination = destination
        self.runtime = runtime

    @classmethod
    def open(
        cls,
        data_dir: str,
        *,
        destination: Destination | None = None,
        clock: ClockSource | None = None,
        assume_clock_error_ms: float | None = None,
        kernel_config: KernelConfig | None = None,
        runtime_config: RuntimeConfig | None = None,
        store_options: StoreOptions | None = None,
        metrics: Metrics | None = None,
        logger: Logger | None = None,
    ) -> Nereus:
        """Open (or create) the shard in `data_dir`. Without an explicit clock the host
        clock is used; on a host that reports no synchronisation nothing fires unless
        `assume_clock_error_ms` states the error bound the operator vouches for."""
        log = logger or NullLogger()
        store = ShardStore.open(
            os.path.join(data_dir, "shard"), config=kernel_config, options=store_options
        )
        try:
            dest = destination or LocalDestination(os.path.join(data_dir, "destination"))
            clk = clock or SystemClock(assumed_error_ms=assume_clock_error_ms)
            status = clk.describe()
            if status.error_bound_ms is None:
                log.warning(
                    "clock_unbounded",
                    detail="the host clock reports no synchronisation: nothing will be "
                    "admitted or expired until it does, or until an assumed error bound is "
                    "configured (--assume-clock-error-ms)",
                )
            elif status.assumed:
                log.warning("clock_error_assumed", error_bound_ms=status.error_bound_ms)
            registry = metrics or Metrics()
            runtime = ShardRuntime(
                store,
                dest,
                clk,
                config=runtime_config,
                metrics=registry,
                logger=log,
                shard_log=EmbeddedLog(store, registry),
            )
        except BaseException:
            store.close()
            raise
        return cls(store, dest, runtime)

    # Lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        """Run the runtime in a background thread."""
        self.runtime.start()

    async def run_async(self) -> None:
        """Run the runtime until cancelled, for asyncio applications. The loop itself runs in
        a worker thread: LMDB commits block."""
        self.runtime.start()
        try:
            while self.runtime.halted is None:
                await asyncio.sleep(0.1)
            raise RuntimeError(f"runtime halted: {self.runtime.halted}")
        finally:
            await asyncio.to_thread(self.runtime.stop)

    def close(self) -> None:
        self.runtime.stop()
        self.destination.close()
        self.store.close()

    def __enter__(self) -> Nereus:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # Commands -----------------------------------------------------------------------------

    def _run(self, items: Sequence[Appendable]) -> list[EntryOutcome]:
        if self.runtime._loop_thread is None:
            # Not started: commit on the caller's thread so the API works without a loop.
            future = self.runtime.submit(items)
            while not future.done():
                self.runtime.tick()
            return future.result(0)
        return self.runtime.execute(items)

    def peek(self, queue: str, timer_key: str, *, tenant: str = DEFAULT_TENANT) -> Peek:
        return peek_store(self.store, self.runtime, queue, timer_key, tenant=tenant)


def peek_store(
    store: ShardStore,
    runtime: ShardRuntime,
    queue: str,
    timer_key: str,
    *,
    tenant: str = DEFAULT_TENANT,
) -> Peek:
    """A timer's row as the shard store holds it (and whether the runtime has it in hand)."""
    mid = message_id(tenant, queue, timer_key)
    with store.read() as view:
        m = view.get(Table.MESSAGES, mid.encode())
        payload = view.payload(m.payload_digest) if isinstance(m, Message) else None
    if not isinstance(m, Message):
        return Peek(found=False, queue=queue, timer_key=timer_key)
    return Peek(
        found=True,
        queue=queue,
        timer_key=timer_key,
        status=str(m.status),
        partition=m.partition_key,
        deliver_at_ms=m.deliver_at_ms,
        expire_at_ms=m.expire_at_ms,
        txn=m.txn,
        message_id=m.message_id,
        generation=m.generation,
        version=m.version,
        payload=base64.b64encode(payload).decode() if payload is not None else None,
        encrypted=m.encrypted,
        producer_sub=m.producer_sub,
        attempts=m.attempts_admitted,
        last_error=m.last_error,
        claimed=runtime.is_claimed(m),
        created_at_ms=m.created_at_ms,
        updated_at_ms=m.updated_at_ms,
    )
