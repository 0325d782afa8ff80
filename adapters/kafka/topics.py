"""Topic admin: the commands and replies topics, created if absent, and checked.

Theory of operation: the commands topic's partitions are the shards. It is created with
`message.timestamp.type=LogAppendTime` (the broker's persistence time is the only time the
shard log may carry) and no retention (positions are counted from offset 0), and an existing
one is refused at start if its timestamps are not the broker's or if an explicit shard count
differs from its partition count (changing it would move identities between shards). The
replies topic keeps replies for `replies_retention_ms`. The snapshot chunks and manifests
topics (`adapters.kafka.snapshots`) get the commands topic's partition count.
"""

from __future__ import annotations

import time
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._config import ConfigResource
from confluent_kafka.cimpl import NewTopic

from nereus.adapters.kafka.config import KafkaServiceConfig
from nereus.adapters.kafka.snapshots import manifests_topic, snapshots_topic
from nereus.runtime.log import Logger

# A commands topic's own retention must span this many snapshot intervals (see
# check_retention): the interval to the next snapshot, the one the restore may need before
# it, and one for a snapshot that took long or failed.
RETENTION_SNAPSHOTS = 3


def ensure_topics(c: KafkaServiceConfig, max_message_bytes: int, log: Logger) -> int:
    """Create the commands and replies topics if absent; check the commands topic. Returns
    the shard count (its partitions)."""
    admin = AdminClient({**c.client_settings(), "client.id": "nereus-admin"})
    wanted = c.shards or c.default_shards
    commands = NewTopic(
        c.commands_topic,
        wanted,
        c.replication_factor,
        config={
            "message.timestamp.type": "LogAppendTime",
            "retention.ms": "-1",
            "retention.bytes": "-1",
            "cleanup.policy": "delete",
            "max.message.bytes": str(max_message_bytes),
        },
    )
    replies = NewTopic(
        c.replies_topic,
        wanted,
        c.replication_factor,
        config={"retention.ms": str(c.replies_retention_ms)},
    )
    _create(admin, [commands, replies], c.admin_timeout_s, log)
    partitions = wait_for_leaders(admin, c.commands_topic, c.admin_timeout_s)
    wait_for_leaders(admin, c.replies_topic, c.admin_timeout_s)
    if c.shards is not None and partitions != c.shards:
        raise ValueError(
            f"{c.commands_topic} has {partitions} partitions, not {c.shards}: the shard "
            "count is the partition count, and changing it would move identities "
            "between shards"
        )
    _ensure_snapshot_topics(admin, c, partitions, max_message_bytes, log)
    entries = topic_config(admin, c.commands_topic, c.admin_timeout_s)
    ts_type = entries.get("message.timestamp.type")
    if ts_type is None or ts_type.value != "LogAppendTime":
        raise ValueError(
            f"{c.commands_topic} has message.timestamp.type="
            f"{ts_type.value if ts_type is not None else '?'}: the shard log's persistence "
            "time must be the broker's (LogAppendTime)"
        )
    check_retention(c, entries)
    return partitions


def check_retention(c: KafkaServiceConfig, entries: dict[str, Any]) -> None:
    """The rule for a commands topic with a retention of its own (`retention.ms` not -1):
    snapshots on, and the retention at least `RETENTION_SNAPSHOTS` snapshot intervals, so
    the commands after the older of the two newest snapshots are always still there. (The
    owners trim the topic themselves after each snapshot; a retention is a second bound.)
    Size retention cannot be reasoned about in time and is refused. Each shard's open also
    checks that no open obligation is older than the retention (`KafkaLog`)."""
    topic = c.commands_topic
    size = entries.get("retention.bytes")
    if size is not None and int(size.value) >= 0:
        raise ValueError(
            f"{topic} has retention.bytes={size.value}: deleting commands by size could delete "
            "ones no snapshot covers yet; set retention.bytes=-1 (the owners trim the topic "
            "after each snapshot)"
        )
    retention_ms = configured_retention_ms(entries)
    if retention_ms < 0:
        return
    if c.snapshot_interval_ms <= 0:
        raise ValueError(
            f"{topic} has retention.ms={retention_ms} but snapshots are off "
            "(--snapshot-interval-ms 0): commands deleted by retention could never be replaced"
        )
    least = RETENTION_SNAPSHOTS * c.snapshot_interval_ms
    if retention_ms < least:
        raise ValueError(
            f"{topic} has retention.ms={retention_ms}, below {RETENTION_SNAPSHOTS} snapshot "
            f"intervals ({least} ms): a new owner could find the commands after the newest "
            "complete snapshot already deleted"
        )


def topic_config(admin: Any, topic: str, timeout_s: float) -> dict[str, Any]:
    """The topic's configuration entries (name -> entry with a `value`)."""
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    entries: dict[str, Any] = admin.describe_configs([resource])[resource].result(timeout=timeout_s)
    return entries


def configured_retention_ms(entries: dict[str, Any]) -> int:
    """A topic's `retention.ms` from its configuration entries (-1: none)."""
    retention = entries.get("retention.ms")
    return -1 if retention is None else int(retention.value)


def _ensure_snapshot_topics(
    admin: Any, c: KafkaServiceConfig, partitions: int, max_message_bytes: int, log: Logger
) -> None:
    """The shards' snapshot chunks and manifests (`adapters.kafka.snapshots`): partition p
    of each is shard p's, so both have the commands topic's partition count."""
    chunks = NewTopic(
        snapshots_topic(c.commands_topic),
        partitions,
        c.replication_factor,
        config={
            "cleanup.policy": "delete",
            "retention.ms": "-1",
            "retention.bytes": "-1",
            "max.message.bytes": str(max_message_bytes),
        },
    )
    manifests = NewTopic(
        manifests_topic(c.commands_topic),
        partitions,
        c.replication_factor,
        config={"cleanup.policy": "compact"},
    )
    _create(admin, [chunks, manifests], c.admin_timeout_s, log)
    for name in (chunks.topic, manifests.topic):
        found = wait_for_leaders(admin, name, c.admin_timeout_s)
        if found != partitions:
            raise ValueError(
                f"{name} has {found} partitions, not {partitions} as {c.commands_topic}: "
                "partition p of it must be shard p's"
            )


def _create(admin: Any, topics: list[NewTopic], timeout_s: float, log: Logger) -> None:
    """Create the topics that do not exist yet (an existing one is left as it is)."""
    futures = admin.create_topics(topics, operation_timeout=timeout_s)
    partitions = {t.topic: t.num_partitions for t in topics}
    for name, future in futures.items():
        try:
            future.result(timeout=timeout_s)
            log.info("topic_created", topic=name, partitions=partitions[name])
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise


def wait_for_leaders(admin: Any, topic: str, timeout_s: float) -> int:
    """Wait until every partition of `topic` has a leader; returns the partition count."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            meta = admin.list_topics(topic, timeout=5).topics.get(topic)
        except KafkaException:
            meta = None
        if (
            meta is not None
            and meta.error is None
            and meta.partitions
            and all(p.leader >= 0 for p in meta.partitions.values())
        ):
            return len(meta.partitions)
        if time.monotonic() >= deadline:
            raise TimeoutError(f"topic {topic} has no leaders after {timeout_s} s")
        time.sleep(0.1)
