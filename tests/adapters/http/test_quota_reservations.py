"""Quotas that hold inside a batch and across concurrent batches (`adapters/http/policy.py`,
`adapters/metering.py`; specs/http.md, "Blocked for producing").

The rules, each checked against expectations written from the rule:
* a batch's need is one live timer per distinct key it schedules, with the largest payload
  it gives that key as stored (an encrypted queue's envelope adds 33 bytes and the key id);
  reschedules and cancels need nothing;
* the durable usage never passes a quota, whatever the interleaving of checks, commits,
  answers and frees (hypothesis: commits and answers of other batches are even slipped in
  while a check reads the durable usage, as another thread would);
* a batch that fits when nothing else is held is never refused; a tenant at its quota is
  refused even a batch that needs nothing.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nereus.adapters.http.batch import CancelOp, Checked, RescheduleOp, ScheduleOp
from nereus.adapters.http.errors import ApiError
from nereus.adapters.http.policy import Policy, quota_need
from nereus.adapters.metering import Blocks, RateLimiter, Reservation
from nereus.adapters.tenancy import Principal, parse_tenancy
from nereus.kernel.model import TenantUsage
from tests.support.http_harness import config

EXAMPLES = int(os.environ.get("NEREUS_QUOTA_EXAMPLES", "200"))
WHO = Principal("acme", "billing", frozenset({"produce"}))


def _policy(**quota: int) -> Policy:
    return Policy(parse_tenancy(config(acme=dict(quota)), "t.toml"), RateLimiter(), Blocks())


def _schedule(key: str, payload: bytes, queue: str = "q") -> Checked:
    return Checked(ScheduleOp(queue=queue, timer_key=key, payload=payload), payload)


def test_a_batch_needs_a_timer_per_distinct_key_and_its_largest_payload() -> None:
    batch = [
        _schedule("a", b"x" * 5),
        _schedule("a", b"x" * 9),  # the same timer again: its largest payload counts
        _schedule("a", b"x" * 2, queue="other"),  # another queue, another timer
        _schedule("b", b""),
        Checked(RescheduleOp(queue="q", timer_key="c", delay_ms=5)),
        Checked(CancelOp(queue="q", timer_key="d")),
    ]
    assert quota_need(batch, {}) == TenantUsage(live=3, bytes=11)
    # Sealed: 4 magic bytes, 1 length byte, the key id, a 12-byte nonce, a 16-byte tag.
    assert quota_need([_schedule("a", b"x" * 5)], {"q": "k1"}) == TenantUsage(1, 5 + 33 + 2)
    assert quota_need([], {}) == TenantUsage(0, 0)


@pytest.mark.parametrize(
    ("quota", "usage", "held", "need", "refused"),
    [
        ({"max_live_timers": 10}, (9, 0), (0, 0), (1, 0), False),  # reaches it exactly
        ({"max_live_timers": 10}, (9, 0), (0, 0), (2, 0), True),  # would pass it
        ({"max_live_timers": 10}, (5, 0), (4, 0), (2, 0), True),  # others hold the room
        ({"max_live_timers": 10}, (10, 0), (0, 0), (0, 0), True),  # at it: blocked
        ({"max_bytes": 100}, (0, 60), (0, 30), (1, 10), False),
        ({"max_bytes": 100}, (0, 60), (0, 30), (1, 11), True),
        ({"max_bytes": 100}, (0, 100), (0, 0), (0, 0), True),
        ({}, (10**9, 10**12), (5, 5), (256, 10**6), False),  # no quota
    ],
)
def test_the_quota_rule(
    quota: dict[str, int],
    usage: tuple[int, int],
    held: tuple[int, int],
    need: tuple[int, int],
    refused: bool,
) -> None:
    policy = _policy(**quota)
    try:
        policy.check_quota(WHO, TenantUsage(*usage), TenantUsage(*need), TenantUsage(*held))
    except ApiError as exc:
        assert exc.code == "over_quota" and refused
    else:
        assert not refused


@dataclass
class _Batch:
    need: TenantUsage
    hold: Reservation
    committed: bool = False


def _add(a: TenantUsage, b: TenantUsage, sign: int = 1) -> TenantUsage:
    return TenantUsage(a.live + sign * b.live, a.bytes + sign * b.bytes)


needs = st.builds(TenantUsage, live=st.integers(0, 6), bytes=st.integers(0, 60))


@settings(max_examples=EXAMPLES, deadline=None)
@given(
    limit_live=st.integers(0, 12),
    limit_bytes=st.integers(0, 120),
    plan=st.lists(
        st.one_of(
            st.tuples(st.just("check"), needs),
            st.tuples(st.just("advance"), st.integers(0, 20)),
            st.tuples(st.just("free"), needs),
        ),
        max_size=40,
    ),
    data=st.data(),
)
def test_the_durable_usage_never_passes_the_quota(
    limit_live: int, limit_bytes: int, plan: list[tuple[str, Any]], data: st.DataObject
) -> None:
    policy = _policy(max_live_timers=limit_live, max_bytes=limit_bytes)
    durable = TenantUsage(0, 0)
    open_batches: list[_Batch] = []

    def advance(i: int) -> None:
        """A batch's commit lands (its rows join the durable usage), or, once landed, its
        request is answered and its reservation released."""
        nonlocal durable
        batch = open_batches[i % len(open_batches)]
        if not batch.committed:
            batch.committed = True
            durable = _add(durable, batch.need)
        else:
            batch.hold.release()
            open_batches.remove(batch)

    def read_usage(tenant: str) -> TenantUsage:
        value = durable
        # Other requests run on while this one reads: commits land, answers release.
        for i in data.draw(st.lists(st.integers(0, 20), max_size=3), label="meanwhile"):
            if open_batches:
                advance(i)
        return value

    for op, arg in plan:
        if op == "check":
            idle = not open_batches
            try:
                hold = policy.reserve_quota(WHO, arg, read_usage)
            except ApiError as exc:
                assert exc.code == "over_quota"
                room = (
                    durable.live < limit_live
                    and durable.bytes < limit_bytes
                    and durable.live + arg.live <= limit_live
                    and durable.bytes + arg.bytes <= limit_bytes
                )
                assert not (idle and room), "refused a batch that fits"
            else:
                open_batches.append(_Batch(arg, hold))
        elif op == "advance" and open_batches:
            advance(arg)
        elif op == "free":
            # Cancels, fires and expiries: the durable usage only goes down.
            durable = TenantUsage(
                max(durable.live - arg.live, 0), max(durable.bytes - arg.bytes, 0)
            )
        assert durable.live <= limit_live, (durable, limit_live)
        assert durable.bytes <= limit_bytes, (durable, limit_bytes)
    for batch in list(open_batches):
        batch.hold.release()
    assert policy.reservations.held("acme") == TenantUsage(0, 0)
