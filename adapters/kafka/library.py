"""The library API in Kafka mode: the same calls as `nereus.Nereus`, over the commands topic.

    from nereus.adapters.kafka.library import KafkaNereus

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
`peek` reads only shards this process owns (`ShardNotLocal` otherwise), `list` needs every
shard owned here; a client-only instance reads nothing and should ask a service's HTTP API.
A process that owns shards refuses, as `Nereus.start()` does, a clock that cannot bound true
time (`ClockUnbounded`) unless `allow_unbounded_clock=True`; a client-only one fires nothing
and needs no clock.
"""

from __future__ import annotations

from typing import Literal, TypedDict, Unpack

import msgspec

from nereus.adapters.clock import SystemClock
from nereus.adapters.kafka.service import KafkaService, KafkaServiceConfig
from nereus.kernel.config import KernelConfig
from nereus.runtime.clock import ClockSource
from nereus.runtime.config import RuntimeConfig
from nereus.runtime.log import Logger
from nereus.runtime.metrics import Metrics
from nereus.service.calls import TimerCalls
from nereus.service.clock_bound import clock_problem, library_refusal


class KafkaOptions(TypedDict, total=False):
    """The `KafkaServiceConfig` fields `connect` takes as keywords (see it for each)."""

    commands_topic: str
    replies_topic: str
    group: str
    shards: int | None
    default_shards: int
    replication_factor: int
    process_id: str
    destination_topics: dict[str, str]
    destination_bootstrap: str | None
    destination_linger_ms: int
    destination_delivery: Literal["transactional", "idempotent"]
    session_timeout_ms: int
    static_membership: bool
    heartbeat_interval_ms: int
    max_poll_interval_ms: int
    reopen_backoff_ms: int
    reply_window_ms: int
    send_lease_ms: int
    proof_interval_ms: int
    replies_retention_ms: int
    admin_timeout_s: float
    client_config: dict[str, str | int | float | bool]


class KafkaNereus(TimerCalls):
    service: KafkaService

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
        allow_unbounded_clock: bool = False,
        kernel_config: KernelConfig | None = None,
        runtime_config: RuntimeConfig | None = None,
        metrics: Metrics | None = None,
        logger: Logger | None = None,
        timeout_s: float = 30.0,
        **options: Unpack[KafkaOptions],
    ) -> KafkaNereus:
        """Join the Kafka-partitioned shard log at `bootstrap` and start. With `data_dir` this
        process also owns a share of the shards (their LMDB stores live there); without it,
        it is a client only. `options` are `KafkaServiceConfig` fields (topics, group,
        librdkafka `client_config` such as SASL settings, ...), checked against their types.
        The kernel config must equal the shard owners' (their stores refuse another).
        An owner (`data_dir`) raises `ClockUnbounded` before joining when the clock cannot
        bound true time, unless `assume_clock_error_ms` or `allow_unbounded_clock=True`."""
        try:
            config = msgspec.convert(
                {
                    **options,
                    "bootstrap": bootstrap,
                    "data_dir": data_dir or "",
                    "own_shards": data_dir is not None,
                },
                KafkaServiceConfig,
            )
        except msgspec.ValidationError as exc:
            raise TypeError(f"KafkaNereus.connect: {exc}") from None
        clk = clock or SystemClock(assumed_error_ms=assume_clock_error_ms)
        measured = clock_problem(clk) if data_dir is not None else None
        if measured is not None and not allow_unbounded_clock:
            raise library_refusal(measured)
        service = KafkaService(
            config,
            clock=clk,
            kernel_config=kernel_config,
            runtime_config=runtime_config,
            metrics=metrics,
            logger=logger,
        )
        service.start()
        return cls(service, timeout_s=timeout_s)

    def close(self) -> None:
        self.service.close()

    def __enter__(self) -> KafkaNereus:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
