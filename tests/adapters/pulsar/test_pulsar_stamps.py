"""The time a Pulsar record's evidence carries, without a broker (`adapters.pulsar.stamps`).

The rule: the evidence time of a record is never earlier than the record's own send, nor
than its requested reveal; so the early-delivery check (`runtime.tally`) never fires for a
record sent at or after its deliverAt, and fires for one sent before it. A batch is modelled
as the client makes it (measured, `tests/adapters/pulsar/test_pulsar_evidence.py` on the real
broker): every
record of a batch reads the batch's publish time, which is its first record's send time, and
a record's batch index is its place in the batch (-1 when it was sent alone).
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from nereus.adapters.pulsar.stamps import found_at_ms, live_at_ms, sent_at_ms
from nereus.kernel.codes import Code
from nereus.kernel.effects import EntryOutcome
from nereus.kernel.records import Evidence, Published, PublishOutcome
from nereus.runtime.log import Logger
from nereus.runtime.metrics import Metrics
from nereus.runtime.tally import Tally

T0_MS = 1_800_000_000_000
SENT, REVEAL = "nereus-sent-at", "nereus-reveal-at"

# Gaps between consecutive sends of one batch, and how long after its last send it is read.
gaps_ms = st.lists(st.integers(0, 5_000), min_size=1, max_size=40)
read_after_ms = st.integers(0, 3_600_000)
reveals_ms = st.none() | st.integers(T0_MS - 10_000, T0_MS + 120_000)


def _batch(gaps: list[int]) -> list[int]:
    """The send times of a batch's records, in order, from the gaps between them."""
    sends, at = [], T0_MS
    for gap in gaps:
        sends.append(at)
        at += gap
    return sends


def _props(sent_ms: int | None, reveal_ms: int | None) -> dict[str, str]:
    props = {"nereus-attempt-id": "a"}
    if sent_ms is not None:
        props[SENT] = str(sent_ms)
    if reveal_ms is not None:
        props[REVEAL] = str(reveal_ms)
    return props


@given(gaps_ms, read_after_ms, st.data())
def test_a_batched_record_is_never_stamped_before_its_own_send(
    gaps: list[int], read_after: int, data: st.DataObject
) -> None:
    sends = _batch(gaps)
    publish_ms = sends[0]  # the batch's time: its first record's send
    read_ms = sends[-1] + read_after  # a search reads the batch after its last send
    alone = len(sends) == 1 and data.draw(st.booleans())
    for index, send_ms in enumerate(sends):
        # Written by this build (with its send time) or by an older one (without).
        carried = data.draw(st.booleans())
        reveal_ms = data.draw(reveals_ms)
        stamped = found_at_ms(
            _props(send_ms if carried else None, reveal_ms),
            publish_ms,
            -1 if alone else index,
            read_ms,
        )
        assert stamped >= send_ms, f"record {index} stamped {send_ms - stamped} ms early"
        assert reveal_ms is None or stamped >= reveal_ms


@given(gaps_ms, read_after_ms, st.integers(-5_000, 5_000))
def test_a_record_of_this_build_carries_its_own_send_time(
    gaps: list[int], read_after: int, deliver_offset_ms: int
) -> None:
    """With its send time on it, a record's evidence is exactly that send (not its batch's
    time): on time it never looks early, sent early it always does."""
    sends = _batch(gaps)
    for index, send_ms in enumerate(sends):
        stamped = found_at_ms(_props(send_ms, None), sends[0], index, sends[-1] + read_after)
        assert stamped == send_ms
        deliver_at_ms = send_ms + deliver_offset_ms
        assert (stamped < deliver_at_ms) == (send_ms < deliver_at_ms)


@given(st.integers(0, 2**62), st.integers(0, 2**62), st.integers(0, 2**62))
def test_the_later_of_publish_send_and_reveal(publish: int, sent: int, reveal: int) -> None:
    assert found_at_ms(_props(sent, reveal), publish, 3, 0) == max(publish, sent, reveal)
    assert found_at_ms(_props(sent, None), publish, -1, 0) == max(publish, sent)


def test_records_without_their_send_time_are_still_found_and_never_look_early() -> None:
    publish, read = T0_MS, T0_MS + 60_000
    rows = [
        # (properties, batch index, evidence time): sent alone or first in its batch, the
        # publish time is its own send; later in a batch it is unknown, so the read time.
        ({}, -1, publish),
        ({}, 0, publish),
        ({}, 1, read),
        ({}, 999, read),
        # An unreadable send time counts as none.
        ({SENT: ""}, 2, read),
        ({SENT: "12a"}, 2, read),
        ({SENT: "-5"}, 2, read),
        ({SENT: "\u0661\u0662"}, 2, read),
        ({SENT: "-5"}, 0, publish),
        # A handed-off record: its reveal time when that is later.
        ({REVEAL: str(T0_MS + 90_000)}, 3, T0_MS + 90_000),
        ({REVEAL: str(T0_MS + 90_000)}, -1, T0_MS + 90_000),
        ({REVEAL: str(T0_MS - 1)}, -1, publish),
        ({REVEAL: "x"}, -1, publish),
        ({SENT: str(T0_MS + 7), REVEAL: str(T0_MS + 90_000)}, 1, T0_MS + 90_000),
        ({SENT: str(T0_MS + 7)}, 1, T0_MS + 7),
    ]
    for props, index, expected in rows:
        assert found_at_ms(props, publish, index, read) == expected, (props, index)


@given(st.integers(0, 2**62), st.integers(-(2**40), 2**40), st.none() | st.integers(0, 2**62))
def test_a_send_is_never_stamped_before_the_reading_that_opened_its_gate(
    gate: int, step: int, reveal: int | None
) -> None:
    """The clock may step back between the gate's reading and the send's."""
    sent = sent_at_ms(gate, gate + step)
    assert sent >= gate and sent >= gate + step
    stamped = live_at_ms(sent, reveal)
    assert stamped >= sent and (reveal is None or stamped >= reveal)


def _early_deliveries(evidence_ms: int, deliver_at_ms: int) -> float:
    metrics = Metrics()
    tally = Tally(Logger("tests.pulsar.stamps"), recovered=True)
    record = PublishOutcome("a", "m", 1, Published(Evidence("t", -1, -1, evidence_ms, "1:2:-1:3")))
    outcome = EntryOutcome(
        7, "PUBLISH_OUTCOME_V1", True, Code.OUTCOME_RECORDED, "m", 1, deliver_at_ms=deliver_at_ms
    )
    tally.entry(record, outcome, evidence_ms)
    tally.write(metrics)
    return metrics.value("nereus_early_deliveries_total")


@given(st.integers(0, 3_000), st.integers(1, 50), st.integers(1, 3_000))
def test_the_early_delivery_check_fires_only_for_a_record_sent_early(
    first_gap_ms: int, later_ms: int, early_ms: int
) -> None:
    """Two records of one batch, the second sent `later_ms` after the first, each at or
    after its deliverAt: neither is an early delivery (the batch's time would make the
    second one look early). One sent `early_ms` before its deliverAt is."""
    first = T0_MS + first_gap_ms
    second = first + later_ms
    for index, send_ms in enumerate((first, second)):
        stamped = found_at_ms(_props(send_ms, None), first, index, second + 1_000)
        assert _early_deliveries(stamped, deliver_at_ms=send_ms) == 0
        assert _early_deliveries(stamped, deliver_at_ms=send_ms + early_ms) == 1
