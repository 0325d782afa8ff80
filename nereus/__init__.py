"""Nereus: a durable delayed-message scheduler. Never early, never lost, every attempt
accounted for.

    from datetime import timedelta
    from nereus import Nereus

    with Nereus.open("data", assume_clock_error_ms=5) as nereus:
        nereus.start()
        nereus.schedule("reminders", "trial:acme:day7", b"{}", delay_ms=timedelta(days=7))
        with nereus.consumer("reminders", group="mailer") as consumer:
            for record in consumer:              # blocks; at least once
                print(record.payload)

    # Another process (beside `nereus serve --data data`), or asyncio:
    with nereus.open_consumer("data", "reminders", group="mailer") as consumer: ...
    async with nereus.open_async_consumer("data", "reminders", group="mailer") as consumer:
        async for record in consumer: ...

The repository keeps one folder per layer (`kernel/`, `storage/`, `runtime/`, `replay/`,
`adapters/`, `sim/`); they install as subpackages of this one, and nothing else lands at
the top level of site-packages. The names below are imported on first use rather than here,
so that `nereus.runtime.compiled.prefer_source()` can still choose the kernel's build after
`import nereus`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.2.0"

if TYPE_CHECKING:
    from nereus.adapters.kafka.library import KafkaNereus
    from nereus.adapters.local.async_consumer import AsyncConsumer, open_async_consumer
    from nereus.adapters.local.consumer import ConsumerBusy, LocalConsumer, open_consumer
    from nereus.adapters.local.destination import LocalRecord
    from nereus.adapters.local.embedded import Listing, Nereus, Peek, Result
    from nereus.runtime.timer_key_header import decode_timer_key
    from nereus.service.clock_bound import ClockUnbounded
    from nereus.service.results import NereusRefused

__all__ = [
    "AsyncConsumer",
    "ClockUnbounded",
    "ConsumerBusy",
    "KafkaNereus",
    "Listing",
    "LocalConsumer",
    "LocalRecord",
    "Nereus",
    "NereusRefused",
    "Peek",
    "Result",
    "__version__",
    "decode_timer_key",
    "open_async_consumer",
    "open_consumer",
]

_LAZY = {
    "ClockUnbounded": "nereus.service.clock_bound",
    "Nereus": "nereus.adapters.local.embedded",
    "Peek": "nereus.adapters.local.embedded",
    "Result": "nereus.adapters.local.embedded",
    "Listing": "nereus.adapters.local.embedded",
    "NereusRefused": "nereus.service.results",
    "LocalConsumer": "nereus.adapters.local.consumer",
    "ConsumerBusy": "nereus.adapters.local.consumer",
    "open_consumer": "nereus.adapters.local.consumer",
    "AsyncConsumer": "nereus.adapters.local.async_consumer",
    "open_async_consumer": "nereus.adapters.local.async_consumer",
    "LocalRecord": "nereus.adapters.local.destination",
    "KafkaNereus": "nereus.adapters.kafka.library",
    "decode_timer_key": "nereus.runtime.timer_key_header",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'nereus' has no attribute {name!r}")
    import importlib  # noqa: PLC0415

    try:
        value = getattr(importlib.import_module(module), name)
    except ModuleNotFoundError as exc:
        if exc.name != "confluent_kafka":
            raise
        raise ImportError(f"{name} needs confluent-kafka: pip install 'nereus[kafka]'") from exc
    globals()[name] = value
    return value
