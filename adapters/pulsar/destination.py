"""The Pulsar destination: timers published to Apache Pulsar with pulsar-client.

Theory of operation: each `Send` becomes one message on the topic its queue maps to
(`PulsarTargetConfig.topic_for`), keyed by the timer's partition key, with Nereus's headers
as message properties (message id, generation, attempt id, txn, producer). Two capabilities
(decided in `specs/pulsar.md`):

* **ordinary managed delivery** (`IMMEDIATE`): the send waits, like Kafka's, until the
  trusted clock proves deliverAt has passed, and the message is visible when the broker has
  it;
* **certified delayed handoff** (`delivery = "handoff"`): the send may start `lead_ms`
  before deliverAt, with `deliver_at` = deliverAt + the push-out (the certified clock-ahead
  bound plus the broker's early-reveal allowance), so the broker holds it. The rules of when
  a target may offer it, and when a timer pinned to it may still be sent, are in
  `adapters.pulsar.handoff`; the broker's settings behind them are read through its admin
  API at `open` and again every `settings_ttl_s`, in the background
  (`adapters.pulsar.offers`). Until a topic's settings have been read (or after they stopped
  certifying the handoff) its queue gets ordinary managed delivery. Pulsar delays only for
  Shared and Key_Shared subscriptions: a consumer on an Exclusive or Failover subscription
  sees a handed-off message at once.

`submit` never blocks: the sends go to the destination's sender thread, which makes the
producers and calls `send_async`. A topic gets two producers, each with its own name and so
its own sequence ids: `<prefix>.<store id>.<topic index>` (batching) for ordinary sends and
`<prefix>.<store id>.<topic index>.handoff` (no batching) for handed-off ones. The client
never batches a `deliver_at` message: it sends it at once, ahead of the batch still open on
its producer, whose messages have lower sequence ids, and a deduplicating broker then drops
that batch whole (`Ok` without a position, measured). On a producer of their own, delayed
sends cannot overtake a batch, and each producer's sequence ids reach the broker in order
(specs/pulsar.md, "Delayed and ordinary sends on one topic"). Stable names let broker-side
deduplication recognise the client's resends after a reconnect. The answers are classified
by `adapters.pulsar.outcomes` and collected by `poll`. Client warnings and errors
(reconnects, send errors) count as disturbances that make a broker refusal UNKNOWN.
PUBLISHED carries the broker's message id and the send's own time, which every message also
carries (`nereus-sent-at`), so that a search finding it later stamps it with that time and
not its batch's (`adapters.pulsar.stamps`). Evidence is looked for in bulk by
`adapters.pulsar.evidence`.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import pulsar

from nereus.adapters.pulsar.admin import PulsarAdmin
from nereus.adapters.pulsar.config import PulsarTargetConfig, secret
from nereus.adapters.pulsar.evidence import PulsarEvidenceReader, SearchLimits
from nereus.adapters.pulsar.handoff import reveal_at_ms
from nereus.adapters.pulsar.offers import TopicOffers
from nereus.adapters.pulsar.outcomes import (
    classify_create_error,
    classify_raised,
    classify_send,
)
from nereus.adapters.pulsar.stamps import H_REVEAL_AT, H_SENT_AT, live_at_ms, sent_at_ms
from nereus.kernel.config import KernelConfig
from nereus.kernel.keys import DEFAULT_TENANT
from nereus.kernel.records import IMMEDIATE, Capability, Evidence, NotPublished, Unknown
from nereus.runtime.destination import (
    Lookup,
    PublishResult,
    Search,
    Send,
    SendResult,
    find_one,
)
from nereus.runtime.log import Logger, NullLogger

# Room for Pulsar's message metadata (properties, keys, ids) beyond what
# `PreparedPublish.size_bytes()` counts.
FRAMING_RESERVE_BYTES = 2_048


class ConfigRefused(ValueError):
    """The target cannot be used as configured (a secret missing from the environment)."""


class _Disturbances(logging.Handler):
    """Counts the client's warnings and errors; forwards them to the service log."""

    def __init__(self, log: Logger) -> None:
        super().__init__(level=logging.WARNING)
        self.count = 0
        self._log = log

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1
        self._log.warning("pulsar_client", detail=record.getMessage()[:500])


class PulsarDestination:
    """A `runtime.destination.Destination` (with per-queue capabilities) on Apache Pulsar."""

    capability: Capability = IMMEDIATE
    fence_id: str | None = None  # Pulsar's producers are not fenced: absence is never proven

    def __init__(
        self,
        config: PulsarTargetConfig,
        *,
        kernel_config: KernelConfig | None = None,
        logger: Logger | None = None,
        clock_ms: Callable[[], int] | None = None,
    ) -> None:
        self.config = config
        self.name = config.name
        self.log = logger or NullLogger()
        self._kernel = kernel_config or KernelConfig()
        self._clock_ms = clock_ms or (lambda: int(time.time() * 1000))
        self._lock = threading.Lock()
        self._results: list[SendResult] = []
        self._disturbed = _Disturbances(self.log)
        client_log = logging.getLogger(f"nereus.pulsar.{config.name}")
        client_log.propagate = False
        client_log.setLevel(logging.WARNING)
        client_log.addHandler(self._disturbed)
        self.client: Any = pulsar.Client(
            config.service_url,
            authentication=self._authentication(),
            operation_timeout_seconds=max(int(config.operation_timeout_s), 1),
            connection_timeout_ms=config.connection_timeout_ms,
            tls_trust_certs_file_path=config.tls_trust_certs_path,
            tls_allow_insecure_connection=config.tls_allow_insecure,
            logger=client_log,
        )
        self._offers = TopicOffers(config, self._kernel, self.log, self._make_admin())
        # (topic, handoff) -> producer; a topic keeps its index for both of its producers.
        self._producers: dict[tuple[str, bool], Any] = {}
        self._topic_index: dict[str, int] = {}
        self._prefix = f"{config.producer_name_prefix or 'nereus'}.unopened"
        self._outgoing: queue.Queue[tuple[list[Send], int] | None] = queue.Queue()
        self._stop = threading.Event()
        self._sender = threading.Thread(
            target=self._send_loop, name=f"{self.name}-send", daemon=True
        )
        limits = SearchLimits(
            config.find_slack_ms, config.find_max_records, config.find_max_seconds
        )
        self._reader = PulsarEvidenceReader(
            self.client, config.name, limits, self.log, self._clock_ms
        )

    # Configuration ------------------------------------------------------------------------

    def _authentication(self) -> Any:
        auth = self.config.auth
        if auth is None:
            return None
        at = f"pulsar target {self.config.name}: auth"

        def fail(key: str, problem: str) -> Exception:
            return ConfigRefused(f"{key}: {problem}")

        if auth.kind == "token":
            assert auth.token_env is not None
            return pulsar.AuthenticationToken(secret(auth.token_env, f"{at}.token_env", fail))
        if auth.kind == "basic":
            assert auth.password_env is not None
            password = secret(auth.password_env, f"{at}.password_env", fail)
            return pulsar.AuthenticationBasic(auth.username, password)
        return pulsar.AuthenticationTLS(auth.cert_path, auth.key_path)

    def _make_admin(self) -> PulsarAdmin | None:
        c = self.config
        if c.admin_url is None:
            return None
        token = None
        if c.auth is not None and c.auth.kind == "token" and c.auth.token_env is not None:
            token = secret(c.auth.token_env, "auth.token_env", lambda k, p: ConfigRefused(p))
        return PulsarAdmin(c.admin_url, timeout_s=c.operation_timeout_s, token=token)

    def open(self, store_id: str) -> None:
        """Name the producers after the store, read the broker's settings, start sending."""
        self._prefix = f"{self.config.producer_name_prefix or 'nereus'}.{store_id}"
        self._offers.refresh()
        self._sender.start()
        self._offers.start(self._stop)

    def refresh_settings(self) -> None:
        """Read the broker's settings and those of every topic seen so far (blocking)."""
        self._offers.refresh()

    def capability_for(self, queue: str, *, tenant: str = DEFAULT_TENANT) -> Capability:
        return self._offers.capability_for(self.topic_for(queue, tenant=tenant))

    def accepts(self, queue: str, capability: Capability, *, tenant: str = DEFAULT_TENANT) -> bool:
        return self._offers.accepts(self.topic_for(queue, tenant=tenant), capability)

    def topic_for(self, queue: str, *, tenant: str = DEFAULT_TENANT) -> str:
        return self.config.topic_for(queue, tenant=tenant)

    def max_record_bytes(self, topic: str) -> int:
        broker = self._offers.broker
        limit = broker.max_message_bytes if broker is not None else None
        return (limit or self.config.default_max_message_bytes) - FRAMING_RESERVE_BYTES

    # Sending ------------------------------------------------------------------------------

    def submit(self, sends: Sequence[Send], now_ms: int) -> None:
        if sends:
            self._outgoing.put((list(sends), now_ms))

    def poll(self, timeout_s: float) -> list[SendResult]:
        with self._lock:
            results, self._results = self._results, []
        return results

    def _deliver(self, result: SendResult) -> None:
        with self._lock:
            self._results.append(result)

    def _send_loop(self) -> None:
        while True:
            item = self._outgoing.get()
            if item is None:
                return
            sends, gate_ms = item
            failed: dict[tuple[str, bool], NotPublished] = {}
            for send in sends:
                self._send_one(send, failed, gate_ms)

    def _producer(self, topic: str, handoff: bool) -> Any:
        """The topic's producer for handed-off sends (`handoff`) or for ordinary ones. Never
        one producer for both: a `deliver_at` send would overtake the open batch."""
        producer = self._producers.get((topic, handoff))
        if producer is None:
            c = self.config
            index = self._topic_index.setdefault(topic, len(self._topic_index))
            producer = self.client.create_producer(
                topic,
                producer_name=f"{self._prefix}.{index}" + (".handoff" if handoff else ""),
                send_timeout_millis=c.send_timeout_ms,
                # A deliver_at message is never batched; with batching off, no client
                # version can put one behind, or ahead of, a batch of this producer.
                batching_enabled=c.batching and not handoff,
                batching_max_publish_delay_ms=c.batching_max_publish_delay_ms,
                max_pending_messages=c.max_pending_messages,
                block_if_queue_full=False,
            )
            self._producers[(topic, handoff)] = producer
        return producer

    def _send_one(
        self, send: Send, failed: dict[tuple[str, bool], NotPublished], gate_ms: int
    ) -> None:
        p = send.prepared
        if p.size_bytes() > self.max_record_bytes(p.topic):
            refused = NotPublished("permanent", "record_too_large", f"{p.size_bytes()} bytes")
            self._deliver(SendResult.of(send, refused))
            return
        reveal_ms = reveal_at_ms(p.deliver_at_ms, p.capability)
        which = (p.topic, reveal_ms is not None)
        if which in failed:  # its producer could not be made in this round
            self._deliver(SendResult.of(send, failed[which]))
            return
        try:
            producer = self._producer(*which)
        except pulsar.PulsarException as exc:
            failed[which] = classify_create_error(exc)
            self.log.warning("pulsar_producer_failed", topic=p.topic, error=str(exc))
            self._deliver(SendResult.of(send, failed[which]))
            return
        seen = self._disturbed.count
        properties = {k: v.decode(errors="replace") for k, v in send.headers()}
        if reveal_ms is not None:
            properties[H_REVEAL_AT] = str(reveal_ms)
        sent_ms = sent_at_ms(gate_ms, self._clock_ms())
        properties[H_SENT_AT] = str(sent_ms)
        try:
            producer.send_async(
                p.value,
                self._callback(send, seen, live_at_ms(sent_ms, reveal_ms)),
                properties=properties,
                partition_key=p.key.decode(errors="replace") if p.key is not None else None,
                deliver_at=reveal_ms,
            )
        except pulsar.PulsarException as exc:
            self._deliver(SendResult.of(send, classify_raised(exc)))

    def _callback(self, send: Send, seen: int, stamp_ms: int) -> Callable[[Any, Any], None]:
        def on_sent(result: Any, msg_id: Any) -> None:
            outcome: PublishResult = classify_send(
                result,
                msg_id,
                send.prepared.topic,
                stamp_ms,
                disturbed=self._disturbed.count != seen,
            )
            if isinstance(outcome, Unknown):
                self.log.warning(
                    "pulsar_send_unknown", attempt_id=send.attempt_id, reason=outcome.reason
                )
            self._deliver(SendResult.of(send, outcome))

        return on_sent

    # Evidence -----------------------------------------------------------------------------

    def search(self, lookups: Sequence[Lookup], wake: Callable[[], None]) -> Search:
        return self._reader.search(lookups, wake)

    def find(self, attempt_id: str, topic: str, since_ms: int) -> Evidence | None:
        """One lookup, waiting for its search: for tools and tests, not the runtime."""
        return find_one(self, attempt_id, topic, since_ms, self.config.find_max_seconds + 10)

    # Lifecycle ----------------------------------------------------------------------------

    def close(self) -> None:
        """Stop sending: the sends handed over are passed to the client, which gets at most
        `close_timeout_s` to flush them (answers after `close` are not collected: the next
        start settles those attempts by evidence)."""
        self._stop.set()
        self._outgoing.put(None)
        if self._sender.is_alive():
            self._sender.join(self.config.close_timeout_s)
        deadline = time.monotonic() + self.config.close_timeout_s
        flusher = threading.Thread(target=self._flush_all, daemon=True)
        flusher.start()
        flusher.join(max(deadline - time.monotonic(), 0.1))
        self._reader.close()
        try:
            self.client.close()
        except pulsar.PulsarException as exc:
            self.log.warning("pulsar_close_failed", error=str(exc))

    def _flush_all(self) -> None:
        for producer in list(self._producers.values()):
            with contextlib.suppress(pulsar.PulsarException):
                producer.flush()
