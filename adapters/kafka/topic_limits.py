"""How big a record each Kafka topic takes: its max.message.bytes, read and cached.

Theory of operation: a topic's limit is read with AdminClient.describe_configs the first time
it is asked for and again once `limits_ttl_s` passed; a failed read keeps the last value, and
a topic never read has no limit known (None). The limit a send is held to is that, capped by
the producer's `message.max.bytes`; `max_record_bytes` leaves `FRAMING_RESERVE_BYTES` for the
framing `PreparedPublish.size_bytes()` does not count. `submit` must not block, so it asks
the cache only (`fetch=False`); the claim check and a size error's classification may ask
the broker.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._config import ConfigResource

from nereus.adapters.kafka.outcomes import DEFAULT_MAX_MESSAGE_BYTES, FRAMING_RESERVE_BYTES
from nereus.runtime.log import Logger

if TYPE_CHECKING:
    from nereus.adapters.kafka.destination import KafkaDestinationConfig


class TopicLimits:
    def __init__(self, config: KafkaDestinationConfig, common: dict[str, Any], log: Logger):
        self._config = config
        self._common = common
        self.log = log
        # topic -> (its max.message.bytes or None if unread, monotonic time it is good until)
        self._cache: dict[str, tuple[int | None, float]] = {}
        self._admin: Any = None

    def _admin_client(self) -> Any:
        if self._admin is None:
            conf = {**self._common, "client.id": f"{self._config.name}-admin"}
            self._admin = AdminClient(conf)
        return self._admin

    def topic_limit(self, topic: str, *, fetch: bool = True) -> int | None:
        """The topic's max.message.bytes, or None if it was never read (no such topic, or no
        broker). With `fetch` False only the cache answers, whatever its age (for `submit`,
        which must not block). A failed refresh keeps the last value read."""
        now = time.monotonic()
        cached = self._cache.get(topic)
        if not fetch or (cached is not None and cached[1] > now):
            return cached[0] if cached is not None else None
        limit: int | None = None
        try:
            resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
            futures = self._admin_client().describe_configs([resource])
            entries = futures[resource].result(timeout=self._config.admin_timeout_s)
            entry = entries.get("max.message.bytes")
            limit = int(entry.value) if entry is not None else DEFAULT_MAX_MESSAGE_BYTES
        except (KafkaException, TimeoutError, ValueError) as exc:
            self.log.warning("kafka_topic_limit_unread", topic=topic, error=str(exc))
            if cached is not None:
                limit = cached[0]
        self._cache[topic] = (limit, now + self._config.limits_ttl_s)
        return limit

    def effective(self, topic: str, *, fetch: bool = True) -> int | None:
        limit = self.topic_limit(topic, fetch=fetch)
        return None if limit is None else min(limit, self._config.message_max_bytes)

    def fits_alone(self, topic: str, upper_bytes: int) -> bool:
        """Whether a record this big fits the topic by itself (an unreadable limit: assume
        it was the record that did not fit)."""
        limit = self.effective(topic)
        return limit is not None and upper_bytes <= limit

    def max_record_bytes(self, topic: str) -> int:
        limit = self.effective(topic)
        if limit is None:
            # Unknown topic: let the claim pass; the send answers lane_unavailable.
            limit = min(DEFAULT_MAX_MESSAGE_BYTES, self._config.message_max_bytes)
        return limit - FRAMING_RESERVE_BYTES
