"""The port behind the routes: what the HTTP API needs from the service it fronts.

Theory of operation: a command is appended and awaited without a thread of its own. The
embedded runtime completes a `CommandFuture` on its loop thread once the commit is durable;
`await_command` hangs an asyncio future on it (one `call_soon_threadsafe` at completion), so
a request waiting for its fsync costs the event loop nothing while it waits. The Kafka
service (`adapters.kafka.service.KafkaService`) offers the same `execute_async` over its
reply waiters. Reads are plain calls: the API runs them off the event loop when a backend
says they may block on a lock (`inline_reads` False, the Kafka service's shard locks).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from nereus.adapters.local.commands import await_command
from nereus.adapters.local.embedded import Nereus, Peek
from nereus.kernel.config import KernelConfig
from nereus.kernel.effects import EntryOutcome
from nereus.kernel.keys import DEFAULT_TENANT
from nereus.kernel.model import Message, TenantUsage
from nereus.kernel.records import Appendable
from nereus.runtime.metrics import Metrics
from nereus.service.clock_bound import clock_problem
from nereus.service.readiness import Reason, clock_reason, shard_reasons


class TimerBackend(Protocol):
    """What the routes need from the service behind them."""

    @property
    def kernel_config(self) -> KernelConfig: ...

    @property
    def metrics(self) -> Metrics: ...

    async def execute_async(
        self, items: Sequence[Appendable], timeout_s: float
    ) -> list[EntryOutcome]:
        """Append the items as one unit and return their outcomes once durable. Raises
        Overloaded, RuntimeHalted, TimeoutError or adapters.errors.Unavailable when it
        cannot."""
        ...

    async def cancel_async(
        self, items: Sequence[Appendable], may_append: Callable[[], bool], timeout_s: float
    ) -> list[EntryOutcome] | None:
        """A unit of cancels from a caller whose appends are limited: `may_append()` takes a
        token and says whether one was there; it is asked only when the unit would be
        appended. None means "refuse it, rate limited": only for a unit the service has
        judged from committed state to cancel no pending timer. A unit that cancels a
        pending timer is never refused (specs/http.md, "Rate limit")."""
        ...

    def peek(self, queue: str, timer_key: str, *, tenant: str = DEFAULT_TENANT) -> Peek:
        """Raises ShardNotLocal when this process cannot read the timer's shard."""
        ...

    def list_timers(
        self, queue: str, after: str | None, limit: int, *, tenant: str
    ) -> tuple[list[Message], bool]:
        """The queue's live timers after `after` in byte order of the key, at most `limit`,
        and whether more follow. Raises ShardNotLocal."""
        ...

    def tenant_usage(self, tenant: str) -> TenantUsage:
        """The tenant's durable usage (live timers, their payload bytes). Raises
        ShardNotLocal."""
        ...

    def map_usage(self) -> float:
        """The fraction of the (fullest) LMDB map in use: storage is full at 0.95."""
        ...

    def health(self) -> tuple[bool, dict[str, Any]]: ...

    def readiness(self) -> list[Reason]:
        """Why this process is not ready (`service.readiness`): empty when it is."""
        ...


# How often a rate-limited cancel asks again whether its key's command is still in flight: a
# commit takes about a millisecond to a few, so this adds at most a few to its answer.
_IN_FLIGHT_POLL_S = 0.002


class EmbeddedBackend:
    """The embedded `Nereus` (one shard in this process) as a TimerBackend."""

    # LMDB reads take no lock and a few microseconds: not worth a hop to a thread.
    inline_reads = True

    def __init__(self, nereus: Nereus) -> None:
        self.nereus = nereus

    @property
    def kernel_config(self) -> KernelConfig:
        return self.nereus.store.config

    @property
    def metrics(self) -> Metrics:
        return self.nereus.runtime.metrics

    async def execute_async(
        self, items: Sequence[Appendable], timeout_s: float
    ) -> list[EntryOutcome]:
        return await await_command(self.nereus.submit(items), timeout_s)

    async def cancel_async(
        self, items: Sequence[Appendable], may_append: Callable[[], bool], timeout_s: float
    ) -> list[EntryOutcome] | None:
        """Never None here: a unit is answered from the snapshot, appended with a token, or
        appended without one because it cancels a pending timer. While something for its
        keys is in flight it waits (so a caller out of tokens cannot append by racing a
        command of its key), until the commit timeout: then it is appended, as any cancel."""
        deadline = time.monotonic() + timeout_s
        while True:
            future = self.nereus.submit_cancels(items, may_append)
            if future is not None:
                break
            if time.monotonic() >= deadline:
                future = self.nereus.submit(items)
                break
            await asyncio.sleep(_IN_FLIGHT_POLL_S)
        # The commit gets its own timeout: a wait for the key's commands spent none of it.
        return await await_command(future, timeout_s)

    def peek(self, queue: str, timer_key: str, *, tenant: str = DEFAULT_TENANT) -> Peek:
        return self.nereus.peek(queue, timer_key, tenant=tenant)

    def list_timers(
        self, queue: str, after: str | None, limit: int, *, tenant: str
    ) -> tuple[list[Message], bool]:
        with self.nereus.store.read() as view:
            return view.list_timers(tenant, queue, after, limit)

    def tenant_usage(self, tenant: str) -> TenantUsage:
        with self.nereus.store.read() as view:
            return view.tenant_usage(tenant)

    def map_usage(self) -> float:
        return self.nereus.store.map_usage()

    def readiness(self) -> list[Reason]:
        runtime = self.nereus.runtime
        halted = None if runtime.halted is None else repr(runtime.halted)
        reasons = shard_reasons(0, halted=halted, recovered=runtime.is_recovered())
        return reasons + clock_reason(clock_problem(runtime.clock))

    def health(self) -> tuple[bool, dict[str, Any]]:
        halted = self.nereus.runtime.halted
        return halted is None, {
            "ok": halted is None,
            "appliedPosition": self.nereus.store.meta.position,
        }
