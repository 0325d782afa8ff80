"""Ordinary and handed-off sends on one Pulsar topic never make a batch vanish, on the real
broker (scripts/pulsar) with deduplication on for the topic.

pulsar-client sends a message with a `deliver_at` at once, never in a batch, so through one
producer it overtakes the batch still open before it, whose messages have lower sequence
ids; a deduplicating broker then drops that batch whole and answers `Ok` with ledger and
entry -1 for each of its messages (recorded UNKNOWN: they are not at the broker, and only an
uncertain retry would deliver them). The rule, from specs/pulsar.md: every send of a mix is
at the broker under a real message id, none recorded UNKNOWN. Checked here as a hypothesis
property over interleavings and batching windows, and through a whole shard across a change
of the broker's settings that turns a queue from ordinary delivery to a handoff (the way one
topic comes to carry both)."""

from __future__ import annotations

import os
import tempfile
import time
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from nereus import Nereus
from nereus.adapters.pulsar.destination import PulsarDestination
from nereus.kernel.records import (
    IMMEDIATE,
    Capability,
    Evidence,
    Published,
    PublishOutcome,
    PublishOutcomes,
    Unknown,
)
from nereus.service.arguments import schedule_record
from tests.support.pulsar_env import (
    admin_call,
    admin_get,
    deduplicated_topic,
    now_ms,
    poll_results,
    prepared_send,
    pulsar_admin_url,
    pulsar_client,
    pulsar_url,
    read_all,
    target,
)

__all__ = ["pulsar_admin_url", "pulsar_client", "pulsar_url"]

EXAMPLES = int(os.environ.get("NEREUS_PULSAR_MIXED_EXAMPLES", "40"))
# Timers of each kind due in the same instant: one tick's sends (a deployment's reach
# thousands; the runtime hands them to the sender thread together).
TIMERS = int(os.environ.get("NEREUS_PULSAR_MIXED_TIMERS", "400"))
LEAD_MS, BOUND_MS = 2_000, 20
HANDOFF = Capability("delayed_handoff", LEAD_MS, 1_020)

# Runs: how many sends of one kind come together, alternating kinds; biased to the short
# runs that interleave inside one batching window.
RUNS = st.lists(st.integers(min_value=1, max_value=12) | st.just(1), min_size=1, max_size=16)


def _real_position(evidence: Evidence) -> bool:
    assert evidence.broker_message_id is not None
    ledger, entry, _partition, _batch = evidence.broker_message_id.split(":")
    return int(ledger) >= 0 and int(entry) >= 0


def test_no_interleaving_of_handoff_and_ordinary_sends_ever_loses_a_batch(
    pulsar_url: str, pulsar_admin_url: str, pulsar_client: Any
) -> None:
    topic = deduplicated_topic(pulsar_client, pulsar_admin_url, "mixed-prop")
    dests: dict[int, PulsarDestination] = {}
    sent: list[str] = []

    def dest_for(window_ms: int) -> PulsarDestination:
        if window_ms not in dests:
            options = {"batching_max_publish_delay_ms": window_ms}
            dests[window_ms] = PulsarDestination(
                target(pulsar_url, pulsar_admin_url, {}, **options)
            )
            dests[window_ms].open(f"prop{window_ms}")
        return dests[window_ms]

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True)
    @given(runs=RUNS, handoff_first=st.booleans(), window_ms=st.sampled_from([1, 5, 20]))
    def mix(runs: list[int], handoff_first: bool, window_ms: int) -> None:
        deliver_at = now_ms() + 120_000  # held by the broker all through the test
        sends = []
        for r, length in enumerate(runs):
            handoff = (r % 2 == 0) == handoff_first
            for _ in range(length):
                aid = f"p{len(sent)}"
                sent.append(aid)
                cap = HANDOFF if handoff else IMMEDIATE
                sends.append(prepared_send(topic, aid, deliver_at_ms=deliver_at, capability=cap))
        dest = dest_for(window_ms)
        dest.submit(sends, now_ms())
        got = poll_results(dest, len(sends), 30)
        assert set(got) == {s.attempt_id for s in sends}
        for aid, answer in got.items():
            assert isinstance(answer.result, Published), (aid, answer.result, runs)
            assert _real_position(answer.result.evidence), (aid, answer.result, runs)

    try:
        mix()
        held = [m.properties()["nereus-attempt-id"] for m in read_all(pulsar_client, topic)]
        assert sorted(held) == sorted(sent)  # every one there, and once
    finally:
        for dest in dests.values():
            dest.close()


def _set_max_delay(admin: str, topic: str, max_delay_ms: int | None) -> None:
    """A topic policy that caps the delay (refusing a handoff), or none (the broker's
    defaults, which certify it); waited for until the broker applies it."""
    path = "/admin/v2/persistent/public/default/" + topic.rsplit("/", 1)[1] + "/delayedDelivery"
    if max_delay_ms is None:
        admin_call(admin, "DELETE", path)
    else:
        policy = {"active": True, "tickTime": 1000, "maxDeliveryDelayInMillis": max_delay_ms}
        admin_call(admin, "POST", path, policy)
    deadline = time.monotonic() + 15
    while True:
        applied = admin_get(admin, path + "?applied=true") or {}
        if applied.get("maxDeliveryDelayInMillis", 0) == (max_delay_ms or 0):
            return
        assert time.monotonic() < deadline, f"{path}: {applied}"
        time.sleep(0.2)


def _outcomes(n: Nereus) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for entry in n.store.iter_log():
        record = entry.record
        if isinstance(record, PublishOutcome):
            out[record.attempt_id] = record.result
        elif isinstance(record, PublishOutcomes):
            out.update((item.attempt_id, item.result) for item in record.items)
    return out


def test_a_shard_turned_to_handoff_sends_both_kinds_in_one_tick_and_loses_none(
    pulsar_url: str, pulsar_admin_url: str, pulsar_client: Any
) -> None:
    """Timers pinned to ordinary delivery while the topic's policy refused a handoff, then
    timers pinned to the handoff once the policy is gone, all due to be sent in the same
    instant: every one DELIVERED on its first attempt with a real message id, no outcome
    UNKNOWN, each at the broker once (deliver_at only on the handed-off ones)."""
    topic = deduplicated_topic(pulsar_client, pulsar_admin_url, "mixed-shard")
    _set_max_delay(pulsar_admin_url, topic, 3_000)  # lead + push-out + slack exceed it
    options = {"delivery": "handoff", "handoff_lead_ms": LEAD_MS, "clock_ahead_bound_ms": BOUND_MS}
    dest = PulsarDestination(target(pulsar_url, pulsar_admin_url, {"q": topic}, **options))
    with tempfile.TemporaryDirectory() as data:
        n = Nereus.open(data, destination=dest, assume_clock_error_ms=5)
        try:
            assert dest.capability_for("q") == IMMEDIATE
            t0 = now_ms() + 500
            ordinary = [
                schedule_record("q", f"o{i}", b"o", deliver_at_ms=t0, txn=f"o{i}")
                for i in range(TIMERS)
            ]
            n.store.commit(n.pin(ordinary), now_ms())
            _set_max_delay(pulsar_admin_url, topic, None)
            dest.refresh_settings()
            assert dest.capability_for("q").kind == "delayed_handoff"
            # Sent lead before deliverAt: due together with the ordinary ones.
            handed = [
                schedule_record("q", f"h{i}", b"h", deliver_at_ms=t0 + LEAD_MS, txn=f"h{i}")
                for i in range(TIMERS)
            ]
            n.store.commit(n.pin(handed), now_ms())
            time.sleep(max(t0 - now_ms(), 0) / 1000)
            n.start()  # both kinds are due: the first ticks send them together
            keys = [f"o{i}" for i in range(TIMERS)] + [f"h{i}" for i in range(TIMERS)]
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                if all(n.peek("q", k).status == "DELIVERED" for k in keys):
                    break
                time.sleep(0.2)
            outcomes = _outcomes(n)
            peeks = {k: n.peek("q", k) for k in keys}
        finally:
            n.close()
    unknown = {a: r for a, r in outcomes.items() if isinstance(r, Unknown)}
    assert unknown == {}
    assert len(outcomes) == 2 * TIMERS  # one attempt each
    for key, peek in peeks.items():
        assert peek.status == "DELIVERED" and peek.attempts == 1, (key, peek)
        assert peek.evidence is not None and _real_position(peek.evidence), (key, peek)
    held = {m.properties()["nereus-message-id"]: m for m in read_all(pulsar_client, topic)}
    assert set(held) == {p.message_id for p in peeks.values()}
    assert len(read_all(pulsar_client, topic)) == 2 * TIMERS
    for key, peek in peeks.items():
        handed_off = "nereus-reveal-at" in held[str(peek.message_id)].properties()
        assert handed_off == key.startswith("h"), key
