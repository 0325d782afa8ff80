"""The library's arguments: checked on the caller's side, and never able to halt the shard.

A value of the wrong kind raises TypeError/ValueError naming the argument, before anything
is appended (the store's digest and log end are compared before and after). A value of the
right kind that breaks one of the kernel's rules is appended and answered with the kernel's
code. Durations and instants may be given as timedelta / aware datetime, rounded in the safe
direction. Below the library, `ShardRuntime.submit` refuses any item the log could not carry
(`runtime.guard`), so even records built by hand cannot halt the shard.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from datetime import UTC, date, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from nereus import Nereus
from nereus.kernel.records import Cancel, Schedule
from tests.support.library_harness import fingerprint, still_shard
from tests.support.runtime_harness import T0_MS

T0 = datetime.fromtimestamp(T0_MS / 1000, UTC)


@pytest.fixture
def nereus(tmp_path: Path) -> Iterator[Nereus]:
    with still_shard(tmp_path) as n:
        yield n


def _refused(n: Nereus, call: Callable[[], object], error: type[Exception], names: str) -> str:
    before = fingerprint(n)
    with pytest.raises(error) as caught:
        call()
    assert names in str(caught.value), caught.value
    assert fingerprint(n) == before, "a refused call changed the store"
    assert n.runtime.halted is None
    return str(caught.value)


BAD_SCHEDULES: list[tuple[str, dict[str, Any], type[Exception], str]] = [
    ("naive datetime", {"deliver_at_ms": datetime(2026, 12, 1, 9, 0)}, ValueError, "naive"),
    ("bool delay", {"delay_ms": True}, TypeError, "delay_ms"),
    ("text delay", {"delay_ms": "soon"}, TypeError, "delay_ms"),
    ("float delay", {"delay_ms": 1.5}, TypeError, "delay_ms"),
    ("date instant", {"deliver_at_ms": date(2026, 12, 1)}, TypeError, "deliver_at_ms"),
    ("timedelta instant", {"deliver_at_ms": timedelta(1)}, TypeError, "deliver_at_ms"),
    ("datetime duration", {"lifetime_ms": T0}, TypeError, "lifetime_ms"),
    ("naive expiry", {"expire_at_ms": datetime(2027, 1, 1)}, ValueError, "expire_at_ms"),
    ("huge delay", {"delay_ms": 10**30}, ValueError, "delay_ms"),
    ("bytes txn", {"txn": b"t-1"}, TypeError, "txn"),
    ("surrogate txn", {"txn": "t-\ud800"}, ValueError, "txn"),
    ("int partition", {"partition": 7}, TypeError, "partition"),
    ("bool version", {"expected_version": False}, TypeError, "expected_version"),
    ("int flag", {"encrypted": 1}, TypeError, "encrypted"),
    ("str headers", {"headers": "a=b"}, TypeError, "headers"),
    ("bad pair", {"headers": [("a", "b", "c")]}, TypeError, "headers[0]"),
    ("bytes header", {"headers": [("a", b"b")]}, TypeError, "headers[0] value"),
    ("tenant None", {"tenant": None}, TypeError, "tenant"),
]


@pytest.mark.parametrize(
    ("options", "error", "names"),
    [row[1:] for row in BAD_SCHEDULES],
    ids=[row[0] for row in BAD_SCHEDULES],
)
def test_a_bad_schedule_argument_raises_and_changes_nothing(
    nereus: Nereus, options: dict[str, Any], error: type[Exception], names: str
) -> None:
    _refused(nereus, lambda: nereus.schedule("q", "k", b"x", **options), error, names)
    assert nereus.schedule("q", "k", b"x").status == "scheduled", "the shard stopped"


@pytest.mark.parametrize(
    ("call", "error", "names"),
    [
        (lambda n: n.schedule("q", "k", "text payload"), TypeError, "encode text first"),
        (lambda n: n.schedule("q", "k", None), TypeError, "payload"),
        (lambda n: n.schedule(b"q", "k", b"x"), TypeError, "queue"),
        (lambda n: n.schedule("q", "\udcff", b"x"), ValueError, "timer_key"),
        (lambda n: n.reschedule("q", "k", deliver_at_ms=datetime.now()), ValueError, "naive"),
        (lambda n: n.reschedule("q", "k", lifetime_ms="1h"), TypeError, "lifetime_ms"),
        (lambda n: n.cancel("q", 5), TypeError, "timer_key"),
        (lambda n: n.cancel("q", "k", expected_version="1"), TypeError, "expected_version"),
        (lambda n: n.peek("q", None), TypeError, "timer_key"),
        (lambda n: n.list("q", limit=0), ValueError, "limit"),
        (lambda n: n.list("q", limit=True), TypeError, "limit"),
        (lambda n: n.list("q", after=3), TypeError, "after"),
    ],
    ids=[
        "str payload",
        "no payload",
        "bytes queue",
        "surrogate key",
        "naive reschedule",
        "str lifetime",
        "int key",
        "str version",
        "peek None",
        "list limit 0",
        "list limit bool",
        "list after int",
    ],
)
def test_every_call_checks_its_arguments(
    nereus: Nereus, call: Callable[[Nereus], object], error: type[Exception], names: str
) -> None:
    _refused(nereus, lambda: call(nereus), error, names)


def test_the_case_of_the_issue_no_longer_halts_the_shard(nereus: Nereus) -> None:
    """`deliver_at_ms=datetime.now()` (Celery's and APScheduler's habit) used to be written
    into the log as a string and halt the shard at its commit, for every later call too."""
    message = _refused(
        nereus,
        lambda: nereus.schedule("q", "k", b"x", deliver_at_ms=datetime.now()),
        ValueError,
        "deliver_at_ms",
    )
    assert "timezone" in message
    later = nereus.schedule("q", "k", b"x", deliver_at_ms=T0 + timedelta(hours=1))
    assert later.ok


def test_timedelta_and_aware_datetime_are_milliseconds(nereus: Nereus) -> None:
    r = nereus.schedule("q", "d", b"x", delay_ms=timedelta(days=7))
    assert r.deliver_at_ms == T0_MS + 7 * 86_400_000
    plus_two = timezone(timedelta(hours=2))
    at = (T0 + timedelta(hours=1)).astimezone(plus_two)  # the same instant in another zone
    r = nereus.schedule("q", "a", b"x", deliver_at_ms=at, expire_at_ms=at + timedelta(days=1))
    assert r.deliver_at_ms == T0_MS + 3_600_000
    assert nereus.peek("q", "a").expire_at_ms == T0_MS + 3_600_000 + 86_400_000
    r = nereus.reschedule("q", "a", delay_ms=timedelta(minutes=5), lifetime_ms=timedelta(hours=1))
    assert r.status == "rescheduled" and r.deliver_at_ms == T0_MS + 300_000
    assert nereus.peek("q", "a").expire_at_ms == T0_MS + 3_600_000


def test_sub_millisecond_parts_round_in_the_safe_direction(nereus: Nereus) -> None:
    # Delivery never earlier than asked; expiry never later than asked.
    r = nereus.schedule(
        "q",
        "r",
        b"x",
        deliver_at_ms=T0 + timedelta(seconds=10, microseconds=1),
        expire_at_ms=T0 + timedelta(hours=1, microseconds=999),
    )
    assert r.deliver_at_ms == T0_MS + 10_001
    assert nereus.peek("q", "r").expire_at_ms == T0_MS + 3_600_000
    r = nereus.schedule("q", "s", b"x", delay_ms=timedelta(microseconds=1))
    assert r.deliver_at_ms == T0_MS + 1


def test_bytes_likes_are_payloads(nereus: Nereus) -> None:
    for key, payload in (("ba", bytearray(b"abc")), ("mv", memoryview(b"xabcx")[1:4])):
        assert nereus.schedule("q", key, payload).ok
        assert nereus.peek("q", key).payload == b"abc"
    assert nereus.schedule("q", "h", b"x", headers={"kind": "day7"}).ok


@pytest.mark.parametrize(
    ("options", "code"),
    [
        ({"delay_ms": -1}, "invalid_timing"),
        ({"delay_ms": 1, "deliver_at_ms": T0_MS}, "invalid_timing"),
        ({"delay_ms": timedelta(days=400)}, "horizon_exceeded"),
        ({"delay_ms": 2**60}, "invalid_timing"),
        ({"deliver_at_ms": datetime(1969, 7, 20, tzinfo=UTC)}, "invalid_timing"),
        ({"lifetime_ms": timedelta(milliseconds=10)}, "expire_before_window"),
        ({"txn": ""}, "invalid_txn"),
        ({"headers": [("nereus-txn", "forged")]}, "invalid_headers"),
        ({"expected_version": 7}, "version_mismatch"),
    ],
)
def test_the_kernels_rules_answer_with_their_codes(
    nereus: Nereus, options: dict[str, Any], code: str
) -> None:
    before = nereus.store.log_last_position
    r = nereus.schedule("q", "k", b"x", **options)
    assert (r.ok, r.status, r.code) == (False, "rejected", code)
    assert r.message, "every refusal says why"
    assert nereus.store.log_last_position == before + 1, "a rejected command is in the log"


def test_identity_rules_answer_with_codes(nereus: Nereus) -> None:
    for queue, key in (("", "k"), ("a/b", "k"), ("q", "x" * 151), ("q", "nul\x00")):
        assert nereus.schedule(queue, key, b"x").code == "invalid_identity"
    assert nereus.cancel("q", "").code == "invalid_identity"


def _schedule(**fields: Any) -> Schedule:
    base: dict[str, Any] = {
        "tenant": "default",
        "queue": "q",
        "timer_key": "raw",
        "txn": "t",
        "payload_digest": hashlib.sha256(b"x").hexdigest(),
        "payload_size": 1,
        "delay_ms": 0,
    }
    return Schedule(**{**base, **fields})


@pytest.mark.parametrize(
    ("items", "error", "names"),
    [
        ([(_schedule(delay_ms=None, deliver_at_ms=datetime.now(UTC)), b"x")], ValueError, "$."),
        ([(_schedule(delay_ms=True), b"x")], ValueError, "delay_ms"),
        ([(_schedule(delay_ms=2**70), b"x")], ValueError, "SCHEDULE_V1"),
        ([(_schedule(queue="\ud800"), b"x")], ValueError, "SCHEDULE_V1"),
        ([(_schedule(), b"y")], ValueError, "payload_digest"),
        ([(_schedule(), "x")], TypeError, "payload"),
        ([(Cancel("default", "q", "k"), b"x")], ValueError, "carries no payload"),
        ([("not a record", None)], TypeError, "record"),
        ([_schedule()], TypeError, "pair"),
    ],
    ids=[
        "datetime in a record",
        "bool in a record",
        "int beyond 64 bits",
        "surrogate",
        "digest mismatch",
        "str payload",
        "payload on a cancel",
        "not a record",
        "not a pair",
    ],
)
def test_the_runtime_refuses_at_submit_what_the_log_could_not_carry(
    nereus: Nereus, items: list[Any], error: type[Exception], names: str
) -> None:
    _refused(nereus, lambda: nereus.runtime.submit(items), error, names)
    # A bad item refuses its whole submission: the good one beside it is not appended.
    good = (_schedule(timer_key="good"), b"x")
    _refused(nereus, lambda: nereus.runtime.submit([good, *items]), error, names)
    assert nereus.schedule("q", "after", b"x").ok
