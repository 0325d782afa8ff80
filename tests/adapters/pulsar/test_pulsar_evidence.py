"""Evidence times of records that share a batch, against the real broker (scripts/pulsar).

The rule: a record's evidence time is never earlier than its own send (nor its reveal time),
though Pulsar gives every record of a batch the batch's first send time as its publish time;
for ordinary managed delivery that means never earlier than deliverAt, so the early-delivery
check (`early_delivery`, `nereus_early_deliveries_total`) never fires for a timer sent on
time. Sends here are spread over a batching window so that the client puts them in one batch
(asserted from the broker's message ids). `NEREUS_PULSAR_BATCH_RECORDS` sizes the batches
(default 100: a busy producer's batch; the client's batchingMaxMessages is 1,000).
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from nereus import Nereus
from nereus.adapters.pulsar.destination import PulsarDestination
from nereus.kernel.records import Capability, Evidence, Published
from nereus.runtime.destination import Lookup
from nereus.runtime.metrics import Metrics
from tests.support.pulsar_env import (
    now_ms,
    poll_results,
    prepared_send,
    pulsar_admin_url,
    pulsar_client,
    pulsar_url,
    search_until_complete,
    target,
    unique_topic,
)

__all__ = ["pulsar_admin_url", "pulsar_client", "pulsar_url"]

RECORDS = int(os.environ.get("NEREUS_PULSAR_BATCH_RECORDS", "100"))
GAP_MS = 5  # between two sends of one batch
WINDOW_MS = RECORDS * GAP_MS * 4 + 1_000  # the batching window: room for every send


def _search(dest: PulsarDestination, lookups: Sequence[Lookup]) -> dict[str, Evidence]:
    """What a complete bulk search found (one made again while another test's SIGSTOP
    leaves it incomplete)."""
    outcome = search_until_complete(dest, lookups, 60)
    assert outcome.complete, outcome
    return outcome.found


def _batch_indexes(evidence: Sequence[Evidence]) -> Counter[str]:
    """How many records each broker entry holds (a batch is one entry)."""
    entries: Counter[str] = Counter()
    for e in evidence:
        assert e.broker_message_id is not None
        ledger, entry, _partition, _index = e.broker_message_id.split(":")
        entries[f"{ledger}:{entry}"] += 1
    return entries


def test_records_of_one_batch_each_carry_their_own_send_time(
    pulsar_url: str, pulsar_admin_url: str
) -> None:
    topic = unique_topic("batch-own")
    dest = PulsarDestination(
        target(pulsar_url, pulsar_admin_url, {}, batching_max_publish_delay_ms=WINDOW_MS)
    )
    dest.open("batch-own")
    try:
        handed: dict[str, int] = {}  # a reading taken before the send: a floor for it
        for i in range(RECORDS):
            handed[f"a{i}"] = now_ms()
            dest.submit([prepared_send(topic, f"a{i}")], handed[f"a{i}"])
            time.sleep(GAP_MS / 1000)
        got = poll_results(dest, RECORDS, WINDOW_MS / 1000 + 30)
        answered = now_ms()
        assert set(got) == set(handed)
        live = {aid: r.result for aid, r in got.items()}
        assert all(isinstance(r, Published) for r in live.values()), live
        found = _search(dest, [Lookup(aid, topic, min(handed.values())) for aid in handed])
        assert set(found) == set(handed)
        # They shared a batch: most records sit in one broker entry.
        assert _batch_indexes(list(found.values())).most_common(1)[0][1] >= RECORDS // 2
        for aid, floor in handed.items():
            result = live[aid]
            assert isinstance(result, Published)
            for stamped in (result.evidence.timestamp_ms, found[aid].timestamp_ms):
                # Its own send: after it was handed over, before its answer came.
                assert floor <= stamped <= answered, (aid, stamped - floor, answered - stamped)
    finally:
        dest.close()


def test_records_an_older_build_wrote_are_found_and_never_stamped_before_their_send(
    pulsar_url: str, pulsar_admin_url: str, pulsar_client: Any
) -> None:
    """Without `nereus-sent-at`: the first of a batch has the batch's time, which is its own;
    the others get no time before their send (the time the search read them)."""
    topic = unique_topic("batch-old")
    producer = pulsar_client.create_producer(
        topic, batching_enabled=True, batching_max_publish_delay_ms=WINDOW_MS
    )
    sent: dict[str, int] = {}
    try:
        for i in range(RECORDS):
            sent[f"o{i}"] = now_ms()
            producer.send_async(b"v", lambda *_: None, properties={"nereus-attempt-id": f"o{i}"})
            time.sleep(GAP_MS / 1000)
        producer.flush()
    finally:
        producer.close()
    dest = PulsarDestination(target(pulsar_url, pulsar_admin_url, {}))
    dest.open("batch-old")
    try:
        searched = now_ms()
        found = _search(dest, [Lookup(aid, topic, min(sent.values())) for aid in sent])
        assert set(found) == set(sent)
        assert _batch_indexes(list(found.values())).most_common(1)[0][1] >= RECORDS // 2
        for aid, send_ms in sent.items():
            assert found[aid].timestamp_ms >= send_ms, (aid, send_ms - found[aid].timestamp_ms)
            index = int((found[aid].broker_message_id or "").rsplit(":", 1)[1])
            if index > 0:
                assert found[aid].timestamp_ms >= searched
    finally:
        dest.close()


def test_a_handoff_is_stamped_with_its_reveal_time(pulsar_url: str, pulsar_admin_url: str) -> None:
    topic = unique_topic("batch-handoff")
    dest = PulsarDestination(
        target(pulsar_url, pulsar_admin_url, {}, batching_max_publish_delay_ms=WINDOW_MS)
    )
    dest.open("batch-handoff")
    handoff = Capability("delayed_handoff", 5_000, 20)
    try:
        deliver: dict[str, int] = {}
        for i in range(10):
            deliver[f"h{i}"] = now_ms() + 3_000
            sent = prepared_send(topic, f"h{i}", deliver_at_ms=deliver[f"h{i}"], capability=handoff)
            dest.submit([sent], now_ms())
            time.sleep(GAP_MS / 1000)
        got = poll_results(dest, len(deliver), 30)
        found = _search(dest, [Lookup(aid, topic, now_ms() - 10_000) for aid in deliver])
        for aid, deliver_at in deliver.items():
            result = got[aid].result
            assert isinstance(result, Published)
            # deliverAt + push-out: the time the broker was asked to reveal it.
            assert result.evidence.timestamp_ms == deliver_at + 20
            assert found[aid].timestamp_ms == deliver_at + 20
    finally:
        dest.close()


def test_timers_sent_in_one_batch_and_found_by_recovery_are_never_early(
    tmp_path: Path, pulsar_url: str, pulsar_admin_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Ordinary managed delivery: timers due GAP_MS apart are sent into one batch, the
    owner stops before their answers come (the batch is flushed as it closes), and the
    next start's recovery search records them PUBLISHED: each at or after its deliverAt,
    and no `early_delivery`."""
    caplog.set_level(logging.ERROR, logger="nereus")
    topic, data = unique_topic("batch-recovery"), str(tmp_path / "data")
    first = PulsarDestination(
        target(pulsar_url, pulsar_admin_url, {"q": topic}, batching_max_publish_delay_ms=WINDOW_MS)
    )
    n = Nereus.open(data, destination=first, assume_clock_error_ms=5)
    try:
        n.start()
        base = now_ms() + 2_000 + RECORDS * 20  # after every schedule's commit
        deliver: dict[str, int] = {}
        for i in range(RECORDS):
            r = n.schedule("q", f"k{i}", b"x", deliver_at_ms=base + i * GAP_MS, txn=f"t{i}")
            assert r.ok and r.deliver_at_ms is not None
            deliver[f"k{i}"] = r.deliver_at_ms
        _wait_for(n, deliver, "PUBLISHING", (base + RECORDS * GAP_MS + 5_000 - now_ms()) / 1000)
        time.sleep(0.2)  # the last admitted sends reach the client
        assert now_ms() < base + WINDOW_MS - 500, "the batch must still be open"
    finally:
        n.close()
    metrics = Metrics()
    second = PulsarDestination(target(pulsar_url, pulsar_admin_url, {"q": topic}))
    with Nereus.open(data, destination=second, assume_clock_error_ms=5, metrics=metrics) as n:
        assert {n.peek("q", k).status for k in deliver} == {"PUBLISHING"}, "answered live"
        n.start()
        _wait_for(n, deliver, "DELIVERED", 60)
        evidence = {k: n.peek("q", k).evidence for k in deliver}
    found = [e for e in evidence.values() if e is not None]
    assert len(found) == RECORDS
    assert _batch_indexes(found).most_common(1)[0][1] >= RECORDS // 2
    for k, e in evidence.items():
        assert e is not None
        assert e.timestamp_ms >= deliver[k], f"{k} stamped {deliver[k] - e.timestamp_ms} ms early"
    assert [r for r in caplog.records if getattr(r, "event", "") == "early_delivery"] == []
    assert metrics.value("nereus_early_deliveries_total") == 0


def _wait_for(n: Nereus, deliver: dict[str, int], status: str, timeout_s: float) -> None:
    deadline = time.monotonic() + max(timeout_s, 1)
    while time.monotonic() < deadline:
        statuses = Counter(n.peek("q", k).status for k in deliver)
        if statuses[status] == len(deliver):
            return
        time.sleep(0.05)
    raise AssertionError(f"not all {status}: {statuses}")
