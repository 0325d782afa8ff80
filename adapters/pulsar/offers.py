"""What each Pulsar topic may offer, from the broker's settings read through its admin API.

Theory of operation: the certified delayed handoff (`adapters.pulsar.handoff`) depends on
settings an operator keeps on the broker and on each topic (delayed delivery, its tick, strict
mode, deduplication). They are read at the destination's `open` and again every
`settings_ttl_s` in the background (`start`); a topic is read once a timer names it. Until a
topic's settings have been read, or after they stopped certifying the handoff, its queue gets
ordinary managed delivery; what was read before stands when a read fails, settings being an
operator's and rare to change. A change is logged once, with the reason a handoff is refused.
"""

from __future__ import annotations

import threading
from typing import Any

from nereus.adapters.pulsar.admin import AdminError, BrokerSettings, PulsarAdmin
from nereus.adapters.pulsar.config import PulsarTargetConfig
from nereus.adapters.pulsar.handoff import (
    DelaySettings,
    Refusal,
    accepts,
    capability_or_managed,
    handoff_capability,
)
from nereus.kernel.config import KernelConfig
from nereus.kernel.records import IMMEDIATE, Capability
from nereus.runtime.log import Logger


class TopicOffers:
    def __init__(
        self,
        config: PulsarTargetConfig,
        kernel: KernelConfig,
        log: Logger,
        admin: PulsarAdmin | None,
    ) -> None:
        self.config = config
        self.name = config.name
        self.log = log
        self._kernel = kernel
        self._admin = admin
        self._lock = threading.Lock()
        # The broker's settings, once read (its message size limit among them).
        self.broker: BrokerSettings | None = None
        self._settings: dict[str, DelaySettings] = {}
        self._wanted_topics: set[str] = set(config.topic_for(q) for q in config.topics)

    def refresh(self) -> None:
        """Read the broker's settings and those of every topic seen so far (blocking)."""
        if self._admin is None:
            return
        try:
            broker = self._admin.broker()
        except AdminError as exc:
            self.log.warning("pulsar_settings_unread", target=self.name, error=str(exc))
            return
        self.broker = broker
        with self._lock:
            topics = sorted(self._wanted_topics)
        for topic in topics:
            try:
                settings = self._admin.delay_settings(topic, broker)
                dedup = self._admin.deduplication(topic, broker)
            except AdminError as exc:
                # What was read before still stands: settings are an operator's, and rare to
                # change; a topic never read offers no handoff.
                self.log.warning("pulsar_settings_unread", topic=topic, error=str(exc))
                continue
            with self._lock:
                changed = self._settings.get(topic) != settings
                self._settings[topic] = settings
            if changed:
                self._log_capability(topic, settings, dedup)

    def _log_capability(self, topic: str, settings: DelaySettings, dedup: bool) -> None:
        offered = self._handoff(settings)
        fields: dict[str, Any] = {"target": self.name, "topic": topic, "settings": settings.source}
        if not dedup:
            self.log.warning(
                "pulsar_deduplication_off",
                detail="a record the client resends after a reconnect may be written twice "
                "under one PUBLISHED outcome (both copies carry the attempt id)",
                **fields,
            )
        if self.config.delivery != "handoff":
            return
        if isinstance(offered, Refusal):
            self.log.warning("pulsar_handoff_refused", reason=offered.reason, **fields)
        else:
            self.log.info(
                "pulsar_handoff",
                lead_ms=offered.lead_ms,
                push_ms=offered.clock_ahead_bound_ms,
                strict=settings.strict,
                tick_ms=settings.tick_ms,
                **fields,
            )

    def start(self, stop: threading.Event) -> None:
        """Read the settings again every `settings_ttl_s`, in the background, until `stop`."""
        if self._admin is None:
            return

        def refresh_loop() -> None:
            while not stop.wait(self.config.settings_ttl_s):
                self.refresh()

        threading.Thread(target=refresh_loop, name=f"{self.name}-settings", daemon=True).start()

    def _handoff(self, settings: DelaySettings | None) -> Capability | Refusal:
        c = self.config
        if c.delivery != "handoff":
            return Refusal("the target is configured for ordinary managed delivery")
        return handoff_capability(
            c.handoff_lead_ms,
            c.clock_ahead_bound_ms,
            settings,
            slack_ms=c.max_delay_slack_ms,
            max_push_ms=self._kernel.max_clock_ahead_bound_ms,
            max_lead_ms=self._kernel.max_handoff_lead_ms,
        )

    def _topic_settings(self, topic: str) -> DelaySettings | None:
        with self._lock:
            settings = self._settings.get(topic)
            if settings is None:
                self._wanted_topics.add(topic)  # read by the next refresh
        return settings

    def capability_for(self, topic: str) -> Capability:
        """What a timer sent to `topic` gets now: the handoff if its settings certify it."""
        if self.config.delivery != "handoff":
            return IMMEDIATE
        return capability_or_managed(self._handoff(self._topic_settings(topic)))

    def accepts(self, topic: str, capability: Capability) -> bool:
        """Whether a timer pinned to `capability` may still be sent to `topic`."""
        settings = self._topic_settings(topic)
        return accepts(
            capability,
            self.config.clock_ahead_bound_ms,
            settings,
            slack_ms=self.config.max_delay_slack_ms,
        )
