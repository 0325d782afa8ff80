"""What Nereus creates under a data directory is private unless configured (`storage.files`).

The rule (specs/library.md, "File modes"): every file Nereus creates is 0600 and every
directory 0700 (the umask may only take more away); `--file-mode` / `set_file_mode` widens
the files to the mode given and the directories to it plus search wherever read is granted;
a directory that already exists keeps its mode. The trees here are made the way a deployment
makes them: the HTTP service over the embedded shard (schedule with headers on an encrypted
queue, delivery, a consumer group, snapshots, exports), the library with a configured mode,
and Kafka mode's supervisor with two processes against the real broker. Every file of the
embedded tree is also searched for the encrypted queue's clear headers and payload: none.

Sizes: NEREUS_FILE_MODES_TIMERS timers per tree (default 40).
"""

from __future__ import annotations

import base64
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nereus.adapters.cli.main import main as nereus
from nereus.adapters.clock import SimulatedClock
from nereus.adapters.kafka.wire import shard_for
from nereus.adapters.local.embedded import Nereus
from nereus.storage import files
from nereus.storage.jsonl import export_log
from nereus.storage.snapshot import write_snapshot
from tests.support import kafka_env
from tests.support.file_modes import files_holding, tree_files, wrong_modes
from tests.support.http_harness import SECRET_QUEUE, config, schedule, start_service, timer_path
from tests.support.kafka_cluster import ServiceProc, Topics, schedule_many, wait_until
from tests.support.kafka_env import create_topic, unique_topic
from tests.support.runtime_harness import T0_MS

kafka_bootstrap = kafka_env.kafka_bootstrap

TIMERS = int(os.environ.get("NEREUS_FILE_MODES_TIMERS", "40"))
WAIT_S = 60.0


@pytest.fixture(autouse=True)
def _default_mode() -> Iterator[None]:
    """The mode is the process's: whatever a test sets, the next one starts from 0600."""
    files.set_file_mode(files.DEFAULT_FILE_MODE)
    yield
    files.set_file_mode(files.DEFAULT_FILE_MODE)


# The setting --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "mode"),
    [("0600", 0o600), ("600", 0o600), ("0o640", 0o640), (" 0660 ", 0o660), ("0666", 0o666)],
)
def test_a_file_mode_is_octal_read_and_write_with_the_owners_both(text: str, mode: int) -> None:
    assert files.parse_file_mode(text) == mode


@pytest.mark.parametrize(
    "text",
    [
        "0700",  # execute: a data file is never a program
        "0644x",
        "0400",  # the owner cannot write its own store
        "0200",
        "1600",  # sticky
        "4600",  # set-user-id
        "06000",
        "0680",
        "",
        "0o",
        "rw-------",
    ],
)
def test_other_file_modes_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="file mode"):
        files.parse_file_mode(text)


def test_directories_get_search_where_files_get_read() -> None:
    for file_mode, directory_mode in (
        (0o600, 0o700),
        (0o640, 0o750),
        (0o644, 0o755),
        (0o660, 0o770),
        (0o620, 0o720),  # write without read: no search for the group
        (0o666, 0o777),
    ):
        files.set_file_mode(file_mode)
        assert (files.file_mode(), files.directory_mode()) == (file_mode, directory_mode)
    with pytest.raises(TypeError):
        files.set_file_mode(True)
    with pytest.raises(ValueError):
        files.set_file_mode(0o755)
    assert files.file_mode() == 0o666  # a refused mode changes nothing


def test_make_dirs_makes_each_missing_level_and_leaves_existing_ones(tmp_path: Path) -> None:
    tmp_path.chmod(0o755)
    files.make_dirs(str(tmp_path / "a" / "b" / "c"))
    files.make_dirs(str(tmp_path / "a" / "b" / "c"))  # there already: fine
    assert wrong_modes(tmp_path / "a", file_mode=0o600, directory_mode=0o700) == []
    assert tmp_path.stat().st_mode & 0o777 == 0o755  # not ours: untouched
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(OSError):
        files.make_dirs(str(tmp_path / "file" / "below"))


# The embedded service -----------------------------------------------------------------------


def _delivered(svc: Any, keys: list[str]) -> bool:
    return all(
        svc.call("GET", timer_path(k, SECRET_QUEUE)).doc.get("status") == "DELIVERED" for k in keys
    )


def test_the_served_tree_is_private_and_holds_nothing_sealed_in_clear(tmp_path: Path) -> None:
    data = tmp_path / "data"  # made by Nereus: every level of it is checked
    headers = {"x-holder": "Grace Hopper", "x-tier": "enterprise-gold"}
    payload = b'{"iban": "DE89370400440532013000"}'
    keys = [f"k{i}" for i in range(TIMERS)]
    with start_service(data, config()) as svc:
        ops = [schedule(k, 300, payload, queue=SECRET_QUEUE, headers=headers) for k in keys]
        assert {r["status"] for r in svc.post(*ops)} == {"scheduled"}
        write_snapshot(svc.nereus.store)  # while pending
        svc.wait_for("the deliveries", lambda: _delivered(svc, keys))
        consumer = svc.nereus.consumer(SECRET_QUEUE, group="billing", tenant="acme")
        assert len(consumer.poll(timeout_s=5)) > 0
        consumer.close()
        write_snapshot(svc.nereus.store)
    # The CLI's writers, on the directory the service left.
    assert nereus(["snapshot", "--data", str(data)]) == 0
    assert nereus(["export", "--data", str(data), "--out", str(data / "export.jsonl")]) == 0
    names = {p.name for p in data.rglob("*")}
    assert {
        "LOCK",
        "data.mdb",
        "lock.mdb",
        "shard",
        "destination",
        "consumers",
        "export.jsonl",
    } <= names
    assert len(list(data.rglob("snapshot-*.bin"))) >= 2  # pending, delivered (CLI: same)
    assert wrong_modes(data, file_mode=0o600, directory_mode=0o700) == []
    needles = [payload, *(t.encode() for pair in headers.items() for t in pair)]
    assert files_holding(tree_files(data), needles) == []
    # What an export or a snapshot would show in base64 (payload bytes) is not there either.
    assert files_holding(tree_files(data), [base64.b64encode(payload)]) == []


def test_a_configured_mode_reaches_every_file_and_directory(tmp_path: Path) -> None:
    files.set_file_mode(0o640)
    data = tmp_path / "data"
    clock = SimulatedClock(T0_MS, error_ms=5)
    with Nereus.open(str(data), clock=clock) as n:
        for i in range(TIMERS):
            assert n.schedule("q", f"k{i}", b"x", delay_ms=1_000).status == "scheduled"
        n.start()
        clock.advance(1_000 + 5)
        deadline = time.monotonic() + WAIT_S
        while any(n.peek("q", f"k{i}").status != "DELIVERED" for i in range(TIMERS)):
            assert n.runtime.halted is None, n.runtime.halted
            assert time.monotonic() < deadline, "timed out waiting for the deliveries"
            time.sleep(0.02)
        write_snapshot(n.store)
        with open(data / "export.jsonl", "w", encoding="utf-8", opener=files.opener) as out:
            export_log(n.store, out)
    assert wrong_modes(data, file_mode=0o640, directory_mode=0o750) == []


def test_an_existing_data_directory_keeps_its_mode(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    data.chmod(0o755)  # the operator's, say a mount point
    with Nereus.open(str(data), clock=SimulatedClock(T0_MS)):
        pass
    assert data.stat().st_mode & 0o777 == 0o755
    for inside in ("shard", "destination"):
        assert wrong_modes(data / inside, file_mode=0o600, directory_mode=0o700) == []
    assert wrong_modes(data / "LOCK", file_mode=0o600, directory_mode=0o700) == []


# Kafka mode: a supervisor and its processes ------------------------------------------------


def _serving_processes(sup: ServiceProc) -> set[str]:
    return {
        e["process_name"]
        for e in sup.events()
        if e.get("event") == "serving" and e.get("process_name")
    }


def _all_delivered(sup: ServiceProc, keys: list[str]) -> bool:
    for k in keys:
        status, doc = sup.http("GET", f"/api/v1/timers/reminders/{k}")
        if status != 200 or doc.get("status") != "DELIVERED":
            return False
    return True


def test_kafka_mode_directories_take_the_configured_mode(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """`--file-mode` given to the supervisor reaches its processes: their directories,
    shard stores, lock files, member ids and the sibling registry."""
    destination = create_topic(
        kafka_bootstrap,
        unique_topic("modes"),
        partitions=1,
        config={"message.timestamp.type": "LogAppendTime"},
    )
    data = tmp_path / "data"
    extra = ("--processes", "2", "--file-mode", "0640")
    sup = ServiceProc(
        "sup", kafka_bootstrap, Topics.unique(destination), data, shards=2, extra=extra
    )
    keys = [f"m{i}" for i in range(TIMERS)]
    try:
        sup.start().wait_serving()
        wait_until(lambda: len(_serving_processes(sup)) == 2, WAIT_S, "both processes serving")
        wait_until(lambda: _accepts(sup), 90, "the shards owned")
        schedule_many(sup, keys, delay_ms=0)
        wait_until(lambda: _all_delivered(sup, keys), 120, "the deliveries")
        running = wrong_modes(data, file_mode=0o640, directory_mode=0o750)
        registered = sorted(p.name for p in (data / "siblings").iterdir())
        assert sup.stop() == 0
    finally:
        sup.kill()
    assert running == []
    assert registered == ["process-0.json", "process-1.json"]
    names = {p.name for p in data.rglob("*")}
    assert {"process-0", "process-1", "group-instance-id", "LOCK", "data.mdb"} <= names
    assert {"shard-0", "shard-1"} <= names
    assert wrong_modes(data, file_mode=0o640, directory_mode=0o750) == []


def _accepts(sup: ServiceProc) -> bool:
    """Both shards answer a peek: each is owned by one of the processes."""
    probes = {shard_for("default", "reminders", f"probe-{i}", 2): f"probe-{i}" for i in range(16)}
    assert sorted(probes) == [0, 1]
    for key in probes.values():
        status, _ = sup.http("GET", f"/api/v1/timers/reminders/{key}")
        if status != 200:
            return False
    return True
