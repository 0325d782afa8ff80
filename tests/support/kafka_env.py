"""The real Kafka broker the tests use, and helpers to make topics on it.

`scripts/kafka start` runs a single-node KRaft broker on loopback and `scripts/test` exports
its address as NEREUS_KAFKA_BOOTSTRAP (CI always does). A test that needs Kafka takes the
`kafka_bootstrap` fixture, which FAILS (never skips) when the variable is missing: a Kafka
test that silently does not run would prove nothing.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Mapping

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

ENV = "NEREUS_KAFKA_BOOTSTRAP"


@pytest.fixture(scope="session")
def kafka_bootstrap() -> str:
    bootstrap = os.environ.get(ENV, "").strip()
    if not bootstrap:
        pytest.fail(
            f"{ENV} is not set: these tests need a real Kafka broker. Run "
            f"`./scripts/kafka start` and `export {ENV}=$(./scripts/kafka bootstrap)`, or run "
            "the whole suite with ./scripts/test, which does both (CI always has it).",
            pytrace=False,
        )
    return bootstrap


def unique_topic(prefix: str = "t") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def create_topic(
    bootstrap: str,
    name: str,
    *,
    partitions: int = 1,
    config: Mapping[str, str] | None = None,
    timeout_s: float = 30.0,
) -> str:
    """Create `name` (replication 1) with topic configs such as max.message.bytes or
    message.timestamp.type, and wait until the broker serves its metadata with leaders."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    topic = NewTopic(name, partitions, 1, config=dict(config or {}))
    admin.create_topics([topic], operation_timeout=timeout_s)[name].result(timeout=timeout_s)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            meta = admin.list_topics(name, timeout=5).topics.get(name)
        except KafkaException:
            meta = None
        if (
            meta is not None
            and meta.error is None
            and len(meta.partitions) == partitions
            and all(p.leader >= 0 for p in meta.partitions.values())
        ):
            return name
        time.sleep(0.05)
    raise TimeoutError(f"topic {name} has no leaders after {timeout_s} s")


def destination_topic(bootstrap: str) -> str:
    """A fresh two-partition destination whose records carry the broker's append time: the
    evidence timestamps a publication's check compares with deliverAt."""
    return create_topic(
        bootstrap,
        unique_topic("dest"),
        partitions=2,
        config={"message.timestamp.type": "LogAppendTime"},
    )
