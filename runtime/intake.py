"""The intake: client commands waiting for the shard's next commit, and their futures.

Theory of operation: `put` (from any thread) queues a unit of records with the
`CommandFuture` that answers it and wakes the loop. A tick takes whole units, up to
`max_commands_per_tick` records, into its one commit; afterwards each future completes with
one `EntryOutcome` per record of its unit, in order. The queue is bounded
(`max_queued_commands`): past the bound `put` raises `Overloaded` and queues nothing. When
the runtime halts or lets the shard go, every future still queued fails, so no caller waits
for a commit that will never come.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Sequence

from nereus.kernel.effects import EntryOutcome
from nereus.runtime.errors import Overloaded, RuntimeHalted
from nereus.storage.store import Appendable


class CommandFuture:
    """Completes with one EntryOutcome per submitted record, in order, after the batch is
    durably committed."""

    def __init__(self, count: int) -> None:
        self.count = count
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


class Intake:
    def __init__(self, max_queued: int, wake: Callable[[], None]) -> None:
        self._max_queued = max_queued
        self._wake = wake
        self._queue: deque[tuple[list[Appendable], CommandFuture]] = deque()
        self._lock = threading.Lock()
        self._queued = 0  # records, not units

    def __bool__(self) -> bool:
        """Whether commands are waiting."""
        return bool(self._queue)

    def put(self, items: Sequence[Appendable]) -> CommandFuture:
        future = CommandFuture(len(items))
        with self._lock:
            if self._queued + len(items) > self._max_queued:
                raise Overloaded("intake queue full")
            self._queue.append((list(items), future))
            self._queued += len(items)
        self._wake()
        return future

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
