"""Each refusal of an Admission, through the store with the compiled folds on.

The compiled Admission fold (`storage.admitted`, `native/src/admissions.rs`) takes only
Admissions the reducer would grant. Each case here is one Admission the reducer refuses
for one reason (P1's time rules among them), folded into an LMDB store with the compiled
folds on: the store must give the reducer's verdict, and must not have admitted anything.
The generated comparisons in `test_published_fold.py` cover the same ground at random;
these name each rule once, so a fold that forgets one fails here by name.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest

from nereus import kernel as k
from nereus.kernel import native
from nereus.storage import compiled_rows
from nereus.storage.schema import StoreOptions
from nereus.storage.store import ShardStore
from tests.support import strategies
from tests.support.builders import QUEUE, TENANT, Shard, interval_at, schedule

pytestmark = pytest.mark.skipif(
    native.fold_admitted is None, reason="the source build has no compiled fold"
)

HANDOFF = strategies.HANDOFF


def _admit_at(shard: Shard, at_ms: int, **changes: object) -> None:
    """Apply an Admission of timer "a" persisted at `at_ms`, with the clock's evidence of
    that moment unless `changes` say otherwise."""
    shard.now_ms = at_ms
    shard.apply(msgspec.structs.replace(shard.admission("a"), **changes))


def _granted(shard: Shard) -> None:
    message = shard.message("a")
    assert message is not None
    _admit_at(shard, message.action_at_ms + 10)


def _other_capability(shard: Shard) -> None:
    message = shard.message("a")
    assert message is not None
    _admit_at(shard, message.action_at_ms + 10, capability=HANDOFF)


def _before_action_time(shard: Shard) -> None:
    """The clock's evidence says the time has come; the log's own time says it has not."""
    message = shard.message("a")
    assert message is not None
    evidence = interval_at(message.action_at_ms + 10)
    _admit_at(shard, message.action_at_ms - 1, interval=evidence)


def _closed_lane(shard: Shard) -> None:
    message = shard.message("a")
    assert message is not None
    shard.apply(k.LaneGate(TENANT, QUEUE, "CLOSED"), at_ms=message.action_at_ms)
    _admit_at(shard, message.action_at_ms + 10)


def _after_expiry(shard: Shard) -> None:
    message = shard.message("a")
    assert message is not None
    evidence = interval_at(message.action_at_ms + 10)
    _admit_at(shard, message.expire_at_ms, interval=evidence)


def _clock_not_proving(shard: Shard) -> None:
    message = shard.message("a")
    assert message is not None
    evidence = k.TrustedInterval(message.action_at_ms - 50, message.action_at_ms + 50)
    _admit_at(shard, message.action_at_ms + 10, interval=evidence)


CASES: dict[str, tuple[Callable[[Shard], None], k.Code]] = {
    "granted": (_granted, k.Code.ADMITTED),
    "another capability": (_other_capability, k.Code.ADMISSION_CAPABILITY_MISMATCH),
    "before its action time": (_before_action_time, k.Code.ADMISSION_BEFORE_ACTION_TIME),
    "into a closed lane": (_closed_lane, k.Code.ADMISSION_LANE_CLOSED),
    "at its expiry": (_after_expiry, k.Code.ADMISSION_AFTER_EXPIRE),
    "a clock that does not prove the time": (_clock_not_proving, k.Code.ADMISSION_EVIDENCE_INVALID),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_store_gives_the_reducers_verdict_with_the_compiled_folds_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    admit, code = CASES[case]
    inner = native.fold_admitted
    assert inner is not None
    answered: list[bool] = []

    def spy(*args: object) -> object:
        answer = inner(*args)
        answered.append(answer is not None)
        return answer

    monkeypatch.setattr(native, "fold_admitted", spy)
    shard = Shard(config=strategies.CONFIG)
    shard.apply(schedule("a", delay_ms=2_000))
    admit(shard)
    entries = [entry for entry, _ in shard.history]
    before = compiled_rows.set_enabled(True)
    try:
        options = StoreOptions(max_batch_entries=1_000)
        with ShardStore.open(str(tmp_path / "s"), config=strategies.CONFIG, options=options) as s:
            applied = s.apply(entries)
            with s.state_view() as state:
                message = state.message(_mid().encode())
    finally:
        compiled_rows.set_enabled(before)
    assert [effects for _, effects in applied] == [effects for _, effects in shard.history]
    outcome = applied[-1][1][0]
    assert isinstance(outcome, k.EntryOutcome) and outcome.code is code
    assert message is not None
    expected = k.Status.PUBLISHING if code is k.Code.ADMITTED else k.Status.SCHEDULED
    assert message.status is expected
    if code is k.Code.ADMITTED:
        assert answered == [True], "the granted Admission must take the compiled fold"


def _mid() -> str:
    return k.message_id(TENANT, QUEUE, "a")
