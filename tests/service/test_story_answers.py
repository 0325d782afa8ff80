"""The story index seen from the service: each command the service appended to the shard
log is in the story of the timer it named, at the position it was appended at, with the
answer its caller got; one answered without an entry (a cancel that would change nothing,
`runtime.absent`) is not in the log, so not in the story; the fire is never in it.

The expectation is built from the calls alone: the answers they returned and the command
entries the log grew by while each ran. The store's own side of the rule, over generated
histories, is `tests/storage/test_story_index.py`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path

from nereus import Nereus
from nereus.adapters.clock import SimulatedClock
from nereus.kernel import records as r
from nereus.kernel.effects import EntryOutcome
from nereus.kernel.keys import DEFAULT_TENANT, message_id
from nereus.service.arguments import cancel_record, schedule_record
from nereus.service.results import Result
from tests.support.runtime_harness import T0_MS

ERROR_MS = 5
QUEUE = "q"
TIMEOUT_S = 30.0


def mid(key: str) -> str:
    return message_id(DEFAULT_TENANT, QUEUE, key)


class Calls:
    """Runs each call and notes, for every command it appended, (position, item, code)
    under the message the command named."""

    def __init__(self, n: Nereus) -> None:
        self.n = n
        self.expected: dict[str, list[tuple[int, int, str]]] = defaultdict(list)

    def _appended(self, before: int) -> list[r.LogEntry]:
        found = self.n.store.iter_log(before + 1)
        return [e for e in found if isinstance(e.record, (r.CommandBatch, *r.COMMAND_TYPES))]

    def one(self, key: str, call: Callable[[], Result]) -> Result:
        """A library call on `key` of QUEUE: at most one command entry."""
        before = self.n.store.log_last_position
        answer = call()
        appended = self._appended(before)
        assert len(appended) <= 1
        for entry in appended:
            self.expected[mid(key)].append((entry.position, 0, answer.code))
        return answer

    def unit(self, keys: Sequence[str], items: Sequence[r.Appendable]) -> list[EntryOutcome]:
        """One unit through the service port, as an HTTP batch goes: one entry."""
        before = self.n.store.log_last_position
        answers = self.n.service.execute(items, TIMEOUT_S)
        (entry,) = self._appended(before)
        for index, (key, answer) in enumerate(zip(keys, answers, strict=True)):
            assert (answer.position, answer.index) == (entry.position, index)
            self.expected[mid(key)].append((entry.position, index, str(answer.code)))
        return answers

    def story(self, key: str) -> list[tuple[int, int, str]]:
        with self.n.store.read() as view:
            rows, more = view.story_marks(mid(key), 100)
        assert not more
        return [(row.position, row.index, str(row.mark.code)) for row in rows]


def _deliver(n: Nereus, clock: SimulatedClock, key: str) -> None:
    clock.advance(1_000 + ERROR_MS)
    for _ in range(100):
        if n.peek(QUEUE, key).status == "DELIVERED":
            return
        n.runtime.run_once()
    raise AssertionError(f"{key} was not delivered")


def test_each_appended_command_is_in_its_timers_story_with_the_answer_given(
    tmp_path: Path,
) -> None:
    clock = SimulatedClock(T0_MS, error_ms=ERROR_MS)
    with Nereus.open(str(tmp_path), clock=clock) as n:
        calls = Calls(n)
        s = calls.one("a", lambda: n.schedule(QUEUE, "a", b"x", delay_ms=1_000, txn="a1"))
        assert s.status == "scheduled"
        calls.one("a", lambda: n.schedule(QUEUE, "a", b"x", delay_ms=1_000, txn="a1"))  # unchanged
        calls.one("b", lambda: n.schedule(QUEUE, "b", b"y", delay_ms=60_000))
        calls.one("b", lambda: n.cancel(QUEUE, "b"))
        rescheduled = calls.one("b", lambda: n.reschedule(QUEUE, "b", delay_ms=5_000))
        assert not rescheduled.ok
        again = calls.one("b", lambda: n.cancel(QUEUE, "b"))  # answered without an entry
        assert again.status == "absent"
        _deliver(n, clock, "a")
        late = calls.one("a", lambda: n.cancel(QUEUE, "a"))  # without an entry, too
        assert late.status == "too_late"
        # In a unit with a schedule, the late cancel and an absent one are appended.
        answers = calls.unit(
            ["c", "a", "nobody"],
            [
                schedule_record(QUEUE, "c", b"z", delay_ms=60_000),
                cancel_record(QUEUE, "a"),
                cancel_record(QUEUE, "nobody"),
            ],
        )
        assert [str(a.code) for a in answers] == ["scheduled", "too_late", "absent"]
        assert answers[1].attempt_id == late.attempt_id is not None
        for key in ("a", "b", "c", "nobody"):
            assert calls.story(key) == calls.expected[mid(key)], key
        assert [code for *_, code in calls.story("a")] == ["scheduled", "unchanged", "too_late"]
        assert [code for *_, code in calls.story("b")] == ["scheduled", "canceled", "absent"]
        with n.store.read() as view:
            (mark,), _ = view.story_marks(mid("a"), 1)
            assert mark.mark.attempt_id == late.attempt_id
            assert view.story_floor() == 1
