"""The port over one shard in this process: `EmbeddedService(store, runtime, destination)`.

    service = EmbeddedService(store, runtime, destination)      # or `Nereus.open(DIR).service`
    outcomes = service.execute([schedule_record("reminders", "k", b"x", delay_ms=1000)], 30)

Theory of operation: a unit of commands is submitted to the `ShardRuntime`, which completes a
`CommandFuture` on its loop thread once the commit is durable. The sync form waits on the
future (and, while the runtime has no thread yet, commits on the caller's thread, so the
library works before `start()`); the async form hangs an asyncio future on it
(`await_command`, one `call_soon_threadsafe` at completion), so a caller waiting for its
fsync costs the event loop nothing. Before a unit is submitted, every schedule is pinned to
the capability its queue's destination offers now (`pin_capabilities`). A unit of cancels
that would change nothing (a key with no row, a finished timer) with nothing for its keys
in flight is answered from committed state by the kernel's own verdict, without an entry
(`runtime.absent`); a rate-limited caller's cancels go through `runtime.absent.
submit_drained` under one lock, so judging and appending are one step. Reads are LMDB read
snapshots: no lock, a few microseconds, so `inline_reads` is True.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from nereus.kernel.config import KernelConfig
from nereus.kernel.effects import EntryOutcome
from nereus.kernel.keys import DEFAULT_TENANT, message_id
from nereus.kernel.model import Message, Status, Table, TenantUsage
from nereus.kernel.records import Appendable, Schedule
from nereus.runtime.absent import answer_committed, submit_drained
from nereus.runtime.destination import Destination, capability_for
from nereus.runtime.intake import CommandFuture
from nereus.runtime.metrics import Metrics
from nereus.runtime.shard import ShardRuntime
from nereus.service.clock_bound import CLOCK_UNBOUNDED, clock_problem
from nereus.service.inspect import Inspection
from nereus.service.inspect_store import StoreInspection, opened
from nereus.service.readiness import Reason, clock_reason, shard_reasons
from nereus.service.results import Listing, Peek, listing_of, peek_of
from nereus.storage.store import ShardStore

# How often a rate-limited cancel asks again whether its key's command is still in flight: a
# commit takes about a millisecond to a few, so this adds at most a few to its answer.
_IN_FLIGHT_POLL_S = 0.002


async def await_command(future: CommandFuture, timeout_s: float) -> list[EntryOutcome]:
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


class EmbeddedService:
    """One shard in this process as a `service.port.TimerService`."""

    # LMDB reads take no lock and a few microseconds: not worth a hop to a thread.
    inline_reads = True

    def __init__(self, store: ShardStore, runtime: ShardRuntime, destination: Destination) -> None:
        self.store = store
        self.runtime = runtime
        self.destination = destination
        # Makes "judge a rate-limited caller's cancel, then append it" one step.
        self._drained = threading.Lock()

    @property
    def kernel_config(self) -> KernelConfig:
        return self.store.config

    @property
    def metrics(self) -> Metrics:
        return self.runtime.metrics

    # Submitting -----------------------------------------------------------------------------

    def pin(self, items: Sequence[Appendable]) -> list[Appendable]:
        """The items with every schedule pinned to the capability its queue's destination
        offers now (a Pulsar handoff target's delayed handoff, or ordinary delivery)."""
        return pin_capabilities(items, self.destination)

    def submit(self, items: Sequence[Appendable]) -> CommandFuture:
        """Submit a unit of commands; the future completes with their outcomes once
        durable. A unit of cancels whose verdict would change nothing, with nothing in
        flight for their keys, is answered at once from committed state, without an entry
        (`runtime.absent`)."""
        answered = answer_committed(self.runtime, items)
        if isinstance(answered, CommandFuture):
            return answered
        return self.runtime.submit(self.pin(items))

    def submit_cancels(
        self, items: Sequence[Appendable], may_append: Callable[[], bool]
    ) -> CommandFuture | None:
        """`submit` for a caller whose appends are limited: `may_append()` is asked (and
        takes a token) only when the unit must be appended. Without a token, a unit whose
        verdict changes state (a pending timer's cancel) is appended all the same, and None
        means something for its keys is in flight: ask again later (`runtime.absent`)."""
        answered = answer_committed(self.runtime, items)
        if isinstance(answered, CommandFuture):
            return answered
        if may_append():
            return self.runtime.submit(self.pin(items))
        return submit_drained(self.runtime, self.pin(items), self._drained)

    # Commands (the port) ----------------------------------------------------------------------

    def execute(self, items: Sequence[Appendable], timeout_s: float) -> list[EntryOutcome]:
        future = self.submit(items)
        if self.runtime._loop_thread is None:
            # Not started: commit on the caller's thread so the library works without a loop.
            while not future.done():
                self.runtime.run_once()
            return future.result(0)
        return future.result(timeout_s)

    async def execute_async(
        self, items: Sequence[Appendable], timeout_s: float
    ) -> list[EntryOutcome]:
        return await await_command(self.submit(items), timeout_s)

    async def cancel_async(
        self, items: Sequence[Appendable], may_append: Callable[[], bool], timeout_s: float
    ) -> list[EntryOutcome] | None:
        """Never None here: a unit is answered from the snapshot, appended with a token, or
        appended without one because it cancels a pending timer. While something for its
        keys is in flight it waits (so a caller out of tokens cannot append by racing a
        command of its key), until the commit timeout: then it is appended, as any cancel."""
        deadline = time.monotonic() + timeout_s
        while True:
            future = self.submit_cancels(items, may_append)
            if future is not None:
                break
            if time.monotonic() >= deadline:
                future = self.submit(items)
                break
            await asyncio.sleep(_IN_FLIGHT_POLL_S)
        # The commit gets its own timeout: a wait for the key's commands spent none of it.
        return await await_command(future, timeout_s)

    # Reads ----------------------------------------------------------------------------------

    def peek(self, queue: str, timer_key: str, *, tenant: str = DEFAULT_TENANT) -> Peek:
        return peek_store(self.store, self.runtime, queue, timer_key, tenant=tenant)

    def list_timers(
        self, queue: str, after: str | None, limit: int, *, tenant: str = DEFAULT_TENANT
    ) -> tuple[list[Message], bool]:
        with self.store.read() as view:
            return view.list_timers(tenant, queue, after, limit)

    def tenant_usage(self, tenant: str = DEFAULT_TENANT) -> TenantUsage:
        with self.store.read() as view:
            return view.tenant_usage(tenant)

    def map_usage(self) -> float:
        return self.store.map_usage()

    def inspection(self) -> Inspection:
        shards = {0: opened(self.store, self.runtime)}
        return StoreInspection(lambda: shards)

    def readiness(self) -> list[Reason]:
        runtime = self.runtime
        halted = None if runtime.halted is None else repr(runtime.halted)
        reasons = shard_reasons(0, halted=halted, recovered=runtime.is_recovered())
        return reasons + clock_reason(clock_problem(runtime.clock))

    def health(self) -> tuple[bool, dict[str, Any]]:
        halted = self.runtime.halted
        return halted is None, {"ok": halted is None, "appliedPosition": self.store.meta.position}


def pin_capabilities(items: Sequence[Appendable], destination: Destination) -> list[Appendable]:
    """Schedules pinned to the capability `destination` offers for their queue."""
    out: list[Appendable] = []
    for record, payload in items:
        if isinstance(record, Schedule):
            pinned = capability_for(destination, record.queue, tenant=record.tenant)
            if pinned != record.capability:
                out.append((msgspec.structs.replace(record, capability=pinned), payload))
                continue
        out.append((record, payload))
    return out


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
    peek = peek_of(m, payload, runtime.is_claimed(m))
    if m.status is Status.SCHEDULED and runtime.waiting_for_clock:
        # Nothing admits or expires it until the clock is bounded: say so where a user
        # looks, not only in a metric (the row's own last_error stays in the log).
        return msgspec.structs.replace(peek, last_error=CLOCK_UNBOUNDED)
    return peek


def list_store(
    store: ShardStore, tenant: str, queue: str, after: str | None, limit: int
) -> Listing:
    """A page of the queue's live timers as the shard store holds them."""
    with store.read() as view:
        rows, truncated = view.list_timers(tenant, queue, after, limit)
    return listing_of([peek_of(m, None, None) for m in rows], truncated)
