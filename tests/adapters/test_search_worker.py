"""A destination's evidence reader answers every search, whatever a search raises.

Rule (adapters/search.py): a search that fails ends incomplete, carrying its error, and
proves nothing; the reader's thread goes on with the next search. A search left
unanswered would leave its attempts PUBLISHING for ever: the Kafka suite once saw the
reader's thread die of a `TimeoutError` from an admin call after a broker restart, and 46
timers never settle.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from nereus.adapters.kafka.evidence import EvidenceReader
from nereus.adapters.search import BackgroundSearch, SearchWorker
from nereus.runtime.destination import Lookup, SearchOutcome
from nereus.runtime.log import Logger

WAIT_S = 10.0


class Scripted(SearchWorker):
    """Each search runs the next step of a script: raise what it holds, or answer."""

    failures = (ValueError,)

    def __init__(self, steps: list[Callable[[], SearchOutcome]]) -> None:
        super().__init__("scripted", Logger())
        self._steps = steps

    def run_search(self, handle: BackgroundSearch) -> SearchOutcome:
        return self._steps.pop(0)()


def _raise(exc: BaseException) -> Callable[[], SearchOutcome]:
    def step() -> SearchOutcome:
        raise exc

    return step


def _search(worker: SearchWorker) -> SearchOutcome:
    woken = threading.Event()
    handle = worker.search([Lookup("a.1.1", "t", 0)], woken.set)
    assert woken.wait(WAIT_S), "a search was never answered"
    assert handle.done()
    return handle.outcome()


@pytest.mark.parametrize(
    "exc",
    [TimeoutError(), ValueError("foreseen"), ZeroDivisionError("a bug"), KeyError("k")],
    ids=["timeout", "foreseen", "bug", "key"],
)
def test_a_search_that_raises_is_answered_incomplete_and_the_next_one_runs(
    exc: Exception,
) -> None:
    found = SearchOutcome({}, complete=True)
    worker = Scripted([_raise(exc), lambda: found])
    try:
        failed = _search(worker)
        assert not failed.complete
        assert failed.proof_for("any-fence", "a.1.1") is None
        assert failed.error
        assert _search(worker) == found  # the thread lived on
    finally:
        assert worker.close()


def test_the_kafka_reader_takes_an_admin_timeout_for_a_foreseen_failure() -> None:
    assert issubclass(TimeoutError, EvidenceReader.failures)
