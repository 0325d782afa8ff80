"""Edges of Nereus: CLI, HTTP timer API, Kafka, the local destination, clock sources.

The library entry points are `adapters.Nereus` (one embedded shard, `adapters/embedded.py`)
and `adapters.KafkaNereus` (the same calls over the Kafka-partitioned shard log,
`adapters/kafka_library.py`).
"""

from typing import Any

from adapters.embedded import Nereus, Peek, Result

__all__ = ["KafkaNereus", "Nereus", "Peek", "Result"]


def __getattr__(name: str) -> Any:
    # Lazy: the Kafka facade imports the HTTP and Kafka modules, which import this package.
    if name == "KafkaNereus":
        from adapters.kafka_library import KafkaNereus  # noqa: PLC0415

        return KafkaNereus
    raise AttributeError(name)
