"""`nereus serve --kafka --processes 2`: two service processes behind one port.

Against the real broker: the supervisor's two processes share the shards through the group,
every request to the one address is answered whichever process accepts it (a peek or a
listing of a shard the other owns is read there), a killed process is started again and
takes part again, and SIGTERM stops everything with exit code 0. Delivery is audited from
the destination topic and the shard logs as in the other Kafka-mode tests.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

from tests import kafka_env
from tests.kafka_cluster import (
    ServiceProc,
    Topics,
    audit,
    check_delivery,
    schedule_many,
    wait_until,
)
from tests.kafka_env import create_topic, unique_topic

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
    destination = create_topic(
        kafka_bootstrap,
        unique_topic("dest"),
        partitions=2,
        config={"message.timestamp.type": "LogAppendTime"},
    )
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
        assert not os.path.exists(f"/proc/{pid}") or _zombie(pid), f"process {pid} left running"
    a = audit(kafka_bootstrap, topics, SHARDS, 2)
    counts = check_delivery(a, first + later, where="processes")
    assert counts["records"] >= len(first) + len(later)


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1].startswith("Z")
    except OSError:
        return True


def test_a_supervisor_killed_outright_takes_its_processes_with_it(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    sup = _supervisor(kafka_bootstrap, Topics.unique(unique_topic("dest")), tmp_path)
    try:
        sup.start().wait_serving()
        wait_until(lambda: len(_serving(sup)) == PROCESSES, 60, "both processes serving")
        pids = list(_serving(sup).values())
        sup.kill()  # SIGKILL: no chance to stop its processes itself
        wait_until(
            lambda: all(not os.path.exists(f"/proc/{p}") or _zombie(p) for p in pids),
            60,
            "its processes to stop",
        )
        stopped = [e for e in sup.events() if e.get("event") == "stopped" and "took_ms" in e]
        assert len(stopped) == PROCESSES, "each process stops as on SIGTERM"
    finally:
        sup.kill()
