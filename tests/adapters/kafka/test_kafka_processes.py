"""`nereus serve --kafka --processes 2`: two service processes behind one port.

Against the real broker: the supervisor's two processes share the shards through the group,
every request to the one address is answered whichever process accepts it (a peek or a
listing of a shard the other owns is read there), a killed process is started again and
takes part again, and SIGTERM stops everything with exit code 0. Delivery is audited from
the destination topic and the shard logs as in the other Kafka-mode tests. One scrape of
/metrics at the address answers for both processes: their counters summed, every shard's
gauges, each process's own gauges under its name.
"""

from __future__ import annotations

import json
import os
import re
import signal
import urllib.request
from pathlib import Path
from typing import Any

from nereus.adapters.kafka.siblings import TOKEN_ENV, TOKEN_HEADER
from tests.support import kafka_env
from tests.support.kafka_cluster import (
    ServiceProc,
    Topics,
    audit,
    check_delivery,
    schedule_many,
    wait_until,
)
from tests.support.kafka_env import destination_topic, unique_topic
from tests.support.lifeline_worker import pipe_ends
from tests.support.worker_process import gone

kafka_bootstrap = kafka_env.kafka_bootstrap

SHARDS = 4
PROCESSES = 2
TIMERS = int(os.environ.get("NEREUS_PROCESSES_TIMERS", "600"))


def _supervisor(bootstrap: str, topics: Topics, tmp_path: Path) -> ServiceProc:
    """`nereus serve --kafka ... --processes 2`, not started yet."""
    extra = ("--processes", str(PROCESSES))
    return ServiceProc("sup", bootstrap, topics, tmp_path / "data", shards=SHARDS, extra=extra)


def _serving(sup: ServiceProc) -> dict[str, int]:
    """process name -> pid of each process that logged it is serving (latest start)."""
    found: dict[str, int] = {}
    for e in sup.events():
        if e.get("event") == "serving" and e.get("process_name"):
            found[e["process_name"]] = int(e["pid"])
    return found


def _owners(sup: ServiceProc, tries: int = 40) -> dict[str, set[int]]:
    """Active shards by process, from /healthz asked over fresh connections (each taken by
    whichever process accepts it)."""
    seen: dict[str, set[int]] = {}
    for _ in range(tries):
        health: dict[str, Any] = sup.health()
        if health.get("process"):
            owned = health.get("owned", {})
            seen[health["process"]] = {int(p) for p, s in owned.items() if s == "active"}
    return seen


def _all_active(sup: ServiceProc) -> bool:
    owners = _owners(sup)
    shards = [s for owned in owners.values() for s in owned]
    spread = len(owners) == PROCESSES and all(owners.values())
    return spread and sorted(shards) == list(range(SHARDS))


def _peeks(sup: ServiceProc, keys: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for k in keys:
        status, doc = sup.http("GET", f"/api/v1/timers/reminders/{k}")
        out[k] = doc.get("status") if status == 200 else f"http {status}: {doc}"
    return out


def _listed(sup: ServiceProc) -> list[str]:
    keys: list[str] = []
    after: str | None = None
    while True:
        query = "?limit=250" + (f"&after={after}" if after else "")
        status, doc = sup.http("GET", f"/api/v1/timers/reminders{query}")
        assert status == 200, (status, doc)
        keys += [t["timerKey"] for t in doc["rows"]]
        if not doc["truncated"]:
            return keys
        after = doc["nextAfter"]


def test_processes_share_the_shards_behind_one_address(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    destination = destination_topic(kafka_bootstrap)
    topics = Topics.unique(destination)
    sup = _supervisor(kafka_bootstrap, topics, tmp_path)
    pending = [f"p{i}" for i in range(TIMERS // 2)]
    first = [f"a{i}" for i in range(TIMERS)]
    later = [f"b{i}" for i in range(TIMERS // 3)]
    try:
        sup.start().wait_serving()
        wait_until(lambda: len(_serving(sup)) == PROCESSES, 60, "both processes serving")
        wait_until(lambda: _all_active(sup), 90, "the shards spread over both processes")

        # Pending timers: every one visible through the one address, whoever owns it.
        schedule_many(sup, pending, delay_ms=600_000)
        assert set(_peeks(sup, pending).values()) == {"SCHEDULED"}
        assert sorted(_listed(sup)) == sorted(pending)
        for k in pending[:10]:
            status, doc = sup.http("DELETE", f"/api/v1/timers/reminders/{k}")
            assert (status, doc["status"]) == (200, "canceled"), doc
        assert sorted(_listed(sup)) == sorted(pending[10:])
        # Timers due at once: fired by both processes.
        schedule_many(sup, first, delay_ms=0)
        wait_until(lambda: set(_peeks(sup, first).values()) == {"DELIVERED"}, 120, "all DELIVERED")

        # One process killed: the supervisor starts it again, and it serves again.
        victim, pid = sorted(_serving(sup).items())[0]
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: _serving(sup).get(victim, pid) != pid, 60, f"{victim} started again")
        exits = [e for e in sup.events() if e.get("event") == "process_exited"]
        assert [e["process"] for e in exits] == [victim]
        wait_until(lambda: _all_active(sup), 120, "both processes owning shards again")
        schedule_many(sup, later, delay_ms=0)
        wait_until(
            lambda: set(_peeks(sup, later).values()) == {"DELIVERED"}, 120, "later DELIVERED"
        )
        assert sup.stop() == 0
    finally:
        sup.kill()
    for pid in _serving(sup).values():
        assert gone(pid), f"process {pid} left running"
    a = audit(kafka_bootstrap, topics, SHARDS, 2)
    counts = check_delivery(a, first + later, where="processes")
    assert counts["records"] >= len(first) + len(later)


def test_a_supervisor_killed_outright_takes_its_processes_with_it(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    sup = _supervisor(kafka_bootstrap, Topics.unique(unique_topic("dest")), tmp_path)
    try:
        sup.start().wait_serving()
        wait_until(lambda: len(_serving(sup)) == PROCESSES, 60, "both processes serving")
        pids = list(_serving(sup).values())
        # Each process holds the read end of the supervisor's lifeline and never the write end
        # (a process holding it would keep the pipe open past the supervisor's death).
        assert sup.proc is not None
        ends = pipe_ends(sup.proc.pid)
        lifelines = [inode for inode, held in ends.items() if held == {"r", "w"}]
        assert len(lifelines) == 1, ends
        for pid in pids:
            assert pipe_ends(pid).get(lifelines[0]) == {"r"}, (pid, pipe_ends(pid))
        sup.kill()  # SIGKILL: no chance to stop its processes itself
        wait_until(lambda: all(gone(p) for p in pids), 60, "its processes to stop")
        stopped = [e for e in sup.events() if e.get("event") == "stopped" and "took_ms" in e]
        assert len(stopped) == PROCESSES, "each process stops as on SIGTERM"
    finally:
        sup.kill()


def _get(url: str, headers: dict[str, str] | None = None) -> str:
    req = urllib.request.Request(url, headers=headers or {})
    with urllib.request.urlopen(req, timeout=10) as resp:
        text: str = resp.read().decode()
        return text


def _samples(text: str, name: str, **labels: str) -> list[tuple[dict[str, str], float]]:
    """The series of `name` carrying `labels`, read with a pattern of its own (not the
    parser under test)."""
    found = []
    for m in re.finditer(rf"^{re.escape(name)}(?:{{([^}}]*)}})? (\S+)$", text, re.MULTILINE):
        have = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1) or ""))
        if all(have.get(k) == v for k, v in labels.items()):
            found.append((have, float(m.group(2))))
    return found


def _total(text: str, name: str, **labels: str) -> float:
    return sum(v for _, v in _samples(text, name, **labels))


def _own_metrics(sup: ServiceProc) -> dict[str, str]:
    """process name -> its own metrics, from its private port (the token read from its
    environment, as only the service's user can)."""
    own: dict[str, str] = {}
    for entry in sorted((sup.data / "siblings").glob("process-*.json")):
        doc = json.loads(entry.read_text())
        with open(f"/proc/{doc['pid']}/environ", "rb") as f:
            env = dict(v.split(b"=", 1) for v in f.read().split(b"\0") if b"=" in v)
        token = env[TOKEN_ENV.encode()].decode()
        own[doc["process"]] = _get(f"http://{doc['read']}/metrics", {TOKEN_HEADER: token})
    return own


def test_one_scrape_answers_for_every_process(kafka_bootstrap: str, tmp_path: Path) -> None:
    destination = destination_topic(kafka_bootstrap)
    sup = _supervisor(kafka_bootstrap, Topics.unique(destination), tmp_path)
    keys = [f"m{i}" for i in range(40)]
    try:
        sup.start().wait_serving()
        wait_until(lambda: len(_serving(sup)) == PROCESSES, 60, "both processes serving")
        wait_until(lambda: _all_active(sup), 90, "the shards spread over both processes")
        schedule_many(sup, keys, delay_ms=0)

        def published() -> float:
            return _total(
                _get(sup.url + "/metrics"), "nereus_outcomes_total", **{"class": "PUBLISHED"}
            )

        wait_until(lambda: published() == len(keys), 60, "every timer published")
        merged = _get(sup.url + "/metrics")
        own = _own_metrics(sup)
        assert sup.stop() == 0
    finally:
        sup.kill()
    assert sorted(own) == ["process-0", "process-1"]
    for name, labels in [
        ("nereus_outcomes_total", {"class": "PUBLISHED"}),
        ("nereus_fire_lag_seconds_count", {}),
        ("nereus_fire_lag_seconds_bucket", {"le": "+Inf"}),
    ]:
        each = [_total(text, name, **labels) for text in own.values()]
        assert all(each), f"{name}: each process fired some timers: {each}"
        assert _total(merged, name, **labels) == sum(each) == len(keys), (name, each)
    shards = {have["shard"] for have, _ in _samples(merged, "nereus_applied_position")}
    assert shards == {str(s) for s in range(SHARDS)}
    processes = {have.get("process") for have, _ in _samples(merged, "process_open_fds")}
    assert processes == {"process-0", "process-1"}
    assert _total(merged, "nereus_metrics_processes") == PROCESSES
    assert _total(merged, "nereus_metrics_siblings_missing") == 0
