"""Dead letters on the console over real HTTP: a timer whose every send the destination
refuses for good spends its attempts and is dead-lettered; its queue's page and the queues page list
it for its tenant, first as owed and then with its copy's place, and never for another tenant
with a queue of the same name. tests/service/test_console_reads.py checks the read itself."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from nereus.adapters.local.destination import LocalDestination
from nereus.kernel.records import NotPublished
from nereus.runtime.destination import Send, SendResult
from tests.support.console_client import Visitor
from tests.support.http_harness import Service, config, schedule, start_service

REFUSED_QUEUE = "refused"


class RefusingDestination(LocalDestination):
    """Refuses every send to the refused queue for good (not its dead-letter copies)."""

    def _submit(self, sends: Sequence[Send], now_ms: int) -> None:
        refused = [s for s in sends if s.prepared.topic.endswith(REFUSED_QUEUE)]
        kept = [s for s in sends if not s.prepared.topic.endswith(REFUSED_QUEUE)]
        if kept:
            super()._submit(kept, now_ms)
        for send in refused:
            result = NotPublished("permanent", "broker_refused", "refused by the test")
            self._results.append(SendResult.of(send, result))


@pytest.fixture
def svc(tmp_path: Path) -> Iterator[Service]:
    data = tmp_path / "data"
    with start_service(data, config(), destination=RefusingDestination(str(data / "dest"))) as s:
        yield s


def _until(what: str, done: Callable[[], bool], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _visitor(svc: Service, token: str) -> Visitor:
    v = Visitor(svc.server.port)
    assert v.login(token).status == 303
    return v


def test_a_dead_letter_is_listed_for_its_tenant_only(svc: Service) -> None:
    svc.post(schedule("doomed", delay_ms=1, queue=REFUSED_QUEUE))
    acme, globex = _visitor(svc, "acme-all"), _visitor(svc, "globex-all")
    # globex's queue of the same name, with a live timer: its page exists and lists it.
    svc.post(schedule("other", delay_ms=3_600_000, queue=REFUSED_QUEUE), token="globex-all")
    page = f"/console/queues/{REFUSED_QUEUE}"

    def copied() -> bool:
        text = acme.get(page).text
        return "doomed" in text and ".dlq[" in text

    # Each permanent refusal spends one of five attempts (backoffs 0.25 to 2 s between
    # them); the last dead-letters the generation, and its copy follows.
    _until("the dead letter's copy on acme's queue page", copied)
    text = acme.get(page).text
    section = text[text.index("Dead letters of") :]
    assert "broker_refused" in section and "doomed" in section
    queues = acme.get("/console/queues").text
    assert "doomed" in queues[queues.index("<h2>Dead letters") :]
    for path in (page, "/console/queues"):
        seen = globex.get(path).text
        assert "doomed" not in seen and ".dlq[" not in seen, path
    assert "other" in globex.get(page).text
