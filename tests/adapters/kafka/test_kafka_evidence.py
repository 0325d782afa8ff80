"""The Kafka evidence search against the real broker: when it is complete, and where it reads.

A search's completeness is what lets a miss prove absence (after the producer's fence), so it
must never be claimed for a read that stopped early:

* a search that read every partition to the end it took is complete, finds what is there,
  and (after a fence) proves the rest absent;
* a search cut short by its record bound or its time bound, or cancelled, is incomplete and
  proves nothing, whatever it did or did not find.

And a search reads each partition from the earliest admission time of its lookups less the
clock slack (`find_slack_ms`): a broker whose clock is behind the host's stamps a record
before the admission that led to it, and such a record, stamped less than the slack before
its admission, is found, never proven absent. The same rules at the runtime, through
recovery and uncertain retries, are tests/adapters/kafka/test_kafka_settle.py's.

`EvidenceReader.run_search` is called on the test's thread (the worker thread that would run
it in production only adds a queue); every search is made after a stand-in fence, so a
complete miss carries a proof and an incomplete one must not.
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Producer
from hypothesis import given, settings
from hypothesis import strategies as st

from nereus.adapters.kafka.evidence import EvidenceReader, SearchLimits
from nereus.adapters.search import BackgroundSearch
from nereus.runtime.destination import H_ATTEMPT_ID, Fence, Lookup, SearchOutcome
from nereus.runtime.log import NullLogger
from tests.support import kafka_env
from tests.support.kafka_env import create_topic, unique_topic

kafka_bootstrap = kafka_env.kafka_bootstrap
LOG_APPEND = {"message.timestamp.type": "LogAppendTime"}
FENCE = Fence("nereus-dest.evidence-test", 0)
PARTITIONS = 3
# Records per partition: more than one consumer call returns (`_CONSUME_BATCH`, 1,000), so a
# record bound below it always stops the read before any partition's end.
PER_PARTITION = int(os.environ.get("NEREUS_EVIDENCE_RECORDS", "1500"))
SLACK_EXAMPLES = int(os.environ.get("NEREUS_EVIDENCE_SLACK_EXAMPLES", "12"))


class Filled:
    """A topic of `PARTITIONS` partitions, `PER_PARTITION` records each, every record with an
    attempt id `fill-<partition>-<index>`; and the broker time of the first record."""

    def __init__(self, bootstrap: str) -> None:
        self.topic = create_topic(
            bootstrap, unique_topic("evidence"), partitions=PARTITIONS, config=LOG_APPEND
        )
        stamps: list[int] = []
        producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "acks": "all"})

        def stamped(err: Any, msg: Any) -> None:
            assert err is None, err
            stamps.append(msg.timestamp()[1])

        for p in range(PARTITIONS):
            for i in range(PER_PARTITION):
                attempt_id = f"fill-{p}-{i}".encode()
                producer.produce(
                    self.topic,
                    value=b"x" * 64,
                    partition=p,
                    headers=[(H_ATTEMPT_ID, attempt_id)],
                    on_delivery=stamped,
                )
                producer.poll(0)
        assert producer.flush(60) == 0
        assert len(stamps) == PARTITIONS * PER_PARTITION
        self.first_ms = min(stamps)


@pytest.fixture(scope="module")
def filled(kafka_bootstrap: str) -> Filled:
    return Filled(kafka_bootstrap)


@pytest.fixture
def reader_for(kafka_bootstrap: str) -> Iterator[list[EvidenceReader]]:
    made: list[EvidenceReader] = []
    yield made
    for reader in made:
        reader.close()


def _reader(
    bootstrap: str,
    made: list[EvidenceReader],
    *,
    slack_ms: int = 30_000,
    max_records: int = 10_000_000,
    max_seconds: float = 60.0,
) -> EvidenceReader:
    """A reader whose searches are made after `FENCE` (a fence that is always already up)."""

    def fenced(_cancelled: threading.Event) -> Fence:
        return FENCE

    limits = SearchLimits(slack_ms, max_records, max_seconds, admin_timeout_s=10.0)
    reader = EvidenceReader(
        {"bootstrap.servers": bootstrap}, "evidence-test", limits, NullLogger(), fence=fenced
    )
    made.append(reader)
    return reader


def _search(
    reader: EvidenceReader, lookups: list[Lookup], *, cancel: bool = False
) -> SearchOutcome:
    handle = BackgroundSearch(lookups, lambda: None)
    if cancel:
        handle.cancel()
    return reader.run_search(handle)


def test_a_full_read_is_complete_finds_what_is_there_and_proves_the_rest_absent(
    kafka_bootstrap: str, filled: Filled, reader_for: list[EvidenceReader]
) -> None:
    last = f"fill-1-{PER_PARTITION - 1}"  # the last record of a partition: read to the end
    lookups = [
        Lookup("fill-0-0", filled.topic, filled.first_ms),
        Lookup(last, filled.topic, filled.first_ms),
        Lookup("never-sent", filled.topic, filled.first_ms),
    ]
    outcome = _search(_reader(kafka_bootstrap, reader_for), lookups)
    assert outcome.complete and outcome.error is None
    assert set(outcome.found) == {"fill-0-0", last}
    assert outcome.found[last].partition == 1
    assert outcome.found[last].offset == PER_PARTITION - 1
    proof = outcome.proof_for(FENCE.fence_id, "never-sent")
    assert proof is not None and proof.fence_id == FENCE.fence_id


@pytest.mark.parametrize("cut", ["record-bound", "time-bound", "cancelled"])
def test_a_search_cut_short_is_incomplete_and_proves_nothing(
    kafka_bootstrap: str, filled: Filled, reader_for: list[EvidenceReader], cut: str
) -> None:
    """Nothing here is found, and nothing is proven: a record the read did not reach could
    be the one looked for (the partitions all hold records past where it stopped)."""
    if cut == "record-bound":
        reader = _reader(kafka_bootstrap, reader_for, max_records=100)
    elif cut == "time-bound":
        reader = _reader(kafka_bootstrap, reader_for, max_seconds=0.0)
    else:
        reader = _reader(kafka_bootstrap, reader_for)
    lookups = [Lookup("never-sent", filled.topic, filled.first_ms)]
    outcome = _search(reader, lookups, cancel=cut == "cancelled")
    assert not outcome.complete, outcome
    assert outcome.found == {}
    assert outcome.proof_for(FENCE.fence_id, "never-sent") is None


def test_a_search_reads_from_the_admission_time_less_the_clock_slack(
    kafka_bootstrap: str, reader_for: list[EvidenceReader]
) -> None:
    """A record stamped by the broker `behind_ms` before its admission's persistence time (a
    broker clock behind the host's), less than the slack: found, whatever the slack. One
    stamped further back than the slack is outside the window (the stated assumption)."""
    topic = create_topic(kafka_bootstrap, unique_topic("slack"), config=LOG_APPEND)
    attempt_id = f"late-{uuid.uuid4().hex[:8]}"
    stamps: list[int] = []
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "acks": "all"})
    producer.produce(
        topic,
        value=b"sent",
        headers=[(H_ATTEMPT_ID, attempt_id.encode())],
        on_delivery=lambda _err, msg: stamps.append(msg.timestamp()[1]),
    )
    assert producer.flush(30) == 0
    (stamped_ms,) = stamps

    @settings(max_examples=SLACK_EXAMPLES, deadline=None)
    @given(
        slack_ms=st.sampled_from([1_000, 5_000, 30_000, 120_000]),
        behind=st.floats(0.0, 1.0),
    )
    def check(slack_ms: int, behind: float) -> None:
        behind_ms = int(behind * (slack_ms - 1))
        reader = _reader(kafka_bootstrap, reader_for, slack_ms=slack_ms)
        admitted_ms = stamped_ms + behind_ms
        outcome = _search(reader, [Lookup(attempt_id, topic, admitted_ms)])
        assert outcome.complete
        assert attempt_id in outcome.found, (slack_ms, behind_ms)
        assert outcome.found[attempt_id].timestamp_ms == stamped_ms

    check()
    beyond = _search(
        _reader(kafka_bootstrap, reader_for, slack_ms=1_000),
        [Lookup(attempt_id, topic, stamped_ms + 1_001)],
    )
    assert beyond.found == {}
