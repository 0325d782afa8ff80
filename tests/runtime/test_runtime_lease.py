"""The send lease at the runtime: nothing is sent while the shard log does not prove that this
owner still holds the shard.

Kafka's shard log lets a send start only within `send_lease_ms` of the start of the last
transaction this owner committed (`adapters.kafka.log_writer`): after a pause, or while its
transactions fail, an owner may have been replaced without knowing it, and a send then could
race the new owner's. The runtime asks the log before every send (`ShardLog.send_allowed`).
Here the embedded log is given a lease the test holds or lets lapse between ticks, with no
broker, so the rule is checked on its own: an attempt admitted while the lease has lapsed
waits (PUBLISHING, its claim admitted), is never sent in a tick the lease is lapsed, and is
sent once, and only once, when the lease is back. The same rule on the real broker, with a
shard log whose transactions the broker refuses, is tests/adapters/kafka/test_kafka_lease.py's.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from nereus.adapters.clock import SimulatedClock
from nereus.kernel.codes import Code
from nereus.kernel.model import Status
from nereus.runtime.shardlog import EmbeddedLog
from nereus.storage.store import ShardStore
from tests.support.runtime_harness import T0_MS, Harness

ERROR_MS = 5
# Examples of the property (each a store of its own and up to 24 ticks).
EXAMPLES = int(os.environ.get("NEREUS_LEASE_EXAMPLES", "30"))


class Lease:
    """Whether the log proves ownership now: set by the test between ticks."""

    def __init__(self) -> None:
        self.held = True


class LeasedLog(EmbeddedLog):
    """The embedded log with a send lease the test controls (its commits never renew it,
    as a Kafka owner's failing transactions would not)."""

    def __init__(self, store: ShardStore, lease: Lease) -> None:
        super().__init__(store)
        self.lease = lease

    def send_allowed(self) -> bool:
        return self.lease.held


def _harness(root: Path, lease: Lease) -> Harness:
    clock = SimulatedClock(T0_MS, error_ms=ERROR_MS)
    return Harness(root, clock, shard_log=lambda store: LeasedLog(store, lease))


def test_an_attempt_admitted_while_the_lease_lapsed_waits_and_is_sent_once_it_is_back(
    tmp_path: Path,
) -> None:
    lease = Lease()
    h = _harness(tmp_path, lease)
    try:
        assert h.schedule("k", b"held", delay_ms=0).code is Code.SCHEDULED
        lease.held = False
        h.clock.advance(2 * ERROR_MS)
        h.tick(5)
        m = h.message("k")
        # Admitted (the Admission needs no lease), but not handed to the destination.
        assert m.status is Status.PUBLISHING
        assert h.runtime.claims.waiting_to_send() == 1
        assert h.sends == [] and h.delivered() == []
        # Much later, still lapsed: still nothing.
        h.clock.advance(60_000)
        h.tick(5)
        assert h.sends == [] and h.delivered() == []

        lease.held = True
        h.tick(3)
        (send,) = h.sends
        (record,) = h.delivered()
        assert record.attempt_id == send.attempt_id and record.payload == b"held"
        assert h.message("k").status is Status.DELIVERED
        assert not h.problems, h.problems
    finally:
        h.close()


@settings(max_examples=EXAMPLES, deadline=None)
@given(
    delays_ms=st.lists(st.integers(0, 1_000), min_size=1, max_size=6),
    steps=st.lists(
        st.tuples(st.booleans(), st.sampled_from([0, 1, ERROR_MS, 2 * ERROR_MS, 100, 400])),
        min_size=1,
        max_size=24,
    ),
)
def test_nothing_is_sent_in_a_tick_whose_lease_has_lapsed(
    delays_ms: list[int], steps: list[tuple[bool, int]]
) -> None:
    """Whatever the lease does between ticks, no tick that began with it lapsed hands
    anything to the destination; once it is held again every timer arrives exactly once."""
    with tempfile.TemporaryDirectory() as tmp:
        lease = Lease()
        h = _harness(Path(tmp), lease)
        try:
            keys = [f"k{i}" for i in range(len(delays_ms))]
            for key, delay_ms in zip(keys, delays_ms, strict=True):
                assert h.schedule(key, key.encode(), delay_ms=delay_ms).code is Code.SCHEDULED
            for held, advance_ms in steps:
                lease.held = held
                h.clock.advance(advance_ms)
                before = len(h.sends)
                h.tick()
                if not held:
                    assert len(h.sends) == before, "sent while the lease had lapsed"
            lease.held = True
            h.clock.advance(1_000 + 2 * ERROR_MS)
            h.tick(4)
            delivered = sorted(r.payload for r in h.delivered())
            assert delivered == sorted(k.encode() for k in keys)
            assert len(h.sends) == len(keys)
            assert not h.problems, h.problems
        finally:
            h.close()
