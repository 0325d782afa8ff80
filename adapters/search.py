"""The thread that runs a destination's evidence searches: shared by the Kafka and the Pulsar
edges, each of which reads its own broker in `run_search`.

The runtime asks for a search and polls its handle; it never waits on one. A worker runs its
searches one at a time on a thread of its own, so the shard loop keeps folding commands and
firing other due work while a destination's partitions are read.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Sequence

from nereus.runtime.destination import Lookup, SearchOutcome
from nereus.runtime.log import Logger


class BackgroundSearch:
    """A search handle that a destination's own reader thread completes (`finish`)."""

    def __init__(self, lookups: Sequence[Lookup], wake: Callable[[], None]) -> None:
        self.lookups = list(lookups)
        self._wake = wake
        self._done = threading.Event()
        self.cancelled = threading.Event()
        self._outcome: SearchOutcome | None = None

    def done(self) -> bool:
        return self._done.is_set()

    def outcome(self) -> SearchOutcome:
        assert self._outcome is not None, "outcome() before done()"
        return self._outcome

    def cancel(self) -> None:
        self.cancelled.set()

    def wait(self, timeout_s: float) -> bool:
        return self._done.wait(timeout_s)

    def finish(self, outcome: SearchOutcome) -> None:
        self._outcome = outcome
        self._done.set()
        self._wake()


class SearchWorker:
    """The base of a destination's evidence reader: runs its searches one at a time on a
    thread of its own, started by the first search, so the shard loop only polls their
    handles (`wake` tells it one is done). A subclass does one search in `run_search`,
    watching `stopping` and the handle's `cancelled`; what that raises of `failures` ends
    the search incomplete with the error (logged as `failure_event`), and the worker goes
    on with the next. Any other exception does the same, logged as an error."""

    failures: tuple[type[Exception], ...] = ()
    failure_event = "search_failed"

    def __init__(self, name: str, log: Logger) -> None:
        self.name = name
        self.log = log
        self.stopping = threading.Event()
        self._queue: queue.Queue[BackgroundSearch] = queue.Queue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def run_search(self, handle: BackgroundSearch) -> SearchOutcome:
        raise NotImplementedError

    @staticmethod
    def since_by_topic(lookups: Sequence[Lookup]) -> dict[str, int]:
        """The earliest admission time of each topic's lookups: where its read starts."""
        since: dict[str, int] = {}
        for lk in lookups:
            since[lk.topic] = min(since.get(lk.topic, lk.since_ms), lk.since_ms)
        return since

    def log_done(
        self, event: str, started: float, *, lookups: int, found: int, complete: bool, **more: int
    ) -> None:
        """One line per search: what it looked for, what it read, how long (from `started`,
        a `time.monotonic()` reading)."""
        took_ms = int((time.monotonic() - started) * 1000)
        self.log.info(
            event, lookups=lookups, found=found, complete=complete, took_ms=took_ms, **more
        )

    def search(self, lookups: Sequence[Lookup], wake: Callable[[], None]) -> BackgroundSearch:
        handle = BackgroundSearch(lookups, wake)
        with self._lock:
            if self.stopping.is_set():
                handle.finish(SearchOutcome({}, complete=False, error="destination closed"))
                return handle
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._serve, name=f"{self.name}-evidence", daemon=True
                )
                self._thread.start()
        self._queue.put(handle)
        return handle

    def _serve(self) -> None:
        while not self.stopping.is_set():
            try:
                handle = self._queue.get(timeout=0.2)
            except queue.Empty:
                continue
            try:
                outcome = self.run_search(handle)
            except self.failures as exc:
                self.log.warning(self.failure_event, error=str(exc))
                outcome = SearchOutcome({}, complete=False, error=str(exc))
            except Exception as exc:
                # Anything else is a bug or a client error nobody foresaw (a broker call
                # that timed out). Ending the search incomplete is always safe (it proves
                # nothing), and the thread must live on: a dead one would leave this
                # search and every later one unanswered, their attempts open for ever.
                error = f"{type(exc).__name__}: {exc}"
                self.log.error(self.failure_event, error=error, unexpected=True)
                outcome = SearchOutcome({}, complete=False, error=error)
            handle.finish(outcome)
        while not self._queue.empty():
            self._queue.get_nowait().finish(
                SearchOutcome({}, complete=False, error="destination closed")
            )

    def close(self, timeout_s: float = 5.0) -> bool:
        """Stop taking searches; True once the thread is gone (or never ran), so what the
        searches used may be closed."""
        with self._lock:
            self.stopping.set()
            thread = self._thread
        if thread is None:
            return True
        thread.join(timeout_s)
        return not thread.is_alive()
