"""Kafka mode's configuration: one struct for the service and every part of it."""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from nereus.adapters.kafka.wire import default_process_id


class KafkaServiceConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    bootstrap: str
    data_dir: str
    commands_topic: str = "nereus.commands"
    replies_topic: str = "nereus.replies"
    group: str = "nereus-shards"
    # False: a client only (commands out, outcomes back through the replies topic); it joins
    # no group and never owns a shard, e.g. an application embedding the library beside the
    # `nereus serve --kafka` processes that own the shards.
    own_shards: bool = True
    # Partitions of the commands topic when this process creates it. If the topic exists,
    # its partition count is the shard count; a different explicit `shards` is refused.
    shards: int | None = None
    default_shards: int = 4
    replication_factor: int = -1  # -1: the broker's default
    process_id: str = msgspec.field(default_factory=default_process_id)
    # "queue" (every tenant's) or "tenant/queue" -> destination topic; a queue not listed
    # publishes to "<tenant>.<queue>", the default tenant's to the queue's own name
    # (`adapters.tenant_topics`). Two tenants on one topic: `nereus serve` refuses it.
    destination_topics: dict[str, str] = msgspec.field(default_factory=dict)
    # The cluster the timers are published to, if not the one holding the commands topic.
    destination_bootstrap: str | None = None
    destination_linger_ms: int = 5
    # "transactional": each shard's destination producer has the transactional id
    # "nereus-dest.<commands topic>.<shard>", so a new owner fences the old one's and proves
    # absence; "idempotent" for clusters that do not allow transactions (specs/kafka.md).
    destination_delivery: Literal["transactional", "idempotent"] = "transactional"
    session_timeout_ms: int = 6_000
    # Static group membership (`group.instance.id`, kept in DATA/group-instance-id): a
    # process restarted on the same data directory takes its shards back at once instead of
    # waiting for the group to time its previous incarnation out. The price, Kafka's own: a
    # process that stops for good hands its shards over only when its session times out.
    static_membership: bool = True
    heartbeat_interval_ms: int = 1_000
    max_poll_interval_ms: int = 60_000
    reopen_backoff_ms: int = 3_000
    # False: every command travels as a record of its own. For a rolling upgrade from a
    # build that does not know COMMANDS_V1: an owner of that build would skip such a record
    # (no position) while an upgraded one folds it. Turn it on once every process runs this.
    command_batches: bool = True
    reply_window_ms: int = 60_000
    send_lease_ms: int = 2_000
    proof_interval_ms: int = 1_000
    replies_retention_ms: int = 3_600_000
    # Each owner writes a snapshot of its shard this often (0: never), a bounded number of
    # bytes a tick; a new owner without a store restores the newest (specs/kafka.md).
    snapshot_interval_ms: int = 600_000
    snapshot_bytes_per_tick: int = 1024 * 1024
    admin_timeout_s: float = 30.0
    client_config: dict[str, str | int | float | bool] = msgspec.field(default_factory=dict)

    def client_settings(self) -> dict[str, Any]:
        """What every Kafka client of the service starts from: the bootstrap servers and the
        operator's client settings."""
        conf: dict[str, Any] = {"bootstrap.servers": self.bootstrap}
        conf.update(self.client_config)
        return conf
