"""The operator console's pages with a million live timers in the store: render time per
page beside the raw reads of the same data, same run.

Theory of operation: the issue asks for every console page in at most 200 ms with 1M live
timers in the store. The store is written by `bench.preload` (its rows checked against real
commits first), due a day after the bench starts so nothing fires, spread over `QUEUES`
queues: more queues than the queues page shows (100) each holding more timers than a count
goes to (1,000), so that page does the most its bounds allow. The embedded library then
opens it with its runtime running, and gives the pages something to show through ordinary
commands: a timer with a longer story than a page holds (`STORY_COMMANDS` commands, then
delivered), a few hundred timers delivered in the big queue, and more open obligations
than a page holds, in two waves (a destination that never answers one queue's sends leaves
their attempts PUBLISHING).

Each page is asked through `TimerApi.respond` in process, as the server would ask it, with
authentication off (the default tenant, every grant), the session cookie the first answer
set and a chosen time zone (each time is then drawn twice). The pages take turns, one
render each per round, so the machine's drift touches them alike; the first rounds are a
warm-up. Each page's raw baseline is the service reads it makes (`service.inspect`,
`list_timers`, `tenant_usage`), timed in the same rounds without routing, session or
template; the reference reads are a peek of one timer and a page of 50 timers. Percentiles
are nearest-rank over the measured renders (`bench.common.pct`). An answer other than 200 is
counted and shown with the API's logged traceback, not timed, and fails its page.

Three conditions, each judged alone: `calm` (the store as built); `audit`, while the
console's own audit (`replay --verify` of the shard in a child process of this one, started
as its button would) runs, for as long as it runs; `burst`, after `--burst` timers of one queue
came due at one instant and were delivered, so that the publications the queue pages look
for among the newest log entries are as many as a round hour's reminders leave.

    .venv/bin/python -m bench.console [--timers 1000000] [--renders 200] [--burst 50000]
        [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from bench import preload
from bench.common import PAYLOAD, Progress, git_revision, pct, say, scratch, write_json
from nereus.adapters.local.destination import LocalDestination
from nereus.adapters.local.embedded import Nereus
from nereus.adapters.tenant_topics import local_topic
from nereus.kernel.keys import DEFAULT_TENANT, message_id
from nereus.kernel.records import Published, PublishOutcome, members
from nereus.runtime.destination import Send
from nereus.service.arguments import reschedule_record, schedule_record
from nereus.service.inspect import RECENT_WINDOW_ENTRIES, RECENT_WINDOW_RECORDS
from nereus.storage import inspect as reads
from nereus.storage.schema import StoreOptions

if TYPE_CHECKING:
    from nereus.adapters.http.api import TimerApi

TARGET_MS = 200.0
TENANT = DEFAULT_TENANT  # the tenant every viewer is when authentication is off
QUEUES = 128  # past the queues page (100), each past the count cap (1,000) at 1M
BIG, QUIET, HELD = "q0", "q1", "held"
STORY_KEY = "story"
STORY_TXN = "story-last"
STORY_COMMANDS = 250  # more than a story page shows (service.story.STORY_MARKS, 200)
DELIVERED = 300
HELD_TIMERS = 250  # more than the obligations page shows (200)
BURST = "burst"
HOUR_MS = 3_600_000
AUDIT_WAIT_S = 1800.0
ZONE = "America/New_York"
WAIT_S = 120.0
PHASES = {
    "calm": "a few hundred deliveries",
    "audit": "while the console's audit runs",
    "burst": "after a burst of deliveries",
}


class HoldingDestination(LocalDestination):
    """The local destination, except that the sends of one topic are never answered: their
    attempts stay PUBLISHING, the open obligations the console lists."""

    def __init__(self, path: str, held_topic: str) -> None:
        super().__init__(path)
        self.held_topic = held_topic

    def _submit(self, sends: Sequence[Send], now_ms: int) -> None:
        super()._submit([s for s in sends if s.prepared.topic != self.held_topic], now_ms)


@contextmanager
def _preload_layout(tenant: str, queues: int) -> Iterator[None]:
    """`bench.preload` writes tenant `t` over 16 queues; the console reads the viewer's
    tenant. Its functions read these two names at call time, and its check against real
    commits runs under the same names, so the rows stay the product's."""
    saved = preload.TENANT, preload.QUEUES
    preload.TENANT, preload.QUEUES = tenant, queues
    try:
        yield
    finally:
        preload.TENANT, preload.QUEUES = saved


def build(root: str, timers: int) -> Nereus:
    progress = Progress(f"console: preload {timers:,} timers (4 passes)", 4 * timers)
    started = time.perf_counter()
    with _preload_layout(TENANT, QUEUES):
        # Scheduled now, due in a day: nothing fires while the pages are asked.
        now_ms = int(time.time() * 1000)
        path = os.path.join(root, "shard")
        preload.lmdb_store(path, timers, t0_ms=now_ms, on_progress=progress.update)
    progress.update(4 * timers)
    say(f"console: preloaded in {time.perf_counter() - started:.0f} s; opening")
    destination = HoldingDestination(os.path.join(root, "destination"), local_topic(TENANT, HELD))
    nereus = Nereus.open(
        root,
        destination=destination,
        assume_clock_error_ms=1.0,
        # O(state) at open, and the preload's rows were checked against real commits.
        store_options=StoreOptions(check_invariants_on_open=False),
    )
    nereus.start()
    return nereus


def _execute(nereus: Nereus, items: list[Any], expect: str) -> None:
    for outcome in nereus.service.execute(items, WAIT_S):
        if str(outcome.code) != expect:
            raise RuntimeError(f"console: a command answered {outcome.code}, not {expect}")


def give_stories(nereus: Nereus) -> dict[str, int]:
    """Commands whose traces the pages show: a long story, deliveries, open obligations."""
    say("console: a long story, deliveries and open obligations")
    _execute(nereus, [schedule_record(BIG, STORY_KEY, PAYLOAD, delay_ms=HOUR_MS)], "scheduled")
    for i in range(STORY_COMMANDS - 2):
        # Each its own log entry, as an operator's or a client's reschedules would be.
        item = reschedule_record(BIG, STORY_KEY, delay_ms=HOUR_MS + i)
        _execute(nereus, [item], "rescheduled")
    last = reschedule_record(BIG, STORY_KEY, delay_ms=200, txn=STORY_TXN)
    _execute(nereus, [last], "rescheduled")
    fired = [
        schedule_record(BIG, f"delivered-{i}", PAYLOAD, delay_ms=300) for i in range(DELIVERED)
    ]
    _execute(nereus, fired, "scheduled")
    half = HELD_TIMERS // 2
    for keys in (range(half), range(half, HELD_TIMERS)):
        items = [schedule_record(HELD, f"held-{i}", PAYLOAD, delay_ms=100) for i in keys]
        _execute(nereus, items, "scheduled")
        _until(
            f"{keys.stop} held attempts", _at_least(lambda: _open_obligations(nereus), keys.stop)
        )
        time.sleep(1.0)  # the second wave is a second younger
    _until("the deliveries", _at_least(lambda: _shard(nereus).delivered, DELIVERED + 1))
    return _counts(nereus)


def give_burst(nereus: Nereus, count: int) -> dict[str, Any]:
    """`count` timers of one queue due at one instant, delivered: what a store looks like
    after a round hour's reminders went out."""
    say(f"console: a burst of {count:,} deliveries")
    before = _counts(nereus)
    # Late enough that every schedule is in before it comes due (~15,000 schedules/s).
    due_ms = int(time.time() * 1000) + 2_000 + count // 5
    for start in range(0, count, 1000):
        items = [
            schedule_record(BURST, f"burst-{i}", PAYLOAD, deliver_at_ms=due_ms)
            for i in range(start, min(start + 1000, count))
        ]
        _execute(nereus, items, "scheduled")
    target = before["delivered"] + count
    _until("the burst", _at_least(lambda: _shard(nereus).delivered, target), WAIT_S + count / 500)
    took_s = time.time() - due_ms / 1000
    with nereus.store.read() as view:
        entries = list(reads.newest_entries(view, RECENT_WINDOW_ENTRIES, RECENT_WINDOW_RECORDS))
    published = sum(
        isinstance(r, PublishOutcome) and isinstance(r.result, Published)
        for e in entries
        for r in members(e.record)
    )
    return {
        "timers": count,
        "delivered_in_s": round(took_s, 1),
        "log_entries_added": _counts(nereus)["log_position"] - before["log_position"],
        "recent_window_entries": len(entries),
        "publications_in_recent_window": published,
    }


def _counts(nereus: Nereus) -> dict[str, int]:
    shard = _shard(nereus)
    return {
        "live_timers": shard.live_timers,
        "delivered": shard.delivered,
        "open_obligations": shard.open_obligations,
        "log_position": shard.log_position,
    }


def _until(what: str, done: Callable[[], bool], timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            raise RuntimeError(f"console: timed out waiting for {what}")
        time.sleep(0.05)


def _at_least(count: Callable[[], int], n: int) -> Callable[[], bool]:
    return lambda: count() >= n


def _shard(nereus: Nereus) -> Any:
    inspection = nereus.service.inspection()
    return inspection.shards()[0]


def _open_obligations(nereus: Nereus) -> int:
    return int(_shard(nereus).open_obligations)


# Measuring ---------------------------------------------------------------------------------

Raw = Callable[[], object]


class Page:
    """One console page: its request, and the service reads it makes, called directly."""

    def __init__(self, name: str, path: str, query: str, raw: Raw | None) -> None:
        self.name, self.path, self.query, self.raw = name, path, query, raw
        self.times: list[float] = []
        self.raw_times: list[float] = []
        self.bytes = 0
        self.errors: list[str] = []  # answers other than 200: a bug, shown, not timed


def pages(nereus: Nereus, timers: int) -> list[Page]:
    service = nereus.service

    def insp() -> Any:
        return service.inspection()  # asked afresh by every read, as the console does

    # A key in the middle of the big queue, in key order: the cursor of a later page.
    keys = sorted(preload.key_of(i) for i in range(0, timers, QUEUES))
    middle = keys[len(keys) // 2]
    story_id = message_id(TENANT, BIG, STORY_KEY)
    story = insp().story(TENANT, story_id)
    if story is None or not story.attempts:
        raise RuntimeError("console: the story timer has no attempt")
    attempt = story.attempts[-1].attempt_id

    def queue_reads(queue: str, after: str | None) -> Raw:
        return lambda: (
            service.list_timers(queue, after, 50, tenant=TENANT),
            insp().recent_deliveries(TENANT, queue, 20),
            insp().dead_letters(TENANT, queue, 20),
        )

    return [
        Page("overview", "/console/overview", "",
             lambda: (insp().shards(), service.tenant_usage(TENANT))),
        Page("queues", "/console/queues", "",
             lambda: (insp().queues(TENANT, 100), insp().recent_deliveries(TENANT, None, 20),
                      insp().dead_letters(TENANT, None, 20))),
        Page(f"queue {BIG}", f"/console/queues/{BIG}", "", queue_reads(BIG, None)),
        Page(f"queue {BIG}, after= middle key", f"/console/queues/{BIG}",
             f"after={quote(middle)}", queue_reads(BIG, middle)),
        Page(f"queue {QUIET} (no deliveries)", f"/console/queues/{QUIET}", "",
             queue_reads(QUIET, None)),
        Page("timer ?queue=&key= (long story)", "/console/timer",
             f"queue={BIG}&key={STORY_KEY}", lambda: insp().story(TENANT, story_id)),
        Page("timer ?message= (long story)", "/console/timer", f"message={story_id}",
             lambda: insp().story(TENANT, story_id)),
        Page("timer ?attempt= (long story)", "/console/timer", f"attempt={quote(attempt)}",
             lambda: insp().story(TENANT, insp().message_of_attempt(TENANT, attempt))),
        Page("timer ?txn= (long story)", "/console/timer", f"txn={STORY_TXN}",
             lambda: _story_of(insp(), insp().message_of_txn(TENANT, STORY_TXN))),
        # No index by txn: a txn nobody used reads the whole window of newest entries.
        Page("timer ?txn= (not found)", "/console/timer", "txn=no-such-txn",
             lambda: insp().message_of_txn(TENANT, "no-such-txn")),
        Page("timer ?queue=&key= (preloaded)", "/console/timer",
             f"queue={BIG}&key={quote(middle)}",
             lambda: insp().story(TENANT, message_id(TENANT, BIG, middle))),
        Page("obligations", "/console/obligations", "",
             lambda: insp().obligations(TENANT, 200)),
        Page("audit", "/console/audit", "", None),
        Page("confirm cancel", "/console/confirm",
             f"action=cancel&queue={BIG}&key={quote(middle)}", None),
        Page("login", "/console/login", "", None),
        Page("static console.css", "/console/static/console.css", "", None),
        # The reads every page is set beside: one timer, one page of a queue.
        Page("ref: peek of one timer", "", "",
             lambda: service.peek(BIG, middle, tenant=TENANT)),
        Page("ref: list_timers, 50 rows", "", "",
             lambda: service.list_timers(BIG, None, 50, tenant=TENANT)),
    ]  # fmt: skip


def _story_of(insp: Any, mid: str | None) -> object:
    # After a burst the txn's command is older than the txn window: "not found", no story.
    return None if mid is None else insp.story(TENANT, mid)


class _Errors(logging.Handler):
    """The tracebacks the API logs for its internal errors, for the bench to show."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.last = ""

    def emit(self, record: logging.LogRecord) -> None:
        fields = getattr(record, "fields", None) or {}
        self.last = str(fields.get("traceback") or fields.get("error") or record.getMessage())


_ERRORS = _Errors()
logging.getLogger("nereus.http").addHandler(_ERRORS)


def _session(api: TimerApi) -> dict[str, str]:
    """The headers of a viewer whose first page set the session cookie."""
    first = asyncio.run(api.respond("GET", "/console/overview", "", b"", {}))
    cookies = [v for k, v in first.headers if k.lower() == "set-cookie"]
    session = next((c.split(";")[0] for c in cookies if c.startswith("nereus_console=")), None)
    if first.status != 200 or session is None:
        raise RuntimeError(f"console: the first page answered {first.status}, cookies {cookies}")
    return {"cookie": f"{session}; nereus_tz={ZONE}"}


async def _rounds(
    api: TimerApi,
    headers: dict[str, str],
    all_pages: list[Page],
    rounds: int,
    *,
    warmup: int,
    label: str,
    go_on: Callable[[], bool] = lambda: True,
) -> int:
    """Every page once a round; the measured rounds done (fewer once `go_on()` is false,
    but at least one)."""
    progress = Progress(f"console: {label} rounds", rounds)
    for r in range(warmup + rounds):
        if r > warmup and not go_on():
            return r - warmup
        for page in all_pages:
            if page.path:
                t = time.perf_counter()
                answer = await api.respond("GET", page.path, page.query, b"", headers)
                took = time.perf_counter() - t
                if answer.status != 200:
                    why = _ERRORS.last if answer.status == 500 else answer.body[:300].decode()
                    page.errors.append(f"{answer.status}: {why}")
                    say(f"console: {page.name} answered {page.errors[-1]}")
                elif r >= warmup:
                    page.times.append(took)
                page.bytes = len(answer.body)
            if page.raw is not None:
                t = time.perf_counter()
                page.raw()
                took = time.perf_counter() - t
                if r >= warmup:
                    page.raw_times.append(took)
        if r >= warmup:
            progress.update(r - warmup + 1)
    return rounds


def _ms(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    ordered = sorted(values)
    return {
        "p50_ms": round(pct(ordered, 0.5) * 1000, 2),
        "p99_ms": round(pct(ordered, 0.99) * 1000, 2),
        "max_ms": round(ordered[-1] * 1000, 2),
        "mean_ms": round(statistics.fmean(ordered) * 1000, 2),
    }


def _row(page: Page) -> dict[str, Any]:
    console, raw = _ms(page.times), _ms(page.raw_times)
    row: dict[str, Any] = {"page": page.name, "path": page.path, "query": page.query}
    if console is not None:
        row.update(console, bytes=page.bytes)
    if page.path:
        row["met"] = console is not None and console["p99_ms"] <= TARGET_MS and not page.errors
        row["errors"] = len(page.errors)
        if page.errors:
            row["first_error"] = page.errors[0]
    row["raw"] = raw
    if console is not None and raw is not None and raw["p50_ms"] > 0:
        row["p50_vs_raw"] = round(console["p50_ms"] / raw["p50_ms"], 1)
    return row


def _phase(all_pages: list[Page], rounds: int) -> dict[str, Any]:
    rows = [_row(p) for p in all_pages]
    judged = [r for r in rows if "met" in r]
    slowest = max((r for r in judged if "p99_ms" in r), key=lambda r: r["p99_ms"])
    return {
        "rounds": rounds,
        "pages": rows,
        "slowest_page": slowest["page"],
        "slowest_p99_ms": slowest["p99_ms"],
        "slowest_raw_p99_ms": (slowest["raw"] or {}).get("p99_ms"),
        "all_met": all(r["met"] for r in judged),
    }


def shown(nereus: Nereus) -> dict[str, Any]:
    """What the pages had to show: that each read found its content."""
    insp = nereus.service.inspection()
    queues, more_queues = insp.queues(TENANT, 100)
    story = insp.story(TENANT, message_id(TENANT, BIG, STORY_KEY))
    assert story is not None
    page, more = insp.obligations(TENANT, 200)
    every, _ = insp.obligations(TENANT, 1_000_000)
    oldest = {r.attempt_id for r in sorted(every, key=lambda r: r.admitted_at_ms)[: len(page)]}
    return {
        "queues_rows": len(queues),
        "queues_more": more_queues,
        "queues_capped": sum(q.live_capped for q in queues),
        "recent_deliveries": len(insp.recent_deliveries(TENANT, None, 20)),
        "recent_deliveries_big_queue": len(insp.recent_deliveries(TENANT, BIG, 20)),
        "recent_deliveries_quiet_queue": len(insp.recent_deliveries(TENANT, QUIET, 20)),
        "story_events": len(story.events),
        "story_attempts": len(story.attempts),
        "story_older_left_out": story.older_left_out,
        "obligations_rows": len(page),
        "obligations_more": more,
        "obligations_open": len(every),
        # specs/console.md: "every open obligation of the tenant, oldest first".
        "obligations_oldest_not_on_page": len(oldest - {r.attempt_id for r in page}),
    }


Measure = Callable[[str, Callable[[], bool]], dict[str, Any]]


def _during_audit(api: TimerApi, measure: Measure) -> dict[str, Any]:
    """The pages while the console's own audit (`replay --verify` of the shard, in a child
    process) runs: for as long as it runs, up to the rounds of the others."""
    audits = api.console.audits
    if audits.start(0, "bench") is None:
        raise RuntimeError("console: no audit of shard 0")

    def running() -> bool:
        return audits.jobs()[0].state == "running"

    started = time.monotonic()
    phase = measure("audit", running)
    running_s = time.monotonic() - started
    _until("the audit", lambda: not running(), AUDIT_WAIT_S)
    job = audits.jobs()[0]
    phase["audit"] = {
        "state": job.state,
        "entries_folded": job.entries_folded,
        "seconds": round(time.monotonic() - started, 1),
        "measured_for_s": round(running_s, 1),
    }
    if job.state != "ok":
        raise RuntimeError(f"console: the audit ended {job.state}: {job.difference}")
    return phase


def run(timers: int, renders: int, burst: int, warmup: int = 5) -> dict[str, Any]:
    from nereus.adapters.http.api import TimerApi  # noqa: PLC0415  (may be mid-edit)

    result: dict[str, Any] = {"timers": timers, "queues": QUEUES, "renders": renders}
    result.update(warmup=warmup, zone=ZONE, target_ms=TARGET_MS, burst_timers=burst)
    # The console is edited while this runs: the code measured, as it stood.
    result["git"] = git_revision()
    result["date"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    with scratch("nereus-console-") as root:
        nereus = build(root, timers)
        api: TimerApi | None = None
        try:
            result["store"] = give_stories(nereus)
            result["shown"] = shown(nereus)
            api = TimerApi(nereus.service)
            headers = _session(api)

            def measure(label: str, go_on: Callable[[], bool] = lambda: True) -> dict[str, Any]:
                assert api is not None
                measured = pages(nereus, timers)
                first = 0 if label == "audit" else warmup  # the audit's time is short
                coro = _rounds(
                    api, headers, measured, renders, warmup=first, label=label, go_on=go_on
                )
                return _phase(measured, asyncio.run(coro))

            result["calm"] = measure("calm")
            result["audit"] = _during_audit(api, measure)
            result["burst_store"] = give_burst(nereus, burst)
            result["burst"] = measure("burst")
        finally:
            if api is not None:
                api.close()
            nereus.close()
    result["all_met"] = all(result[p]["all_met"] for p in PHASES)
    return result


def table(result: dict[str, Any], phase: str) -> str:
    r = result[phase]
    head = ("page", "p50 ms", "p99 ms", "max ms", "bytes", "raw p50", "raw p99", "x raw", "met")
    lines = []
    for row in r["pages"]:
        raw = row["raw"] or {}
        errors = f" [{row['errors']} answers not 200]" if row.get("errors") else ""
        lines.append(
            (
                row["page"] + errors,
                *(f"{row[k]:.1f}" if k in row else "-" for k in ("p50_ms", "p99_ms", "max_ms")),
                f"{row['bytes']:,}" if "bytes" in row else "-",
                *(f"{raw[k]:.2f}" if k in raw else "-" for k in ("p50_ms", "p99_ms")),
                f"{row['p50_vs_raw']}" if "p50_vs_raw" in row else "-",
                ("yes" if row["met"] else "NO") if "met" in row else "-",
            )
        )
    widths = [max(len(str(x[i])) for x in [head, *lines]) for i in range(len(head))]
    out = [f"{PHASES[phase]}, {r['rounds']} renders a page:"]
    out.append(" | ".join(str(c).ljust(w) for c, w in zip(head, widths, strict=True)))
    out.append("-+-".join("-" * w for w in widths))
    out += [" | ".join(str(c).ljust(w) for c, w in zip(x, widths, strict=True)) for x in lines]
    verdict = "every page's p99 is" if r["all_met"] else "NOT every page's p99 is"
    out.append(
        f"{verdict} <= {result['target_ms']:.0f} ms (slowest: {r['slowest_page']}, "
        f"p99 {r['slowest_p99_ms']} ms)\n"
    )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--timers", type=int, default=1_000_000, help="live timers preloaded")
    parser.add_argument("--renders", type=int, default=200, help="measured renders a page")
    parser.add_argument("--warmup", type=int, default=5, help="renders a page before those")
    parser.add_argument("--burst", type=int, default=50_000, help="timers delivered at once")
    parser.add_argument("--json", help="write results to this file")
    args = parser.parse_args(argv)
    result = run(args.timers, args.renders, args.burst, args.warmup)
    print(f"{result['timers']:,} live timers over {result['queues']} queues\n")
    for phase in PHASES:
        print(table(result, phase))
    verdict = "every page's p99" if result["all_met"] else "NOT every page's p99"
    print(f"all conditions: {verdict} <= {result['target_ms']:.0f} ms")
    write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
