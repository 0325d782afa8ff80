"""Consumers of the local destination waiting for records: who wakes them, and how.

Theory of operation: a consumer waits in `wait_for` until its topic holds a record at the
offset it wants. When this process is the directory's writer (`writer`, set once a runtime
sends through the destination), every record is written here and each committed batch calls
`wake`, which notifies a condition: the wait sleeps on it. Otherwise the records come from
another process, which cannot signal a condition here; the wait makes itself a FIFO the
writer pokes after each commit (`adapters.local.wake`), or, where no FIFO can be made,
looks every `UNWAKEABLE_POLL_S`. Either way the topic's end is read under the condition's
lock, which `close` holds while it closes the environment, so no wait reads a closed one.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Protocol

from nereus.adapters.local.wake import UNWAKEABLE_POLL_S, Waker


class Topics(Protocol):
    def end_offset(self, topic: str) -> int:
        """The offset the next record of `topic` gets (0 for a topic never written)."""
        ...


class Arrivals:
    def __init__(self, path: str, topics: Topics) -> None:
        self.path = path
        # Whose topics: each look reads `topics.end_offset`, under this object's lock.
        self._topics = topics
        # Notified after every committed batch of sends, for consumers waiting in `wait_for`.
        self._arrived = threading.Condition()
        # True once a runtime sends through this destination: then every record of the
        # directory is written by this process and wakes its consumers itself.
        self.writer = False
        # The FIFOs of this instance's waits on another process's sends (`wake` pokes them).
        self._wakers: set[Waker] = set()
        self._closed = False

    def wake(self) -> None:
        """Wake every consumer of this instance waiting in `wait_for` (new records, or a
        consumer closing)."""
        with self._arrived:
            self._arrived.notify_all()
            for waker in self._wakers:
                waker.wake()

    def wait_for(
        self, topic: str, offset: int, timeout_s: float | None, stop: Callable[[], bool]
    ) -> bool:
        """Block until `topic` holds a record at `offset` (True), `timeout_s` passed or
        `stop()` says so (False). Sends of this process wake the wait through a condition;
        a process that does not write here waits on a FIFO the writer's sends wake
        (`adapters.local.wake`)."""
        if self.writer:
            return self._wait_here(topic, offset, timeout_s, stop)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        try:
            waker = Waker(self.path)
        except OSError:
            # No FIFO here (a reader without write permission on the directory, a file
            # system without FIFOs): look every UNWAKEABLE_POLL_S instead.
            return self._wait_here(topic, offset, timeout_s, stop, UNWAKEABLE_POLL_S)
        with self._arrived:
            self._wakers.add(waker)
        try:
            while True:
                waker.drain()
                with self._arrived:
                    # `close` takes this lock too: the environment is open while it is held.
                    if stop() or self._closed:
                        return False
                    if self._topics.end_offset(topic) > offset:
                        return True
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                waker.wait(left)
        finally:
            with self._arrived:
                self._wakers.discard(waker)
            waker.close()

    def _wait_here(
        self,
        topic: str,
        offset: int,
        timeout_s: float | None,
        stop: Callable[[], bool],
        poll_s: float | None = None,
    ) -> bool:
        """Wait on the condition this process's sends notify (and look every `poll_s`)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._arrived:
            while True:
                # `close` takes this lock too: the environment is open while it is held.
                if stop() or self._closed:
                    return False
                if self._topics.end_offset(topic) > offset:
                    return True
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                if poll_s is not None:
                    left = poll_s if left is None else min(left, poll_s)
                self._arrived.wait(left)

    def close(self, close_env: Callable[[], None]) -> None:
        """Wake every wait to see the destination closed, and close its environment (by
        `close_env`) while no wait can be reading it."""
        with self._arrived:
            self._closed = True
            self._arrived.notify_all()
            for waker in self._wakers:
                waker.wake()
            close_env()
