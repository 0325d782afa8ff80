"""The Kafka source of `nereus replay --kafka`, given to replay's command from above.

Theory of operation: replay sits below the edges (`replay/` imports kernel and storage only),
yet `nereus replay --kafka` rebuilds a shard from the Kafka edge's topics. Replay's command
therefore names the source it needs as a port (`replay.cli.KafkaRebuild`, answering a
`replay.cli.KafkaOrigin`) and `nereus` (`adapters.cli.main`) registers this implementation,
which runs the Kafka edge's auditor (`adapters.kafka.audit.rebuild`) and reports what it read
in replay's terms. The Kafka client is an extra: it is imported when a rebuild is asked for.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from nereus.replay.cli import KafkaOrigin
from nereus.replay.fold import ReplayResult
from nereus.storage.store import ShardStore


def kafka_rebuild(
    settings: dict[str, Any],
    topic: str,
    partition: int,
    scratch: str,
    *,
    on_entry: Callable[[int], None] | None = None,
) -> tuple[ShardStore, ReplayResult, KafkaOrigin]:
    """Shard `partition` of the commands topic `topic` rebuilt from Kafka into `scratch`."""
    from nereus.adapters.kafka.audit import rebuild  # noqa: PLC0415  (the Kafka extra)

    store, result, audit = rebuild(settings, topic, partition, scratch, on_entry=on_entry)
    snap = audit.snapshot
    origin = KafkaOrigin(
        snapshot_id=None if snap is None else snap.snapshot_id,
        snapshot_covered_offset=None if snap is None else snap.covered_offset,
        snapshot_position=None if snap is None else snap.transfer.position,
        first_offset=audit.first_offset,
        last_offset=audit.last_offset,
        skipped=audit.skipped,
    )
    return store, result, origin
