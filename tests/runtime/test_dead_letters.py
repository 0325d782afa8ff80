"""Dead-letter copies are owed in the shard state and written until the log records them.

Driven tick by tick on real LMDB stores (`tests.support.runtime_harness`). A timer whose every claim
fails before any send (its capability is one the local destination does not offer) spends
its budget and is DEAD_LETTERED; in that same commit the shard state records its copy as
owed (a dead_letters row). The copy goes to `<queue>.dlq`, filed under the consumer group
`nereus.timers.dlq` with the attempt history, and DEAD_LETTER_WRITTEN_V1 closes the row with
the copy's evidence. A process killed between the dead-letter commit and the write, or after
the write and before the record, leaves the row behind: the restarted runtime looks for the
copy under its attempt id and records it, or writes it. A failed or UNKNOWN write is written
again after a backoff. Every send is checked, inside the destination call and in a read
transaction of its own, against what the committed shard state owes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from nereus.adapters.clock import SimulatedClock
from nereus.adapters.local.destination import LocalDestination, LocalRecord
from nereus.kernel.codes import Code
from nereus.kernel.config import KernelConfig
from nereus.kernel.digest import state_digest
from nereus.kernel.keys import dead_letter_key
from nereus.kernel.model import DeadLetterPending, Status, Table
from nereus.kernel.records import (
    Capability,
    DeadLetterWritten,
    Evidence,
    NotPublished,
    Schedule,
    Unknown,
)
from nereus.runtime.config import RuntimeConfig
from nereus.runtime.deferred import Deferred
from nereus.runtime.destination import (
    DLQ_CONSUMER_GROUP,
    H_CONSUMER_GROUP,
    Send,
    SendResult,
    dead_letter_attempt_id,
)
from nereus.runtime.prepare import H_DLQ_PAYLOAD_OMITTED
from nereus.storage.memory import MemoryStore
from tests.support.builders import records
from tests.support.runtime_harness import T0_MS, CrashBeforeWrite, Harness

KERNEL = KernelConfig()
MAX_ATTEMPTS = KERNEL.max_attempts
RUNTIME = RuntimeConfig()
BASE_MS = RUNTIME.dead_letter_backoff_base_ms


def _harness(tmp_path: Path, destination_cls: type[LocalDestination] = LocalDestination) -> Harness:
    return Harness(tmp_path, SimulatedClock(T0_MS, error_ms=5), destination_cls=destination_cls)


def _mismatched(key: str, payload: bytes, txn: str = "t-1") -> Schedule:
    """A schedule whose capability the local destination does not offer: every claim fails
    before any send, so the timer spends its budget and is dead-lettered."""
    return Schedule(
        "default",
        "q",
        key,
        txn,
        hashlib.sha256(payload).hexdigest(),
        len(payload),
        delay_ms=0,
        capability=Capability("delayed_handoff"),
    )


def _spend_all_but_one(h: Harness, key: str = "k", payload: bytes = b"p") -> None:
    assert h.run([(_mismatched(key, payload), payload)])[0].code is Code.SCHEDULED
    for _ in range(MAX_ATTEMPTS - 1):
        h.clock.advance(KERNEL.backoff_max_ms)
        h.tick(2)
    m = h.message(key)
    assert (m.status, m.attempts_spent) == (Status.SCHEDULED, MAX_ATTEMPTS - 1)


def _dead_letter_tick(h: Harness) -> None:
    """The tick whose claim result spends the last attempt; the copy is sent in it too."""
    h.clock.advance(KERNEL.backoff_max_ms)
    h.tick()


def _owed(h: Harness) -> dict[bytes, DeadLetterPending]:
    with h.store.read() as view:
        rows = dict(view.items(Table.DEAD_LETTERS))
    assert all(isinstance(v, DeadLetterPending) for v in rows.values())
    return rows  # type: ignore[return-value]


def _recorded(h: Harness) -> list[DeadLetterWritten]:
    return [r for r in records(h.log()) if isinstance(r, DeadLetterWritten)]


def _copies(h: Harness) -> list[LocalRecord]:
    return h.delivered("q.dlq")


def _assert_copy_recorded(h: Harness, key: str = "k", payload: bytes = b"p") -> LocalRecord:
    """Exactly one copy, with the history headers, recorded once with its evidence."""
    m = h.message(key)
    (copy,) = _copies(h)
    headers = dict(copy.headers)
    assert copy.payload == payload and copy.message_id == m.message_id
    assert copy.attempt_id == dead_letter_attempt_id(m.message_id, m.generation)
    assert headers[H_CONSUMER_GROUP] == DLQ_CONSUMER_GROUP == "nereus.timers.dlq"
    assert headers["nereus-dlq-attempts-spent"] == str(MAX_ATTEMPTS)
    assert headers["nereus-dlq-last-error"] == "capability_mismatch"
    # The copy names its timer, as the record it stands for would have.
    assert copy.timer_key == key and headers["nereus-timer-key"] == key
    (written,) = _recorded(h)
    evidence = Evidence("q.dlq", 0, copy.offset, copy.delivered_at_ms)
    assert written == DeadLetterWritten(m.message_id, m.generation, evidence)
    assert m.status is Status.DEAD_LETTERED and m.dead_letter_evidence == evidence
    assert _owed(h) == {}
    assert h.store.meta.counters.dead_letters_pending == 0
    assert not h.problems, h.problems
    return copy


def test_the_copy_is_owed_in_the_dead_letter_commit_and_recorded_once_written(
    tmp_path: Path,
) -> None:
    h = _harness(tmp_path)
    _spend_all_but_one(h)
    _dead_letter_tick(h)
    m = h.message("k")
    assert m.status is Status.DEAD_LETTERED and m.dead_letter_evidence is None
    (row,) = _owed(h).values()
    assert (row.message_id, row.generation, row.attempts_spent) == (m.message_id, 1, MAX_ATTEMPTS)
    assert len(_copies(h)) == 1 and _recorded(h) == []  # written in that tick, not yet recorded
    h.tick()
    _assert_copy_recorded(h)
    h.clock.advance(60_000)
    h.tick(3)
    assert len(_copies(h)) == 1 and len(_recorded(h)) == 1
    h.close()


def test_a_crash_between_the_dead_letter_commit_and_the_write_is_recovered(
    tmp_path: Path,
) -> None:
    h = _harness(tmp_path)
    _spend_all_but_one(h)
    h.crash_before_write = True
    with pytest.raises(CrashBeforeWrite):
        _dead_letter_tick(h)
    h.crash()
    # Durable: the message is DEAD_LETTERED and owes its copy; nothing reached the DLQ.
    h.crash_before_write = False
    h.reopen()
    assert h.message("k").status is Status.DEAD_LETTERED and len(_owed(h)) == 1
    assert _copies(h) == [] and _recorded(h) == []
    h.tick()  # recovery: looks for the copy (absent), writes it
    assert len(_copies(h)) == 1
    h.tick()
    _assert_copy_recorded(h)
    h.close()


def test_a_crash_after_the_write_records_the_copy_found_and_writes_nothing_again(
    tmp_path: Path,
) -> None:
    h = _harness(tmp_path)
    _spend_all_but_one(h)
    _dead_letter_tick(h)  # the copy is written; its result dies with the process
    assert len(_copies(h)) == 1 and _recorded(h) == []
    h.crash()
    h.reopen()
    h.tick(3)
    _assert_copy_recorded(h)
    assert len(h.sends) == 1, "the copy was written again"
    h.close()


class _Scripted(LocalDestination):
    dlq_writes = 0


def _scripted(script: list[str]) -> type[_Scripted]:
    """A local destination whose dead-letter writes follow `script`, one word per write:
    `retriable` (refused, absent), `unknown` (no answer, absent), `unknown_written` (no
    answer, present), `ok`; writes beyond the script succeed."""

    class Scripted(_Scripted):
        def submit(self, sends: Sequence[Send], now_ms: int) -> None:
            rest: list[Send] = []
            for send in sends:
                if not send.prepared.topic.endswith(".dlq"):
                    rest.append(send)
                    continue
                type(self).dlq_writes += 1
                how = script.pop(0) if script else "ok"
                p = send.prepared
                if how in ("ok", "unknown_written"):
                    super().submit([send], now_ms)
                if how == "ok":
                    continue
                result: NotPublished | Unknown = (
                    NotPublished("retriable", "broker_down")
                    if how == "retriable"
                    else Unknown("timeout")
                )
                if how == "unknown_written":
                    self._results.pop()  # the acknowledgement was lost
                self._results.append(
                    SendResult(send.attempt_id, p.message_id, p.generation, result)
                )
            if rest:
                super().submit(rest, now_ms)

    return Scripted


def test_a_failed_or_unknown_write_is_written_again_after_a_backoff(tmp_path: Path) -> None:
    dest = _scripted(["retriable", "unknown"])
    h = _harness(tmp_path, dest)
    _spend_all_but_one(h)
    _dead_letter_tick(h)  # write 1: refused
    assert dest.dlq_writes == 1
    h.tick()  # its result: the next write is due in BASE_MS
    h.clock.advance(BASE_MS - 1)
    h.tick()
    assert dest.dlq_writes == 1, "written again before the backoff"
    h.clock.advance(1)
    h.tick()  # write 2: no answer
    assert dest.dlq_writes == 2
    h.tick()
    h.clock.advance(2 * BASE_MS - 1)
    h.tick()
    assert dest.dlq_writes == 2, "written again before the doubled backoff"
    h.clock.advance(1)
    h.tick()  # the look first, in an evidence search
    h.tick()  # absent (the write never landed): write 3, ok
    assert dest.dlq_writes == 3
    h.tick()
    _assert_copy_recorded(h)
    h.close()


def test_an_unknown_write_that_landed_is_found_not_written_twice(tmp_path: Path) -> None:
    dest = _scripted(["unknown_written"])
    h = _harness(tmp_path, dest)
    _spend_all_but_one(h)
    _dead_letter_tick(h)
    h.tick()  # UNKNOWN: look first, after the backoff
    h.clock.advance(BASE_MS)
    h.tick()  # found under its attempt id: recorded, not written again
    h.tick()
    assert dest.dlq_writes == 1
    _assert_copy_recorded(h)
    h.close()


def test_replay_of_the_log_reproduces_the_owed_copies(tmp_path: Path) -> None:
    h = _harness(tmp_path)
    _spend_all_but_one(h, "a")
    h.crash_before_write = True
    with pytest.raises(CrashBeforeWrite):
        _dead_letter_tick(h)
    h.crash()
    h.crash_before_write = False
    h.reopen()

    def replayed() -> MemoryStore:
        memory = MemoryStore(h.store.config)
        memory.feed(h.store.iter_log())
        return memory

    def same(expected_rows: int) -> None:
        memory = replayed()
        with h.store.state_view() as live:
            assert list(memory.state.items(Table.DEAD_LETTERS)) == list(
                live.items(Table.DEAD_LETTERS)
            )
            assert state_digest(memory.state) == state_digest(live)
        assert len(list(memory.state.items(Table.DEAD_LETTERS))) == expected_rows

    same(1)  # owed, before recovery wrote it
    h.tick(2)
    same(0)  # recorded
    h.close()


def test_a_copy_owed_across_a_superseding_schedule_keeps_the_old_content(
    tmp_path: Path,
) -> None:
    h = _harness(tmp_path)
    _spend_all_but_one(h, payload=b"old")
    h.crash_before_write = True
    with pytest.raises(CrashBeforeWrite):
        _dead_letter_tick(h)
    h.crash()
    h.crash_before_write = False
    h.reopen()
    # The client schedules new content under the same key before the copy is written (the
    # command is taken in the very tick that recovers); the copy owed is generation 1's.
    new = b"new content"
    (out,) = h.run([(_mismatched("k", new, txn="t-2"), new)])
    assert (out.code, out.generation) == (Code.SCHEDULED, 2)
    h.tick()
    (copy,) = _copies(h)
    assert (copy.payload, copy.generation, copy.txn) == (b"old", 1, "t-1")
    (written,) = _recorded(h)
    assert written.generation == 1
    m = h.message("k")
    assert (m.generation, m.status, m.dead_letter_evidence) == (2, Status.SCHEDULED, None)
    assert _owed(h) == {}
    assert h.store.payload(hashlib.sha256(b"old").hexdigest()) is None  # released
    assert not h.problems, h.problems
    h.close()


class _SmallTopics(LocalDestination):
    def __init__(self, path: str, **options: Any) -> None:
        super().__init__(path, max_record_bytes=400, **options)


def test_a_copy_too_large_for_the_dead_letter_topic_is_written_without_its_payload(
    tmp_path: Path,
) -> None:
    h = _harness(tmp_path, _SmallTopics)
    big = b"x" * 1_000
    assert h.schedule("big", big, delay_ms=0).code is Code.SCHEDULED
    for _ in range(MAX_ATTEMPTS + 1):  # every claim fails: record_too_large
        h.clock.advance(KERNEL.backoff_max_ms)
        h.tick(2)
    m = h.message("big")
    assert (m.status, m.last_error) == (Status.DEAD_LETTERED, "record_too_large")
    (copy,) = _copies(h)
    headers = dict(copy.headers)
    assert copy.payload == b"" and copy.timer_key == "big"
    assert headers["nereus-timer-key"] == "big"
    assert headers[H_DLQ_PAYLOAD_OMITTED].startswith("record_too_large:")
    assert m.dead_letter_evidence is not None and _owed(h) == {}
    assert dead_letter_key(m.message_id, m.generation) not in _owed(h)
    h.close()


def test_deferred_records_reach_the_next_batch_once_and_in_the_order_they_arose() -> None:
    """The queue the runtime hands to dead letters and the effects runner: what is added
    goes into the next drained batch, after what the batch already holds, exactly once."""
    where = Evidence("dlq", 0, 7, T0_MS)
    first = (DeadLetterWritten("m1", 1, where), None)
    second = (DeadLetterWritten("m2", 1, where), None)
    deferred = Deferred()
    deferred.add(first)
    deferred.add(second)
    assert deferred and len(deferred) == 2
    batch: list[Any] = ["already there"]
    deferred.drain_into(batch)
    assert batch == ["already there", first, second]
    assert not deferred
    deferred.drain_into(batch)
    assert batch == ["already there", first, second]  # drained once, never twice
    deferred.add(first)
    deferred.clear()  # the shard was let go: nothing of it reaches a later commit
    deferred.drain_into(batch)
    assert len(batch) == 3
