"""Edges of Nereus: CLI, HTTP timer API, Kafka, the local destination, clock sources.

The library entry points are re-exported by the package root: `nereus.Nereus` (one embedded
shard, `adapters/local/embedded.py`) and `nereus.KafkaNereus` (the same calls over the
Kafka-partitioned shard log, `adapters/kafka/library.py`).
"""

from typing import Any

from nereus.adapters.local.embedded import Nereus, Peek, Result

__all__ = ["KafkaNereus", "Nereus", "Peek", "Result"]


def __getattr__(name: str) -> Any:
    # Lazy: the Kafka facade imports the HTTP and Kafka modules, which import this package.
    if name == "KafkaNereus":
        from nereus.adapters.kafka.library import KafkaNereus  # noqa: PLC0415

        return KafkaNereus
    raise AttributeError(name)
