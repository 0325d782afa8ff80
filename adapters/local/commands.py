"""The library's calls, in both forms: `schedule`, `reschedule`, `cancel`, `peek`, `list`,
and `schedule_async`, ... for asyncio programs. `nereus.Nereus` (one embedded shard) and
`nereus.KafkaNereus` (the Kafka-partitioned shard log) inherit them and say how a command
runs (`_run`, `_run_async`) and how the store is read (`_peek`, `_list`).

Theory of operation: every argument is checked on the caller's side while its record is
built (`service.arguments`); a wrong one raises `TypeError`/`ValueError` before
anything is submitted. A command returns once durable, with the kernel's verdict as a
`Result`: a refusal by one of the kernel's rules is an answer (`ok` False, `status`
`rejected`, `code` and `message` saying which rule and why), not an exception, unless the
caller asks for one with `Result.raise_for_status()`. The async forms wait for the same
durable commit without blocking the event loop and without a thread per call
(`await_command`).
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
from collections.abc import Sequence

from nereus.kernel.config import KernelConfig
from nereus.kernel.effects import EntryOutcome
from nereus.kernel.keys import DEFAULT_TENANT
from nereus.kernel.records import Appendable, Cancel, Reschedule, Schedule
from nereus.runtime.shard import CommandFuture
from nereus.service.arguments import (
    Duration,
    Headers,
    Instant,
    Payload,
    cancel_record,
    identity,
    integer,
    optional_text,
    reschedule_record,
    schedule_record,
    text,
)
from nereus.service.results import Listing, Peek, Result, to_result

# Rows per `list` page: the HTTP API's ceiling too.
LIST_MAX_ROWS = 1000


async def await_command(future: CommandFuture, timeout_s: float) -> builtins.list[EntryOutcome]:
    """The outcomes of a submitted command, awaited on the running event loop: the commit
    wakes it with one `call_soon_threadsafe`, so a thousand waiting calls cost no thread."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def wake(_: CommandFuture) -> None:
        # Runs on the runtime's thread inside its commit: it must never raise there, even
        # when the caller's loop has been closed meanwhile.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(_resolve, done)

    future.add_done_callback(wake)
    try:
        await asyncio.wait_for(done, timeout_s)
    except TimeoutError:
        raise TimeoutError("the command was not committed in time") from None
    return future.result(0)


def _resolve(done: asyncio.Future[None]) -> None:
    if not done.done():
        done.set_result(None)


def _page(queue: str, after: str | None, limit: int, tenant: str) -> tuple[str, str | None, int]:
    """The checked arguments of `list`: (tenant, after, limit)."""
    text("queue", queue)
    limit = integer("limit", limit)
    if not 1 <= limit <= LIST_MAX_ROWS:
        raise ValueError(f"limit must be in 1..{LIST_MAX_ROWS}, not {limit}")
    return text("tenant", tenant), optional_text("after", after), limit


class TimerCommands:
    """The calls; a subclass implements `_run`, `_run_async`, `_peek`, `_list` and
    `kernel_config` (the shard's, by which a refusal's message states its limits)."""

    @property
    def kernel_config(self) -> KernelConfig:
        raise NotImplementedError

    def _one(self, outcomes: Sequence[EntryOutcome], item: Appendable) -> Result:
        record = item[0]
        assert isinstance(record, Schedule | Reschedule | Cancel)
        return to_result(outcomes[0], record, self.kernel_config)

    def _run(self, items: Sequence[Appendable]) -> builtins.list[EntryOutcome]:
        raise NotImplementedError

    async def _run_async(self, items: Sequence[Appendable]) -> builtins.list[EntryOutcome]:
        raise NotImplementedError

    def _peek(self, tenant: str, queue: str, timer_key: str) -> Peek:
        raise NotImplementedError

    def _list(self, tenant: str, queue: str, after: str | None, limit: int) -> Listing:
        raise NotImplementedError

    # schedule -----------------------------------------------------------------------------

    def schedule(
        self,
        queue: str,
        timer_key: str,
        payload: Payload,
        *,
        delay_ms: Duration | None = None,
        deliver_at_ms: Instant | None = None,
        expire_at_ms: Instant | None = None,
        lifetime_ms: Duration | None = None,
        txn: str | None = None,
        partition: str | None = None,
        headers: Headers = (),
        expected_version: int | None = None,
        tenant: str = DEFAULT_TENANT,
        producer_sub: str | None = None,
        encrypted: bool = False,
    ) -> Result:
        """Schedule (or upsert) the timer `timer_key` of `queue` to deliver `payload` at
        `deliver_at_ms`, or `delay_ms` after the command's persistence time (neither: at
        once). Without `txn` a fresh one is drawn; give one to make a retry safe."""
        item = schedule_record(
            queue,
            timer_key,
            payload,
            tenant=tenant,
            delay_ms=delay_ms,
            deliver_at_ms=deliver_at_ms,
            expire_at_ms=expire_at_ms,
            lifetime_ms=lifetime_ms,
            txn=txn,
            partition=partition,
            headers=headers,
            expected_version=expected_version,
            producer_sub=producer_sub,
            encrypted=encrypted,
        )
        return self._one(self._run([item]), item)

    async def schedule_async(
        self,
        queue: str,
        timer_key: str,
        payload: Payload,
        *,
        delay_ms: Duration | None = None,
        deliver_at_ms: Instant | None = None,
        expire_at_ms: Instant | None = None,
        lifetime_ms: Duration | None = None,
        txn: str | None = None,
        partition: str | None = None,
        headers: Headers = (),
        expected_version: int | None = None,
        tenant: str = DEFAULT_TENANT,
        producer_sub: str | None = None,
        encrypted: bool = False,
    ) -> Result:
        """`schedule`, awaited without blocking the event loop."""
        item = schedule_record(
            queue,
            timer_key,
            payload,
            tenant=tenant,
            delay_ms=delay_ms,
            deliver_at_ms=deliver_at_ms,
            expire_at_ms=expire_at_ms,
            lifetime_ms=lifetime_ms,
            txn=txn,
            partition=partition,
            headers=headers,
            expected_version=expected_version,
            producer_sub=producer_sub,
            encrypted=encrypted,
        )
        return self._one(await self._run_async([item]), item)

    # reschedule ---------------------------------------------------------------------------

    def reschedule(
        self,
        queue: str,
        timer_key: str,
        *,
        delay_ms: Duration | None = None,
        deliver_at_ms: Instant | None = None,
        expire_at_ms: Instant | None = None,
        lifetime_ms: Duration | None = None,
        txn: str | None = None,
        expected_version: int | None = None,
        tenant: str = DEFAULT_TENANT,
    ) -> Result:
        """New timing for a pending timer: a new generation, the same payload."""
        item = reschedule_record(
            queue,
            timer_key,
            tenant=tenant,
            delay_ms=delay_ms,
            deliver_at_ms=deliver_at_ms,
            expire_at_ms=expire_at_ms,
            lifetime_ms=lifetime_ms,
            txn=txn,
            expected_version=expected_version,
        )
        return self._one(self._run([item]), item)

    async def reschedule_async(
        self,
        queue: str,
        timer_key: str,
        *,
        delay_ms: Duration | None = None,
        deliver_at_ms: Instant | None = None,
        expire_at_ms: Instant | None = None,
        lifetime_ms: Duration | None = None,
        txn: str | None = None,
        expected_version: int | None = None,
        tenant: str = DEFAULT_TENANT,
    ) -> Result:
        """`reschedule`, awaited without blocking the event loop."""
        item = reschedule_record(
            queue,
            timer_key,
            tenant=tenant,
            delay_ms=delay_ms,
            deliver_at_ms=deliver_at_ms,
            expire_at_ms=expire_at_ms,
            lifetime_ms=lifetime_ms,
            txn=txn,
            expected_version=expected_version,
        )
        return self._one(await self._run_async([item]), item)

    # cancel -------------------------------------------------------------------------------

    def cancel(
        self,
        queue: str,
        timer_key: str,
        *,
        txn: str | None = None,
        expected_version: int | None = None,
        tenant: str = DEFAULT_TENANT,
    ) -> Result:
        """Cancel a pending timer; `too_late` once it crossed Admission, `absent` when no
        timer is pending under this key (it may have been delivered)."""
        item = cancel_record(
            queue, timer_key, tenant=tenant, txn=txn, expected_version=expected_version
        )
        return self._one(self._run([item]), item)

    async def cancel_async(
        self,
        queue: str,
        timer_key: str,
        *,
        txn: str | None = None,
        expected_version: int | None = None,
        tenant: str = DEFAULT_TENANT,
    ) -> Result:
        """`cancel`, awaited without blocking the event loop."""
        item = cancel_record(
            queue, timer_key, tenant=tenant, txn=txn, expected_version=expected_version
        )
        return self._one(await self._run_async([item]), item)

    # Reads --------------------------------------------------------------------------------

    def peek(self, queue: str, timer_key: str, *, tenant: str = DEFAULT_TENANT) -> Peek:
        """The timer's row as stored (an encrypted payload stays an envelope)."""
        tenant, queue, timer_key = identity(tenant, queue, timer_key)
        return self._peek(tenant, queue, timer_key)

    async def peek_async(self, queue: str, timer_key: str, *, tenant: str = DEFAULT_TENANT) -> Peek:
        """`peek` for an event loop."""
        tenant, queue, timer_key = identity(tenant, queue, timer_key)
        return await self._peek_async(tenant, queue, timer_key)

    def list(
        self,
        queue: str,
        *,
        after: str | None = None,
        limit: int = 100,
        tenant: str = DEFAULT_TENANT,
    ) -> Listing:
        """Up to `limit` live timers of `queue` (SCHEDULED, PUBLISHING, UNCERTAIN) with keys
        after `after` in UTF-8 byte order, without payloads."""
        tenant, after, limit = _page(queue, after, limit, tenant)
        return self._list(tenant, queue, after, limit)

    async def list_async(
        self,
        queue: str,
        *,
        after: str | None = None,
        limit: int = 100,
        tenant: str = DEFAULT_TENANT,
    ) -> Listing:
        """`list` for an event loop."""
        tenant, after, limit = _page(queue, after, limit, tenant)
        return await self._list_async(tenant, queue, after, limit)

    async def _peek_async(self, tenant: str, queue: str, timer_key: str) -> Peek:
        # The embedded store answers in microseconds without a lock: no hop to a thread.
        return self._peek(tenant, queue, timer_key)

    async def _list_async(self, tenant: str, queue: str, after: str | None, limit: int) -> Listing:
        return self._list(tenant, queue, after, limit)
