"""kill -9 of the embedded service with hundreds of attempts in flight, and a restart.

A worker (`tests/support/proof_worker.py`) schedules `NEREUS_LOCAL_PROOF_TIMERS` timers (default
600) due together; its local destination writes half of the first batch of admitted
attempts and hangs inside the send, and the test SIGKILLs it there. Then the test opens the
same data directory itself (the dead worker's locks went with it) and runs until every timer
is delivered. The restarted destination holds the directory's lock, so its recovery search
is fenced (`specs/README.md`, absence): each attempt written before the kill is PUBLISHED
with its record as evidence, each one never written is NOT_PUBLISHED `absent_after_fence`
with the proof and is delivered by an ordinary retry. Counted: 0 UNKNOWN, 0 duplicates,
0 early, 0 lost.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from nereus.adapters.local.destination import LocalDestination
from nereus.adapters.local.embedded import Nereus
from nereus.kernel.model import Attempt, AttemptStatus, Message, Status, Table
from nereus.kernel.records import NotPublished, Published, PublishOutcome, Unknown
from tests.support.builders import records
from tests.support.proof_worker import QUEUES
from tests.support.runtime_harness import env_int

ROOT = Path(__file__).resolve().parents[3]
TIMERS = env_int("NEREUS_LOCAL_PROOF_TIMERS", 600)
WAIT_S = 120.0


def _kill_in_flight(data: Path) -> tuple[list[str], list[str]]:
    """Run the worker until it hangs inside its first send; SIGKILL it there. Returns the
    attempt ids it wrote and those it never wrote."""
    worker = subprocess.Popen(
        [sys.executable, "-m", "tests.support.proof_worker", str(data), str(TIMERS)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
    )
    try:
        assert worker.stdout is not None
        line = worker.stdout.readline()
        assert line, "the worker died before its first send"
        said = json.loads(line)
    finally:
        worker.kill()
        worker.wait(WAIT_S)
    return said["written"], said["unwritten"]


def test_a_killed_service_proves_its_unwritten_attempts_absent_and_delivers_each_once(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    written, unwritten = _kill_in_flight(data)
    in_flight = len(written) + len(unwritten)
    assert len(written) >= 1 and len(unwritten) >= 1
    assert in_flight >= min(TIMERS, 400), f"only {in_flight} attempts in flight at the kill"

    nereus = Nereus.open(str(data), assume_clock_error_ms=5)
    destination = nereus.destination
    assert isinstance(destination, LocalDestination)
    fence_id = destination.fence_id
    assert fence_id is not None
    nereus.start()
    deadline = time.monotonic() + WAIT_S
    while True:
        with nereus.store.read() as view:
            messages = [m for _, m in view.items(Table.MESSAGES) if isinstance(m, Message)]
            attempts = {
                a.attempt_id: a for _, a in view.items(Table.ATTEMPTS) if isinstance(a, Attempt)
            }
            open_obligations = sum(1 for _ in view.items(Table.OBLIGATIONS))
        finished = all(m.status is Status.DELIVERED for m in messages)
        if len(messages) == TIMERS and finished and open_obligations == 0:
            break
        assert time.monotonic() < deadline, Counter(m.status for m in messages)
        time.sleep(0.05)
    log = records(nereus.store.iter_log())
    delivered = [r for queue in QUEUES for r in destination.iter_all(queue)]
    nereus.close()

    outcomes: dict[str, list[PublishOutcome]] = {}
    for r in log:
        if isinstance(r, PublishOutcome):
            outcomes.setdefault(r.attempt_id, []).append(r)
    unknown = sum(1 for rs in outcomes.values() for r in rs if isinstance(r.result, Unknown))
    per_message = Counter(r.message_id for r in delivered)
    duplicates = sum(n - 1 for n in per_message.values() if n > 1)
    early = sum(1 for r in delivered if r.delivered_at_ms < r.deliver_at_ms)
    lost = TIMERS - len(per_message)
    figures = {
        "timers": TIMERS,
        "in_flight": in_flight,
        "written": len(written),
        "unwritten": len(unwritten),
        "unknown": unknown,
        "duplicates": duplicates,
        "early": early,
        "lost": lost,
    }
    print(json.dumps(figures))
    assert (unknown, duplicates, early, lost) == (0, 0, 0, 0), figures

    by_attempt = {r.attempt_id: r for r in delivered}
    for aid in written:
        (outcome,) = outcomes[aid]
        assert isinstance(outcome.result, Published), outcome
        record = by_attempt[aid]
        assert outcome.result.evidence.offset == record.offset
        assert attempts[aid].status is AttemptStatus.PUBLISHED
    for aid in unwritten:
        (outcome,) = outcomes[aid]
        result = outcome.result
        assert isinstance(result, NotPublished), outcome
        assert result.error_code == "absent_after_fence"
        assert result.proof is not None and result.proof.fence_id == fence_id
        assert attempts[aid].fence_id == fence_id
        assert aid not in by_attempt
    # Each unwritten attempt's timer was delivered once more, by a new attempt.
    retried = {attempts[aid].message_id for aid in unwritten}
    assert all(per_message[mid] == 1 for mid in retried)
