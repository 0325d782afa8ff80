"""What the broker says about delayed delivery, sizes and deduplication (its admin REST API).

Theory of operation: the broker's own settings come from `/admin/v2/brokers/configuration/
runtime` (`delayedDeliveryEnabled`, `delayedDeliveryTickTimeMillis`,
`isDelayedDeliveryDeliverAtTimeStrict`, `delayedDeliveryMaxDelayInMillis`, `maxMessageSize`,
`brokerDeduplicationEnabled`). A namespace or a topic may override the delayed-delivery ones
with a policy: a topic that exists is asked for its *applied* policy (topic, else namespace,
else broker); one that does not exist yet will be created with its namespace's, so the
namespace's policy is read, and the broker's values fill what it leaves unset. Strictness is
a broker setting only. Reads use the standard library's HTTP client with a timeout; any
failure raises `AdminError` (the caller keeps what it knew, or offers no handoff).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from nereus.adapters.pulsar.handoff import DelaySettings


class AdminError(Exception):
    pass


class BrokerSettings:
    def __init__(self, raw: dict[str, Any]) -> None:
        self.raw = raw

    def flag(self, key: str, default: bool) -> bool:
        value = self.raw.get(key)
        return default if value is None else str(value).lower() == "true"

    def number(self, key: str, default: int) -> int:
        try:
            return int(self.raw.get(key, default))
        except (TypeError, ValueError):
            return default

    @property
    def max_message_bytes(self) -> int:
        return self.number("maxMessageSize", 5 * 1024 * 1024)

    @property
    def deduplication(self) -> bool:
        return self.flag("brokerDeduplicationEnabled", False)


class PulsarAdmin:
    def __init__(self, url: str, *, timeout_s: float = 5.0, token: str | None = None) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self._headers = {"Accept": "application/json"}
        if token is not None:
            self._headers["Authorization"] = f"Bearer {token}"

    def _get(self, path: str) -> Any:
        """The decoded JSON body; None for 404 or an empty body (a policy never set)."""
        request = urllib.request.Request(self.url + path, headers=self._headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                body = response.read()
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise AdminError(f"GET {path}: HTTP {exc.code}") from None
        except (OSError, ValueError) as exc:
            raise AdminError(f"GET {path}: {exc}") from None
        if not body.strip():
            return None
        try:
            return json.loads(body)
        except ValueError as exc:
            raise AdminError(f"GET {path}: not JSON ({exc})") from None

    def broker(self) -> BrokerSettings:
        raw = self._get("/admin/v2/brokers/configuration/runtime")
        if not isinstance(raw, dict):
            raise AdminError("the broker's runtime configuration is empty")
        return BrokerSettings(raw)

    def delay_settings(self, topic: str, broker: BrokerSettings) -> DelaySettings:
        """The delayed-delivery settings that apply to `topic` (a full persistent:// name)."""
        kind, tenant, namespace, local = _split(topic)
        if kind != "persistent":
            # Pulsar delays only on persistent topics.
            return DelaySettings(False, 0, False, 0, f"{topic}: not persistent")
        name = urllib.parse.quote(local, safe="")
        policy = self._get(
            f"/admin/v2/persistent/{tenant}/{namespace}/{name}/delayedDelivery?applied=true"
        )
        source = f"topic {topic}"
        if policy is None:
            policy = self._get(f"/admin/v2/namespaces/{tenant}/{namespace}/delayedDelivery")
            source = f"namespace {tenant}/{namespace}"
        if not isinstance(policy, dict):
            policy = {}
            source = "broker"
        return DelaySettings(
            active=bool(policy.get("active", broker.flag("delayedDeliveryEnabled", True))),
            tick_ms=int(
                policy.get("tickTime", broker.number("delayedDeliveryTickTimeMillis", 1000))
            ),
            strict=broker.flag("isDelayedDeliveryDeliverAtTimeStrict", False),
            max_delay_ms=int(
                policy.get(
                    "maxDeliveryDelayInMillis",
                    broker.number("delayedDeliveryMaxDelayInMillis", 0),
                )
            ),
            source=source,
        )

    def deduplication(self, topic: str, broker: BrokerSettings) -> bool:
        _kind, tenant, namespace, _local = _split(topic)
        value = self._get(f"/admin/v2/namespaces/{tenant}/{namespace}/deduplication")
        return broker.deduplication if value is None else bool(value)


def _split(topic: str) -> tuple[str, str, str, str]:
    kind, sep, rest = topic.partition("://")
    parts = rest.split("/", 2)
    if not sep or len(parts) != 3:
        raise AdminError(f"not a full topic name (kind://tenant/namespace/topic): {topic!r}")
    return kind, parts[0], parts[1], parts[2]
