"""The intake: client commands waiting for the shard's next commit, and their futures.

Theory of operation: `put` (from any thread) queues a unit of records with the
`CommandFuture` that answers it and wakes the loop. A tick takes whole units, up to
`max_commands_per_tick` records, into its one commit; afterwards each future completes with
one `EntryOutcome` per record of its unit, in order. The queue is bounded
(`max_queued_commands`): past the bound `put` raises `Overloaded` and queues nothing. When
the runtime halts or lets the shard go, every future still queued fails, so no caller waits
for a commit that will never come.

The intake also knows which timer keys have a command in flight, from `put` until the unit's
future completes (after its commit, or when it fails): `in_flight` answers it, so a read of
the committed store begun afterwards has seen every command submitted before the question
(`runtime.absent`). Units are numbered as they are put; each key remembers the last unit
that holds a command for it, and a floor says below which number every unit is answered,
so a put costs one dict store per command and an answer O(1). Keys are timer keys alone
(of any tenant and queue): a key shared by two identities only makes the answer
conservative. A unit holding any record other than a client command (an operator's shard
state, which may change any command's verdict) counts as holding every key.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Sequence
from functools import partial

from nereus.kernel.effects import EntryOutcome
from nereus.kernel.records import COMMAND_TYPES, Appendable, CommandBatch
from nereus.runtime.errors import Overloaded, RuntimeHalted

_COMMANDS = frozenset(COMMAND_TYPES)
# In-flight keys are pruned once there are this many (and then at twice what is left).
_PRUNE_AT = 1024


class CommandFuture:
    """Completes with one EntryOutcome per submitted record, in order, after the batch is
    durably committed."""

    def __init__(self, count: int, release: Callable[[], None] | None = None) -> None:
        self.count = count
        # Runs once, before the future is done: whoever sees it done sees the intake's
        # in-flight counts without it (`Intake.in_flight`).
        self._release = release
        self._done = threading.Event()
        self._outcomes: list[EntryOutcome] = []
        self._error: BaseException | None = None
        # Callbacks and the done flag change under one lock, so a callback added while the
        # runtime completes the future runs exactly once.
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[CommandFuture], None]] = []

    def _set(self, outcomes: list[EntryOutcome]) -> None:
        self._outcomes = outcomes
        self._finish()

    def _fail(self, error: BaseException) -> None:
        self._error = error
        self._finish()

    def _finish(self) -> None:
        release, self._release = self._release, None
        if release is not None:
            release()
        with self._lock:
            self._done.set()
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback(self)

    def add_done_callback(self, callback: Callable[[CommandFuture], None]) -> None:
        """Call `callback(self)` once the future is done: on the thread that completes it
        (the runtime's loop, so it must be quick and must not raise), or at once if done.
        An event loop waits on a commit this way without a thread of its own."""
        with self._lock:
            if not self._done.is_set():
                self._callbacks.append(callback)
                return
        callback(self)

    def done(self) -> bool:
        return self._done.is_set()

    def result(self, timeout_s: float | None = None) -> list[EntryOutcome]:
        if not self._done.wait(timeout_s):
            raise TimeoutError("the command was not committed in time")
        if self._error is not None:
            raise RuntimeHalted(str(self._error)) from self._error
        return self._outcomes


# A unit taken into a tick: its future, and where its records start among the tick's items.
Waiter = tuple[CommandFuture, int]


class _InFlight:
    """Which timer keys have a command in flight (the intake's lock guards it)."""

    def __init__(self) -> None:
        self.units = 0  # units put so far: the number of the last one
        self.floor = 0  # every unit numbered at or below it has been answered
        self.latest: dict[str, int] = {}  # timer key -> the last unit holding a command for it
        self.other_latest = 0  # the last unit holding a record that is not a client command
        self._open: deque[int] = deque()  # unanswered units, in the order they were put
        self._prune_at = _PRUNE_AT

    def put(self, keys: list[str], other: bool) -> int:
        self.units += 1
        unit = self.units
        latest = self.latest
        for key in keys:
            latest[key] = unit
        if other:
            self.other_latest = unit
        self._open.append(unit)
        if len(self.latest) > self._prune_at:
            floor = self.floor
            self.latest = {k: u for k, u in self.latest.items() if u > floor}
            self._prune_at = max(_PRUNE_AT, 2 * len(self.latest))
        return unit

    def answered(self, unit: int) -> None:
        # Units are answered in the order they were taken, so the search ends at the first
        # open unit; one answered out of order leaves the floor below the older ones.
        self._open.remove(unit)
        self.floor = self._open[0] - 1 if self._open else self.units

    def holds(self, keys: Sequence[str]) -> bool:
        floor = self.floor
        if self.other_latest > floor:
            return True
        latest = self.latest
        return any(latest.get(key, 0) > floor for key in keys)


class Intake:
    def __init__(self, max_queued: int, wake: Callable[[], None]) -> None:
        self._max_queued = max_queued
        self._wake = wake
        self._queue: deque[tuple[list[Appendable], CommandFuture]] = deque()
        self._lock = threading.Lock()
        self._queued = 0  # records, not units
        self._in_flight = _InFlight()

    def __bool__(self) -> bool:
        """Whether commands are waiting."""
        return bool(self._queue)

    def put(self, items: Sequence[Appendable]) -> CommandFuture:
        keys, other = _keys(items)
        unit = list(items)
        with self._lock:
            if self._queued + len(unit) > self._max_queued:
                raise Overloaded("intake queue full")
            number = self._in_flight.put(keys, other)
            future = CommandFuture(len(unit), partial(self._answered, number))
            self._queue.append((unit, future))
            self._queued += len(unit)
        self._wake()
        return future

    def _answered(self, unit: int) -> None:
        with self._lock:
            self._in_flight.answered(unit)

    def in_flight(self, timer_keys: Sequence[str]) -> bool:
        """Whether a command for one of `timer_keys` (of any tenant or queue), or a record
        that is not a client command, was put and its future is not done yet: queued, or
        in a commit that has not completed. A command put before this call and not counted
        here has completed, so its commit is visible to every read of the store that begins
        afterwards."""
        with self._lock:
            return self._in_flight.holds(timer_keys)

    def take(self, items: list[Appendable], waiters: list[Waiter], limit: int) -> None:
        """Move whole units onto `items` while it holds fewer than `limit` records."""
        with self._lock:
            while self._queue and len(items) < limit:
                unit, future = self._queue.popleft()
                self._queued -= len(unit)
                waiters.append((future, len(items)))
                items.extend(unit)

    def fail_all(self, error: BaseException) -> None:
        """Empty the queue, failing every future in it."""
        with self._lock:
            pending = list(self._queue)
            self._queue.clear()
            self._queued = 0
        for _items, future in pending:
            future._fail(error)


def _keys(items: Sequence[Appendable]) -> tuple[list[str], bool]:
    """The timer keys of the unit's client commands, and whether it holds anything else."""
    keys: list[str] = []
    other = False
    for record, _payload in items:
        kind = type(record)
        if kind in _COMMANDS:
            keys.append(record.timer_key)  # type: ignore[union-attr]
        elif kind is CommandBatch:
            keys.extend(c.timer_key for c in record.items)  # type: ignore[union-attr]
        else:
            other = True
    return keys, other
