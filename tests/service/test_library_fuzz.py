"""Property: nothing a caller passes to the library can stop the shard, and a refused call
changes nothing.

Random calls of every public call (schedule, reschedule, cancel, peek, list, and their async
forms) on one embedded shard whose runtime thread runs, with each argument either a
plausible value or junk: wrong types, bools, huge ints, floats, naive and aware datetimes,
dates, timedeltas, odd strings (empty, NUL, '/', lone surrogates, overlong), bytes-likes,
None, containers, objects. Each call must answer (a Result, a Peek or a Listing: the kernel
may reject with a code) or raise TypeError/ValueError with the store's digest and log end
unchanged; anything else fails the test, and after every call the runtime must still be
up. Every `Result` has the one shape: a status of the closed list, its code, and words on
every refusal. At the end the log replays to the store's state. `NEREUS_FUZZ_EXAMPLES` sizes it.
"""

from __future__ import annotations

import asyncio
import inspect
import os
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nereus import Listing, Nereus, Peek, Result
from nereus.replay.fold import replay
from nereus.service.calls import TimerCalls
from tests.support.library_harness import fingerprint, still_shard
from tests.support.runtime_harness import T0_MS

EXAMPLES = int(os.environ.get("NEREUS_FUZZ_EXAMPLES", "300"))


def _view(data: bytes) -> memoryview:
    return memoryview(data)


def _at(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, UTC)


ODD_TEXT = st.sampled_from(
    ["", "\x00", "a/b", "\ud800", "x\udfffy", "é" * 100, "k" * 151, "nereus-txn", " ", "🦀"]
)
AWARE = st.datetimes(
    timezones=st.builds(timezone, st.timedeltas(-timedelta(hours=23), timedelta(hours=23)))
)
JUNK = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(2**80), max_value=2**80),
    st.sampled_from([-1, 0, 2**53, 2**63 - 1, 2**63, 2**64, -(2**63) - 1]),
    st.floats(allow_nan=True),
    st.text(max_size=20),
    ODD_TEXT,
    st.binary(max_size=20),
    st.binary(max_size=20).map(bytearray),
    st.binary(max_size=20).map(_view),
    st.datetimes(),  # naive
    AWARE,
    st.dates(),
    st.timedeltas(),
    st.lists(st.text(max_size=3), max_size=3),
    st.lists(st.tuples(ODD_TEXT, ODD_TEXT), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    st.just(object()),
)


KEY = st.text(alphabet="abcxyz:/-", min_size=1, max_size=12)
DURATION = st.one_of(
    st.integers(min_value=0, max_value=3_600_000),
    st.timedeltas(min_value=timedelta(0), max_value=timedelta(hours=1)),
)
INSTANT = st.one_of(
    st.integers(min_value=T0_MS - 1000, max_value=T0_MS + 3_600_000),
    st.integers(min_value=0, max_value=3_600_000).map(lambda ms: _at(T0_MS + ms)),
)
GOOD: dict[str, st.SearchStrategy[Any]] = {
    "queue": st.sampled_from(["q", "r"]),
    "timer_key": KEY,
    "payload": st.binary(max_size=64),
    "tenant": st.sampled_from(["default", "acme"]),
    "delay_ms": DURATION,
    "deliver_at_ms": INSTANT,
    "expire_at_ms": INSTANT,
    "lifetime_ms": DURATION,
    "txn": st.text(alphabet="tx-0123", min_size=1, max_size=8),
    "partition": KEY,
    "headers": st.lists(st.tuples(st.sampled_from(["a", "b"]), st.text(max_size=5)), max_size=2),
    "expected_version": st.integers(min_value=0, max_value=4),
    "producer_sub": st.text(max_size=8),
    "encrypted": st.booleans(),
    "after": st.one_of(st.none(), KEY),
    "limit": st.integers(min_value=1, max_value=1000),
}
CALLS = ("schedule", "reschedule", "cancel", "peek", "list")


def _parameters(call: str, kind: inspect._ParameterKind) -> tuple[str, ...]:
    """The call's parameters of one kind, read from its signature: every parameter of
    every public call is fuzzed, including any added later (GOOD must know it)."""
    signature = inspect.signature(getattr(TimerCalls, call))
    names = tuple(p.name for p in signature.parameters.values() if p.kind is kind)
    return tuple(name for name in names if name != "self")


POSITIONAL = {call: _parameters(call, inspect.Parameter.POSITIONAL_OR_KEYWORD) for call in CALLS}
OPTIONS = {call: _parameters(call, inspect.Parameter.KEYWORD_ONLY) for call in CALLS}


@st.composite
def calls(draw: st.DrawFn) -> tuple[str, bool, list[Any], dict[str, Any]]:
    name = draw(st.sampled_from(sorted(POSITIONAL)))
    is_async = draw(st.booleans())
    chosen = draw(st.lists(st.sampled_from(OPTIONS[name]), unique=True, max_size=4))
    # Junk in none, one or two of the arguments, so that calls of each kind come through.
    params = [*POSITIONAL[name], *chosen]
    junk = set(draw(st.lists(st.sampled_from(params), unique=True, max_size=2)))

    def value(param: str) -> Any:
        return draw(JUNK if param in junk else GOOD[param])

    args = [value(p) for p in POSITIONAL[name]]
    kwargs = {option: value(option) for option in chosen}
    return name, is_async, args, kwargs


# The closed status list every surface shares (specs/codes.md), written out.
STATUSES = {"scheduled", "rescheduled", "unchanged", "canceled", "too_late", "absent", "rejected"}


def _one_shape(r: Result) -> None:
    """Never a status outside the list, a code that contradicts it, or a refusal without
    words (the same rule is a property over the kernel in tests/service/test_result_codes.py)."""
    assert r.status in STATUSES, r
    assert r.status in (r.code, "rejected"), r
    assert r.ok == (r.status in {"scheduled", "rescheduled", "unchanged", "canceled"}), r
    assert r.ok or r.message, r


@pytest.fixture
def nereus(tmp_path: Path) -> Iterator[Nereus]:
    with still_shard(tmp_path) as n:
        yield n


def test_the_fuzz_knows_every_parameter_of_every_call() -> None:
    for call in CALLS:
        assert set(POSITIONAL[call]) | set(OPTIONS[call]) <= set(GOOD), call
        signature = inspect.signature(getattr(TimerCalls, f"{call}_async"))
        assert list(signature.parameters) == ["self", *POSITIONAL[call], *OPTIONS[call]]


def test_no_call_halts_the_shard_and_a_refused_call_changes_nothing(nereus: Nereus) -> None:
    loop = asyncio.new_event_loop()
    counts = {"answered": 0, "refused": 0}

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(st.lists(calls(), min_size=1, max_size=4))
    def run(batch: list[tuple[str, bool, list[Any], dict[str, Any]]]) -> None:
        for name, is_async, args, kwargs in batch:
            before = fingerprint(nereus)
            method = getattr(nereus, f"{name}_async" if is_async else name)
            try:
                answer = method(*args, **kwargs)
                if is_async:
                    answer = loop.run_until_complete(answer)
            except (TypeError, ValueError):
                counts["refused"] += 1
                assert fingerprint(nereus) == before, (name, args, kwargs)
            else:
                counts["answered"] += 1
                assert isinstance(answer, Result | Peek | Listing)
                if isinstance(answer, Result):
                    _one_shape(answer)
            assert nereus.runtime.halted is None, (name, args, kwargs)

    try:
        run()
    finally:
        loop.close()
    assert counts["answered"] > 0 and counts["refused"] > 0, counts
    assert nereus.schedule("q", "after-the-fuzz", b"x", delay_ms=1).ok
    _, result = replay(nereus.store.iter_log(), nereus.store.config)
    assert result.digest == fingerprint(nereus)[0]
