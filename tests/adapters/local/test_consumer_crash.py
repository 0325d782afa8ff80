"""An embedded program killed (SIGKILL) while it receives its timers loses none of them.

Thousands of timers are scheduled on one shard; then a worker process
(`tests/support/consumer_worker.py`) opens it, fires them and consumes them with the handler form
of `Nereus.consumer`, writing each handled record to a log of its own before the handler
returns. The worker is killed several times: at a trap (its handler has written the record
and waits, so the kill falls between handling and commit) and at random points of its work
(after a random number of records handled, plus a few random milliseconds); a last one runs
to the end. Then:

* every record of the queue was handled, and every timer scheduled reached the handler;
* each run handled a consecutive run of offsets: nothing was skipped inside a run;
* each run started where the group's position was left: at or before the trapped record
  after a trap (it was handled, not committed, so it is delivered again), at or before the
  record after the last one handled after a random kill, and never more than one batch
  (`max_batch`, the records committed in one write) before either, nor before the start
  of the previous run;
* the group's position ends at the queue's end.

`NEREUS_CONSUMER_CRASH_RECORDS` (default 3000; at least 2,500, as six kills may each take
the consumer up to 400 records further) and `NEREUS_CONSUMER_CRASH_SEED` (a fixed default;
`random` draws one and the failure names it) size and replay a run.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from nereus import Nereus
from nereus.adapters.local.consumer import DEFAULT_MAX_BATCH
from nereus.adapters.local.destination import LocalDestination
from nereus.service.arguments import schedule_record
from tests.support.worker_process import wait_ready

ROOT = Path(__file__).resolve().parents[3]
RECORDS = int(os.environ.get("NEREUS_CONSUMER_CRASH_RECORDS", "3000"))
_SEED = os.environ.get("NEREUS_CONSUMER_CRASH_SEED", "20261202")
SEED = random.randrange(2**32) if _SEED == "random" else int(_SEED)
PLAN = ["trap", "random", "trap", "random", "trap", "random"]


def _schedule_all(data: Path) -> set[str]:
    mids: set[str] = set()
    with Nereus.open(str(data), assume_clock_error_ms=5) as n:
        for first in range(0, RECORDS, 500):
            items = [
                schedule_record("q", f"k{i}", f"p{i}".encode(), delay_ms=i % 2000)
                for i in range(first, min(first + 500, RECORDS))
            ]
            outcomes = n.service.execute(items, 30)
            assert all(o.code == "scheduled" for o in outcomes)
            mids.update(o.message_id for o in outcomes if o.message_id is not None)
    return mids


def _worker(data: Path, log: Path, run: int, trap: int | None) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "tests.support.consumer_worker", str(data), str(log), str(run)]
    if trap is not None:
        argv.append(str(trap))
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    wait_ready(proc, f"run {run} (seed {SEED})", 120)
    return proc


def _kill(proc: subprocess.Popen[bytes]) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(30)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    proc.stderr.close()


def _wait_for_progress(proc: subprocess.Popen[bytes], log: Path, lines: int, where: str) -> None:
    """Until the log holds `lines` handled records: a random kill lands while the consumer
    is at work, never after it has handled the whole queue (which would leave the later
    runs nothing to be killed in)."""
    deadline = time.monotonic() + 120
    while len(_handled(log)) < lines:
        assert proc.poll() is None, f"the worker ended before its kill {where}"
        assert time.monotonic() < deadline, f"no progress to {lines} handled records {where}"
        time.sleep(0.002)


def _handled(log: Path) -> list[tuple[int, int, str]]:
    text = log.read_text() if log.exists() else ""
    # A read racing the worker's append can see a line cut at a page boundary: only lines
    # the newline has closed count.
    lines = text[: text.rfind("\n") + 1].splitlines()
    return [(int(run), int(offset), mid) for run, offset, mid in (ln.split() for ln in lines)]


def test_a_killed_consumer_redelivers_and_skips_nothing(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    where = f"(seed {SEED}, {RECORDS} records)"
    data, log = tmp_path / "data", tmp_path / "handled.log"
    scheduled = _schedule_all(data)
    traps: dict[int, int] = {}  # run -> the offset it was killed at, after handling it
    for run, how in enumerate(PLAN):
        done = _handled(log)
        last = max((offset for _, offset, _ in done), default=-1)
        trap = min(last + rng.randint(50, 400), RECORDS - 1) if how == "trap" else None
        proc = _worker(data, log, run, trap)
        if trap is not None:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            assert line.strip() == b"trap", f"run {run} ended before its trap {where}"
            traps[run] = trap
        else:
            _wait_for_progress(proc, log, len(done) + rng.randint(20, 400), where)
            time.sleep(rng.uniform(0, 0.005))
        _kill(proc)
    final = len(PLAN)
    proc = _worker(data, log, final, None)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, f"the last run failed {where}: {err.decode()[-2000:]}"

    handled = _handled(log)
    dest = LocalDestination(str(data / "destination"))
    try:
        end = dest.end_offset("q")
        committed = dest.committed("app", "q")
    finally:
        dest.close()
    assert end == RECORDS, f"the destination holds {end} records {where}"
    assert committed == end, f"the group's position is {committed}, not {end} {where}"
    assert {offset for _, offset, _ in handled} == set(range(end)), f"a record was skipped {where}"
    assert {mid for _, _, mid in handled} == scheduled, f"a timer never reached the handler {where}"

    by_run: dict[int, list[int]] = {}
    for run, offset, _ in handled:
        by_run.setdefault(run, []).append(offset)
    previous_first, previous_last = 0, -1
    for run in range(final + 1):
        offsets = by_run.get(run, [])
        if not offsets:
            continue
        first = offsets[0]
        assert offsets == list(range(first, first + len(offsets))), (
            f"run {run} skipped inside its run {where}"
        )
        # The first record the previous run did not finish: its trap, or the one after its last.
        unfinished = traps[run - 1] if run - 1 in traps else previous_last + 1
        assert previous_first <= first <= unfinished, (
            f"run {run} started at {first}; the previous run started at {previous_first} "
            f"and did not finish {unfinished} {where}"
        )
        assert unfinished - first <= DEFAULT_MAX_BATCH, (
            f"run {run} was handed out more than one batch again {where}"
        )
        previous_first, previous_last = first, offsets[-1]
    redelivered = len(handled) - end
    assert redelivered >= len(traps), f"{redelivered} redeliveries for {len(traps)} traps {where}"
