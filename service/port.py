"""The one port of the application layer: what every edge needs from a running service.

    service: TimerService = nereus.service          # the embedded shard (`service.embedded`)
    service: TimerService = KafkaService(...)       # or Kafka mode (`adapters.kafka.service`)
    outcomes = service.execute([schedule_record("reminders", "k", b"x", delay_ms=1000)], 30)

Theory of operation: the port is small on purpose. Its unit of work is the one the shard log
takes, a sequence of `Appendable` built and checked by `service.arguments`, appended as one
unit and answered once durable with the kernel's outcome per item (`execute`, and
`execute_async` for an event loop, which holds no thread while it waits). A caller whose
appends are rate limited (the HTTP DELETE) uses `cancel_async`, the one place where the
service, not the caller, judges from committed state whether a unit may be refused. Reads
are plain calls; `inline_reads` says whether they answer without waiting on a lock (the
embedded store: read snapshots, microseconds), or may wait (Kafka mode: a shard's lock,
which its tick holds), so that an event loop knows to run them on a thread. The calls users
make (`schedule`, `cancel`, ... and their `_async` forms) are built once over this port
(`service.calls`), so an edge never shapes arguments or answers of its own.

Two implementations: `service.embedded.EmbeddedService` (one shard in this process) and
`adapters.kafka.service.KafkaService` (the shards of the Kafka commands topic). The same
calls give them the same answers (tests/service/test_service_port.py runs one suite over both).
`ShardNotLocal` (`adapters.errors`) is what a read raises when this process cannot see the
shard it needs; only Kafka mode raises it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from nereus.kernel.config import KernelConfig
from nereus.kernel.effects import EntryOutcome
from nereus.kernel.model import Message, TenantUsage
from nereus.kernel.records import Appendable
from nereus.runtime.metrics import Metrics
from nereus.service.inspect import Inspection
from nereus.service.readiness import Reason
from nereus.service.results import Peek


class TimerService(Protocol):
    """What the edges need from the service behind them (see the module)."""

    @property
    def kernel_config(self) -> KernelConfig:
        """The shards' kernel config, by which a refusal's message states its limits."""
        ...

    @property
    def metrics(self) -> Metrics: ...

    @property
    def inline_reads(self) -> bool:
        """True when the reads below never wait on a lock: an event loop may call them
        inline. False: run them on a thread."""
        ...

    # Commands -------------------------------------------------------------------------------

    def execute(self, items: Sequence[Appendable], timeout_s: float) -> list[EntryOutcome]:
        """Append the items as one unit and return their outcomes once durable, waiting on
        the caller's thread. Raises TypeError/ValueError for an item the log cannot carry,
        and Overloaded, RuntimeHalted, TimeoutError or adapters.errors.Unavailable when it
        cannot append."""
        ...

    async def execute_async(
        self, items: Sequence[Appendable], timeout_s: float
    ) -> list[EntryOutcome]:
        """`execute` awaited on the running event loop, without a thread of its own."""
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

    # Reads ----------------------------------------------------------------------------------

    def peek(self, queue: str, timer_key: str, *, tenant: str = ...) -> Peek:
        """The timer's row as stored. Raises ShardNotLocal when this process cannot read the
        timer's shard."""
        ...

    def list_timers(
        self, queue: str, after: str | None, limit: int, *, tenant: str = ...
    ) -> tuple[list[Message], bool]:
        """The queue's live timers after `after` in byte order of the key, at most `limit`,
        and whether more follow. Raises ShardNotLocal."""
        ...

    def tenant_usage(self, tenant: str = ...) -> TenantUsage:
        """The tenant's durable usage (live timers, their payload bytes). Raises
        ShardNotLocal."""
        ...

    def map_usage(self) -> float:
        """The fraction of the (fullest) LMDB map in use: storage is full at 0.95."""
        ...

    def health(self) -> tuple[bool, dict[str, Any]]:
        """Whether the service runs, and the document `/healthz` answers."""
        ...

    def readiness(self) -> list[Reason]:
        """Why this process is not ready (`service.readiness`): empty when it is."""
        ...

    def inspection(self) -> Inspection | None:
        """The operator console's reads (`service.inspect`), or None where this service
        does not offer them."""
        ...
