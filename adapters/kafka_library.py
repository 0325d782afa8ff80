"""The library API in Kafka mode: the same calls as `adapters.Nereus`, over the commands topic.

    from adapters.kafka_library import KafkaNereus

    # An application that only schedules (the shards are owned by `nereus serve --kafka`):
    with KafkaNereus.connect("127.0.0.1:9092") as nereus:
        r = nereus.schedule("reminders", "trial:acme:day7", b"{}", delay_ms=1000)

    # Or a process that also owns a share of the shards, as `nereus serve --kafka` does:
    with KafkaNereus.connect("127.0.0.1:9092", data_dir="data",
                             assume_clock_error_ms=5) as nereus:
        ...

Theory of operation: a command from the library is a record like any other, so it travels
the way the HTTP API's do: produced to its shard's partition of the commands topic and
answered by whichever process owns that shard (through the replies topic when that is another
process). There is no second path into a shard: the shard's order is the topic's order, and a
library call can never bypass the fencing that protects it. A call returns once the owner has
durably applied the command, so its `Result` is the same one the embedded facade gives.
`peek` reads only shards this process owns (`ShardNotLocal` otherwise); a client-only
instance peeks nothing and should ask a service's HTTP API.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from adapters.clock import SystemClock
from adapters.embedded import DEFAULT_TENANT, Peek, TimerCommands
from adapters.errors import ShardNotLocal
from adapters.kafka_service import KafkaService, KafkaServiceConfig
from kernel.config import KernelConfig
from kernel.effects import EntryOutcome
from runtime.clock import ClockSource
from runtime.config import RuntimeConfig
from runtime.log import Logger
from runtime.metrics import Metrics
from storage.store import Appendable


class KafkaNereus(TimerCommands):
    def __init__(self, service: KafkaService, *, timeout_s: float = 30.0) -> None:
        self.service = service
        self.timeout_s = timeout_s

    @classmethod
    def connect(
        cls,
        bootstrap: str,
        *,
        data_dir: str | None = None,
        clock: ClockSource | None = None,
        assume_clock_error_ms: float | None = None,
        kernel_config: KernelConfig | None = None,
        runtime_config: RuntimeConfig | None = None,
        metrics: Metrics | None = None,
        logger: Logger | None = None,
        timeout_s: float = 30.0,
        **options: Any,
    ) -> KafkaNereus:
        """Join the Kafka-partitioned shard log at `bootstrap` and start. With `data_dir` this
        process also owns a share of the shards (their LMDB stores live there); without it,
        it is a client only. `options` are `KafkaServiceConfig` fields (topics, group, ...).
        The kernel config must equal the shard owners' (their stores refuse another)."""
        config = KafkaServiceConfig(
            bootstrap=bootstrap,
            data_dir=data_dir or "",
            own_shards=data_dir is not None,
            **options,
        )
        service = KafkaService(
            config,
            clock=clock or SystemClock(assumed_error_ms=assume_clock_error_ms),
            kernel_config=kernel_config,
            runtime_config=runtime_config,
            metrics=metrics,
            logger=logger,
        )
        service.start()
        return cls(service, timeout_s=timeout_s)

    def _run(self, items: Sequence[Appendable]) -> list[EntryOutcome]:
        return self.service.execute(items, self.timeout_s)

    def peek(self, queue: str, timer_key: str, *, tenant: str = DEFAULT_TENANT) -> Peek:
        if not self.service.config.own_shards:
            raise ShardNotLocal("a client-only instance owns no shard: peek through a service")
        return self.service.peek(queue, timer_key, tenant=tenant)

    def close(self) -> None:
        self.service.close()

    def __enter__(self) -> KafkaNereus:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
