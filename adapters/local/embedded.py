"""The library API: one shard on a directory, with the local destination by default.

    from datetime import timedelta
    from nereus import Nereus

    with Nereus.open("data", assume_clock_error_ms=5) as nereus:
        nereus.start()                                   # the runtime in a thread
        r = nereus.schedule("reminders", "trial:acme:day7", b"{}", delay_ms=timedelta(seconds=1))
        print(r.status, r.message_id, r.deliver_at_ms)
        print(nereus.peek("reminders", "trial:acme:day7"))
        with nereus.consumer("reminders", group="mailer") as consumer:
            for record in consumer.records(limit=1, idle_timeout_s=10):
                print("delivered", record.payload)

Theory of operation: a thin facade over `runtime.ShardRuntime`: it opens the shard store
(`DIR/shard`) and the local destination (`DIR/destination`) and puts the application layer's
port over them (`nereus.service`, a `service.embedded.EmbeddedService`). Its calls are the
application layer's (`service.calls`): they build checked records from the caller's
arguments (`service.arguments`; payload bytes are hashed there, the log holds only the
digest) and wait for each command's durable outcome, on the caller's thread or, for the
`_async` calls, on the event loop. A cancel that would change nothing (a key with no
row, a finished timer) and has no command for its key in flight is answered from committed
state, by the kernel's own verdict, without an entry (`runtime.absent`).
The program receives its timers through `consumer()`, a consumer group's durable position
in the destination. `run_async()` runs the loop for asyncio users. The data directory has
one owner: `open` locks it (`storage.lock`, `DIR/LOCK`) until `close`. `start()` refuses a
clock that cannot bound true time (`service.clock_bound`: nothing would fire) with
`ClockUnbounded`, unless `allow_unbounded_clock=True` was given at `open`.
"""

from __future__ import annotations

import asyncio
import builtins
import os
from collections.abc import Callable, Sequence

from nereus.adapters.clock import SystemClock
from nereus.adapters.local.async_consumer import AsyncConsumer
from nereus.adapters.local.consumer import DEFAULT_MAX_BATCH, LocalConsumer
from nereus.adapters.local.destination import LocalDestination
from nereus.kernel.config import KernelConfig
from nereus.kernel.keys import DEFAULT_TENANT
from nereus.kernel.records import Appendable
from nereus.runtime.clock import ClockSource
from nereus.runtime.config import RuntimeConfig
from nereus.runtime.destination import Destination
from nereus.runtime.intake import CommandFuture
from nereus.runtime.log import Logger, NullLogger
from nereus.runtime.metrics import Metrics
from nereus.runtime.shard import ShardRuntime
from nereus.runtime.shardlog import EmbeddedLog
from nereus.service.calls import TimerCalls
from nereus.service.clock_bound import ClockUnbounded, clock_problem, library_refusal
from nereus.service.embedded import EmbeddedService
from nereus.service.results import Listing, Peek, Result
from nereus.storage import files
from nereus.storage.lock import DirectoryLock, lock_directory
from nereus.storage.schema import StoreOptions
from nereus.storage.store import ShardStore

__all__ = ["ClockUnbounded", "Listing", "Nereus", "Peek", "Result"]

# How long a command may wait for its durable commit.
COMMAND_TIMEOUT_S = 30.0


class Nereus(TimerCalls):
    """One embedded shard: `Nereus.open(DIR)`, the calls of `TimerCalls` over its
    `service` (`service.embedded.EmbeddedService`), and `consumer()` to receive the timers
    it delivers."""

    service: EmbeddedService
    timeout_s = COMMAND_TIMEOUT_S

    def __init__(
        self,
        store: ShardStore,
        destination: Destination,
        runtime: ShardRuntime,
        lock: DirectoryLock | None = None,
        *,
        allow_unbounded_clock: bool = False,
    ) -> None:
        self.store = store
        self.allow_unbounded_clock = allow_unbounded_clock
        self.destination = destination
        self.runtime = runtime
        # The data directory's lock (`Nereus.open`): this object owns DIR until `close`.
        self._lock = lock
        self._consumers: builtins.list[LocalConsumer] = []
        # The port every edge uses (the HTTP API: `TimerApi(nereus.service)`).
        self.service = EmbeddedService(store, runtime, destination)

    @classmethod
    def open(
        cls,
        data_dir: str,
        *,
        destination: Destination | None = None,
        clock: ClockSource | None = None,
        assume_clock_error_ms: float | None = None,
        allow_unbounded_clock: bool = False,
        kernel_config: KernelConfig | None = None,
        runtime_config: RuntimeConfig | None = None,
        store_options: StoreOptions | None = None,
        metrics: Metrics | None = None,
        logger: Logger | None = None,
    ) -> Nereus:
        """Open (or create) the shard in `data_dir`. Without an explicit clock the host
        clock is used; on a host that reports no synchronisation nothing fires unless
        `assume_clock_error_ms` states the error bound the operator vouches for, and
        `start()` raises `ClockUnbounded` unless `allow_unbounded_clock=True` (then timers
        wait, their peek says `last_error='clock_unbounded'`, until the clock is bounded). The data
        directory is this object's until `close`: another open of it, in this process or
        another, raises `StoreLocked` naming the holder's pid."""
        log = logger or NullLogger()
        files.make_dirs(data_dir)
        # One owner for the whole directory: the shard store and the local destination.
        lock = lock_directory(data_dir)
        try:
            store = ShardStore.open(
                os.path.join(data_dir, "shard"), config=kernel_config, options=store_options
            )
        except BaseException:
            lock.release()
            raise
        dest: Destination | None = destination
        try:
            dest = dest or LocalDestination(os.path.join(data_dir, "destination"))
            if clock is None:  # a caller's own clock is the caller's to describe
                clk: ClockSource = SystemClock(assumed_error_ms=assume_clock_error_ms)
                _log_host_clock(log, clk)
            else:
                clk = clock
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
            if dest is not None and destination is None:
                dest.close()
            store.close()
            lock.release()
            raise
        return cls(store, dest, runtime, lock, allow_unbounded_clock=allow_unbounded_clock)

    # Lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        """Run the runtime in a background thread. Raises `ClockUnbounded` when the clock
        cannot bound true time (nothing would fire), unless the shard was opened with
        `allow_unbounded_clock=True`."""
        self._check_clock()
        self.runtime.start()

    async def run_async(self) -> None:
        """Run the runtime until cancelled, for asyncio applications. The loop itself runs in
        a worker thread: LMDB commits block. Refuses an unbounded clock as `start()` does."""
        self._check_clock()
        self.runtime.start()
        try:
            while self.runtime.halted is None:
                await asyncio.sleep(0.1)
            raise RuntimeError(f"runtime halted: {self.runtime.halted}")
        finally:
            await asyncio.to_thread(self.runtime.stop)

    def _check_clock(self) -> None:
        measured = clock_problem(self.runtime.clock)
        if measured is None:
            return
        if not self.allow_unbounded_clock:
            raise library_refusal(measured)
        self.runtime.log.warning(
            "clock_unbounded_allowed",
            measured=measured,
            detail="starting with allow_unbounded_clock=True: nothing fires until the clock "
            "is bounded",
        )

    def close(self) -> None:
        for consumer in self._consumers:
            consumer.close()
        self.runtime.stop()
        self.destination.close()
        self.store.close()
        if self._lock is not None:
            self._lock.release()  # last: the directory is free once nothing of it is open

    def __enter__(self) -> Nereus:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # Receiving ----------------------------------------------------------------------------

    def consumer(
        self,
        queue: str,
        *,
        group: str,
        tenant: str = DEFAULT_TENANT,
        auto_commit: bool = True,
        max_batch: int = DEFAULT_MAX_BATCH,
    ) -> LocalConsumer:
        """A consumer of the timers delivered to `tenant`'s `queue` (its dead letters:
        `queue + ".dlq"`) for the consumer group `group`, from the group's durable position
        on; at least once, committed per batch of at most `max_batch` records with
        `auto_commit` (`adapters.local.consumer`). It sees that tenant's records only. One
        consumer per group and queue at a time."""
        if not isinstance(self.destination, LocalDestination):
            raise TypeError(
                f"the destination is {self.destination.name!r}, not the local one: consume it "
                "with its own client (Kafka: a consumer with isolation.level=read_committed)"
            )
        consumer = LocalConsumer(
            self.destination,
            queue,
            group=group,
            tenant=tenant,
            auto_commit=auto_commit,
            max_batch=max_batch,
        )
        self._consumers = [c for c in self._consumers if not c._closed.is_set()]
        self._consumers.append(consumer)
        return consumer

    def async_consumer(
        self,
        queue: str,
        *,
        group: str,
        tenant: str = DEFAULT_TENANT,
        auto_commit: bool = True,
        max_batch: int = DEFAULT_MAX_BATCH,
    ) -> AsyncConsumer:
        """`consumer()` for asyncio: `async with nereus.async_consumer(q, group=g) as c:
        async for record in c: ...` waits without blocking the loop or holding a thread
        (`adapters.local.async_consumer`); the same positions and rules."""
        return AsyncConsumer(
            self.consumer(
                queue, group=group, tenant=tenant, auto_commit=auto_commit, max_batch=max_batch
            )
        )

    def _check_async(self) -> None:
        if self.runtime._loop_thread is None:
            raise RuntimeError(
                "the _async calls wait for the runtime's thread: call start(), or run "
                "run_async() in a task, first"
            )

    # Commands -----------------------------------------------------------------------------

    def pin(self, items: Sequence[Appendable]) -> builtins.list[Appendable]:
        """The items with every schedule pinned to the capability its queue's destination
        offers now (a Pulsar handoff target's delayed handoff, or ordinary delivery)."""
        return self.service.pin(items)

    def submit(self, items: Sequence[Appendable]) -> CommandFuture:
        """Submit a unit of commands; the future completes with their outcomes once
        durable. A unit of cancels whose verdict would change nothing, with nothing in
        flight for their keys, is answered at once from committed state, without an entry
        (`runtime.absent`)."""
        return self.service.submit(items)

    def submit_cancels(
        self, items: Sequence[Appendable], may_append: Callable[[], bool]
    ) -> CommandFuture | None:
        """`submit` for a caller whose appends are limited: `may_append()` is asked (and
        takes a token) only when the unit must be appended. Without a token, a unit whose
        verdict changes state (a pending timer's cancel) is appended all the same, and None
        means something for its keys is in flight: ask again later (`runtime.absent`)."""
        return self.service.submit_cancels(items, may_append)


def _log_host_clock(log: Logger, clock: ClockSource) -> None:
    status = clock.describe()
    if status.error_bound_ms is None:
        log.warning(
            "clock_unbounded",
            measured=status.source,
            detail="the clock cannot bound true time: nothing will be admitted or expired "
            "until it can, or until assume_clock_error_ms= states an error bound",
        )
    elif status.assumed:
        log.warning("clock_error_assumed", error_bound_ms=status.error_bound_ms)
