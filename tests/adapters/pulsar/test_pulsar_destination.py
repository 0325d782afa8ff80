"""The Pulsar destination against the real broker (scripts/pulsar): never visible to a
Shared subscription before deliverAt, in both capabilities (the consumer's own receive
time on this host's clock against deliverAt, zero tolerance); cancel before and after the
handoff; outcome classes from the client's real errors; evidence found in bulk."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pulsar
import pytest

from nereus import Nereus
from nereus.adapters.pulsar.destination import PulsarDestination
from nereus.kernel.records import IMMEDIATE, Capability, NotPublished, Published, Unknown
from nereus.runtime.destination import Lookup, Send
from tests.support.pulsar_env import (
    admin_call,
    deduplicated_topic,
    now_ms,
    poll_results,
    prepared_send,
    pulsar_admin_url,
    pulsar_client,
    pulsar_url,
    read_all,
    search_until_complete,
    target,
    unique_topic,
)
from tests.support.shared_broker import paused_alone

__all__ = ["pulsar_admin_url", "pulsar_client", "pulsar_url"]

TIMERS = int(os.environ.get("NEREUS_PULSAR_EARLY_TIMERS", "150"))
# A tick hands the sender thread every due send at once; a deployment's reach thousands.
MIXED_SENDS = int(os.environ.get("NEREUS_PULSAR_MIXED_SENDS", "2000"))
LEAD_MS, BOUND_MS = 2_000, 20


class Receiver:
    """A Shared subscription that notes when this host saw each message."""

    def __init__(self, client: Any, topic: str) -> None:
        self.consumer = client.subscribe(
            topic, "test-shared", consumer_type=pulsar.ConsumerType.Shared
        )
        self.seen: list[tuple[int, dict[str, str]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                msg = self.consumer.receive(200)
            except pulsar.Timeout:
                continue
            self.seen.append((now_ms(), msg.properties()))
            self.consumer.acknowledge(msg)

    def wait_for(self, count: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self.seen) < count and time.monotonic() < deadline:
            time.sleep(0.05)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.consumer.close()


@pytest.fixture
def open_nereus(tmp_path: Path, pulsar_url: str, pulsar_admin_url: str) -> Iterator[Any]:
    opened: list[Nereus] = []

    def make(queue: str, topic: str, **options: Any) -> tuple[Nereus, PulsarDestination]:
        dest = PulsarDestination(target(pulsar_url, pulsar_admin_url, {queue: topic}, **options))
        n = Nereus.open(
            str(tmp_path / f"n{len(opened)}"), destination=dest, assume_clock_error_ms=5
        )
        opened.append(n)
        n.start()
        return n, dest

    yield make
    for n in opened:
        n.close()


def _schedule_spread(n: Nereus, queue: str, count: int, base_ms: int) -> dict[str, int]:
    deliver: dict[str, int] = {}
    for i in range(count):
        r = n.schedule(queue, f"k{i}", b"p%d" % i, deliver_at_ms=base_ms + (i * 13) % 1500)
        assert r.ok and r.message_id is not None and r.deliver_at_ms is not None
        deliver[r.message_id] = r.deliver_at_ms
    return deliver


@pytest.mark.parametrize("delivery", ["managed", "handoff"])
def test_never_visible_to_a_shared_subscription_before_deliver_at(
    open_nereus: Any, pulsar_client: Any, delivery: str
) -> None:
    queue, topic = "early", unique_topic(f"early-{delivery}")
    receiver = Receiver(pulsar_client, topic)
    try:
        options = {"delivery": delivery, "clock_ahead_bound_ms": BOUND_MS}
        if delivery == "handoff":
            options["handoff_lead_ms"] = LEAD_MS
        n, dest = open_nereus(queue, topic, **options)
        expected = IMMEDIATE if delivery == "managed" else dest.capability_for(queue)
        assert expected.kind == ("immediate" if delivery == "managed" else "delayed_handoff")
        deliver = _schedule_spread(n, queue, TIMERS, now_ms() + 2_500)
        receiver.wait_for(TIMERS, 30)
        got: dict[str, int] = {}
        for seen_ms, props in receiver.seen:
            mid = props["nereus-message-id"]
            assert mid not in got, "delivered twice"
            got[mid] = seen_ms
            assert seen_ms >= deliver[mid], f"{mid} visible {deliver[mid] - seen_ms} ms early"
            assert int(props["nereus-deliver-at"]) == deliver[mid]
        assert set(got) == set(deliver)
        if delivery == "handoff":
            # Handed off ahead: the broker held each one, its reveal time was asked for.
            assert all(
                int(p["nereus-reveal-at"]) >= deliver[p["nereus-message-id"]]
                for _, p in receiver.seen
            )
    finally:
        receiver.close()


def test_cancel_before_the_handoff_prevents_delivery(open_nereus: Any, pulsar_client: Any) -> None:
    queue, topic = "cancel-early", unique_topic("cancel-early")
    receiver = Receiver(pulsar_client, topic)
    try:
        n, dest = open_nereus(
            queue, topic, delivery="handoff", handoff_lead_ms=LEAD_MS, clock_ahead_bound_ms=BOUND_MS
        )
        r = n.schedule(queue, "k", b"never", delay_ms=LEAD_MS + 2_000)
        assert r.ok and r.deliver_at_ms is not None
        assert n.cancel(queue, "k").status == "canceled"
        push = dest.capability_for(queue).clock_ahead_bound_ms
        time.sleep(max(r.deliver_at_ms + push + 1_500 - now_ms(), 0) / 1000)
        assert receiver.seen == []
        assert read_all(pulsar_client, topic) == []  # not even held by the broker
    finally:
        receiver.close()


def test_cancel_after_the_handoff_is_too_late_with_the_brokers_message_id(
    open_nereus: Any, pulsar_client: Any
) -> None:
    queue, topic = "cancel-late", unique_topic("cancel-late")
    receiver = Receiver(pulsar_client, topic)
    try:
        lead = 4_000
        n, _dest = open_nereus(
            queue, topic, delivery="handoff", handoff_lead_ms=lead, clock_ahead_bound_ms=BOUND_MS
        )
        r = n.schedule(queue, "k", b"held", delay_ms=lead + 1_000)
        assert r.ok and r.deliver_at_ms is not None
        deadline = time.monotonic() + 10
        while n.peek(queue, "k").status != "DELIVERED" and time.monotonic() < deadline:
            time.sleep(0.02)
        late = n.cancel(queue, "k")
        assert now_ms() < r.deliver_at_ms, "the handoff should have happened well before"
        assert (late.ok, late.status) == (False, "too_late")
        assert late.evidence is not None and late.evidence["destination"] == topic
        ledger, entry, _partition, _batch = late.evidence["broker_message_id"].split(":")
        assert int(ledger) >= 0 and int(entry) >= 0
        assert receiver.seen == []  # held by the broker, not yet visible
        receiver.wait_for(1, 15)
        assert len(receiver.seen) == 1 and receiver.seen[0][0] >= r.deliver_at_ms
    finally:
        receiver.close()


def test_a_handoff_the_brokers_settings_do_not_certify_is_ordinary_delivery(
    pulsar_url: str, pulsar_admin_url: str, pulsar_client: Any
) -> None:
    topic = unique_topic("capped")
    pulsar_client.create_producer(topic).close()  # the topic must exist for its own policy
    path = "/admin/v2/persistent/public/default/" + topic.rsplit("/", 1)[1] + "/delayedDelivery"
    admin_call(
        pulsar_admin_url,
        "POST",
        path,
        {"active": True, "tickTime": 1000, "maxDeliveryDelayInMillis": 3_000},
    )
    time.sleep(1)  # topic policies travel through a system topic
    options = {"delivery": "handoff", "handoff_lead_ms": LEAD_MS, "clock_ahead_bound_ms": BOUND_MS}
    capped = PulsarDestination(target(pulsar_url, pulsar_admin_url, {"q": topic}, **options))
    uncertified = PulsarDestination(target(pulsar_url, pulsar_admin_url, {"q": topic}))
    try:
        for dest in (capped, uncertified):
            dest.open("test")
        # 2000 lead + 1020 push-out + 1000 slack > 3000: ordinary managed delivery instead.
        assert capped.capability_for("q") == IMMEDIATE
        # A timer pinned to the handoff earlier is not sent under these settings.
        assert not capped.accepts("q", Capability("delayed_handoff", LEAD_MS, 1_020))
        assert capped.accepts("q", IMMEDIATE)
        assert uncertified.capability_for("q") == IMMEDIATE
    finally:
        capped.close()
        uncertified.close()


# Outcome classes from the client's real errors ------------------------------------------


def _send(topic: str, aid: str, value: bytes = b"v") -> Send:
    return prepared_send(topic, aid, message_id="m", value=value)


def _broker_pid(url: str) -> int:
    port = url.rsplit(":", 1)[1]
    return int(Path(f"/tmp/nereus-pulsar-{port}/pulsar.pid").read_text())


def test_outcome_classes_come_from_the_clients_real_errors(
    pulsar_url: str, pulsar_admin_url: str, pulsar_client: Any
) -> None:
    terminated = unique_topic("terminated")
    pulsar_client.create_producer(terminated).close()
    admin_call(
        pulsar_admin_url,
        "POST",
        "/admin/v2/persistent/public/default/" + terminated.rsplit("/", 1)[1] + "/terminate",
    )
    good = unique_topic("good")
    dest = PulsarDestination(
        target(pulsar_url, pulsar_admin_url, {}, send_timeout_ms=1_500, batching=False)
    )
    dest.open("outcomes")
    try:
        dest.submit(
            [
                _send(good, "ok"),
                _send(good, "big", b"x" * (6 * 1024 * 1024)),
                _send(terminated, "terminated"),
                _send("persistent://no-such-tenant/ns/t", "no-namespace"),
                _send("bad://x/y/z", "bad-name"),
            ],
            now_ms(),
        )
        got = poll_results(dest, 5, 20)
        assert isinstance(got["ok"].result, Published)
        assert got["ok"].result.evidence.broker_message_id is not None

        def refused(aid: str) -> tuple[str, str]:
            res = got[aid].result
            assert isinstance(res, NotPublished), (aid, res)
            return res.disposition, res.error_code

        assert refused("big") == ("permanent", "record_too_large")
        assert refused("terminated") == ("lane_unavailable", "topic_terminated")
        assert refused("no-namespace") == ("lane_unavailable", "topic_not_found")
        assert refused("bad-name")[0] == "permanent"

        # A broker that stops answering past the send timeout: UNKNOWN, and it was written.
        # Paused alone: another worker's test of this broker would fail meanwhile.
        with paused_alone(pulsar_url):
            pid = _broker_pid(pulsar_url)
            sent_at = now_ms()
            os.kill(pid, signal.SIGSTOP)
            try:
                dest.submit([_send(good, "stalled")], now_ms())
                stalled = poll_results(dest, 1, 6)["stalled"].result
            finally:
                os.kill(pid, signal.SIGCONT)
            assert isinstance(stalled, Unknown) and stalled.reason == "timeout"
            # The bulk search finds it (and the good one) in one read of the topic. One made
            # while the client is still reconnecting to the resumed broker fails incomplete,
            # and is made again, as the runtime does.
            lookups = [
                Lookup("stalled", good, sent_at),
                Lookup("ok", good, sent_at),
                Lookup("no", good, sent_at),
            ]
            outcome = search_until_complete(dest, lookups, 30)
        assert outcome.complete and set(outcome.found) == {"stalled", "ok"}, outcome
        assert outcome.proof_for(None, "no") is None  # not found never proves absent here
    finally:
        dest.close()


def test_delayed_sends_never_make_a_batch_of_immediate_ones_vanish(
    pulsar_url: str, pulsar_admin_url: str, pulsar_client: Any
) -> None:
    """One topic, deduplication on, a tick's burst of ordinary sends (inside one batching
    window) with handoff sends among them: the broker holds every one under a real message
    id. The client sends a `deliver_at` message at once, ahead of the batch still open;
    through one producer the broker then takes that batch for a duplicate and drops it,
    answering `Ok` with ledger and entry -1."""
    topic = deduplicated_topic(pulsar_client, pulsar_admin_url, "mixed")
    dest = PulsarDestination(
        target(pulsar_url, pulsar_admin_url, {}, batching_max_publish_delay_ms=20)
    )
    dest.open("mixed")
    handoff = Capability("delayed_handoff", LEAD_MS, 1_020)
    deliver_at = now_ms() + 60_000  # held by the broker all through the test
    # Runs of 1 to 7 ordinary sends between handoff sends, and a run of handoffs in a row.
    delayed = {i for i in range(MIXED_SENDS) if i % 8 in (3, 7) or i % 97 == 0}
    sends = [
        prepared_send(
            topic,
            f"a{i}",
            deliver_at_ms=deliver_at,
            capability=handoff if i in delayed else IMMEDIATE,
        )
        for i in range(MIXED_SENDS)
    ]
    try:
        dest.submit(sends, now_ms())
        got = poll_results(dest, MIXED_SENDS, 60)
        assert len(got) == MIXED_SENDS
        for aid, answer in got.items():
            assert isinstance(answer.result, Published), (aid, answer.result)
            message_id = answer.result.evidence.broker_message_id
            assert message_id is not None, aid
            ledger, entry, _, _ = message_id.split(":")
            assert int(ledger) >= 0 and int(entry) >= 0, (aid, answer.result)
        held = read_all(pulsar_client, topic)
        assert sorted(m.properties()["nereus-attempt-id"] for m in held) == sorted(got)
        reveal = {
            m.properties()["nereus-attempt-id"]: m.properties().get("nereus-reveal-at")
            for m in held
        }
        assert {aid for aid, r in reveal.items() if r is not None} == {f"a{i}" for i in delayed}
    finally:
        dest.close()
