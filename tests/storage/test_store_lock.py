"""One owner per data directory, with real processes on real LMDB stores (`storage.lock`).

The rule: a data directory (and each shard store in it) is written by one process at a time,
and by one open in that process; whoever comes second is refused with an error naming the
directory and the holder's pid, and the CLI says so in one line, exit 2, no traceback. The
lock dies with its holder: after a SIGKILL the directory opens at once. Readers take no
lock: `nereus replay --verify`, `export`, `tail` and a consumer in another process read a
directory while the service that owns it keeps writing.

Sizes: NEREUS_LOCK_TIMERS timers (default 200) are delivered, and as many again are
scheduled while the read-only tools run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nereus.adapters.local.embedded import Nereus
from nereus.storage.lock import StoreLocked
from tests.support.file_modes import wrong_modes
from tests.support.kafka_env import kafka_bootstrap, unique_topic  # noqa: F401
from tests.support.serve_process import free_port, serve, stop

ROOT = Path(__file__).resolve().parents[2]
TIMERS = int(os.environ.get("NEREUS_LOCK_TIMERS", "200"))
QUEUE = "reminders"
REFUSED_EXIT = 3  # tests/support/lock_worker.py
WAIT_S = 60.0
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def _run(*argv: str, timeout_s: float = WAIT_S) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
        env=ENV,
    )


def _nereus(*argv: str) -> subprocess.CompletedProcess[str]:
    return _run("-m", "nereus", *argv)


def _worker(*argv: str) -> subprocess.Popen[str]:
    """A tests.support.lock_worker process holding something; returns once it says it is ready."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.support.lock_worker", *argv],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
        env=ENV,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        proc.kill()
        raise AssertionError(f"the worker {argv} exited with {proc.wait()} before it was ready")
    assert json.loads(line) == {"ready": proc.pid}
    return proc


def _log_line(line: str) -> dict[str, Any] | None:
    """A service log line, or None for what is not one (librdkafka writes its own lines to
    the same stderr in Kafka mode)."""
    return json.loads(line) if line.startswith("{") else None


def _wait_serving(proc: subprocess.Popen[str], timeout_s: float = WAIT_S) -> None:
    assert proc.stderr is not None
    deadline = time.monotonic() + timeout_s
    seen: list[str] = []
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        seen.append(line)
        said = _log_line(line)
        if said is not None and said["event"] == "serving":
            _drain(proc)
            return
    proc.kill()
    raise AssertionError(f"never served: {seen}")


def _drain(proc: subprocess.Popen[str]) -> None:
    """Keep reading a service's stderr so that its pipe never fills."""

    def read() -> None:
        assert proc.stderr is not None
        for _line in proc.stderr:
            pass

    threading.Thread(target=read, daemon=True).start()


def _kill(proc: subprocess.Popen[Any]) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(WAIT_S)


def _post(port: int, keys: list[str], delay_ms: int = 0) -> None:
    ops = [
        {"op": "schedule", "queue": QUEUE, "timerKey": k, "delayMs": delay_ms, "payload": "eA=="}
        for k in keys
    ]
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/api/v1/timers",
        data=json.dumps({"operations": ops}).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=WAIT_S) as resp:
        results = json.loads(resp.read())["results"]
    assert [r["status"] for r in results] == ["scheduled"] * len(keys), results


def _one_refusal_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    return lines[0]


def _serve_refusal(stderr: str) -> str:
    """A `nereus serve` refusal: its log lines are JSON, exactly one of them an error."""
    assert "Traceback" not in stderr, stderr
    said = [_log_line(x) for x in stderr.splitlines()]
    errors = [x for x in said if x is not None and x["level"] == "error"]
    assert len(errors) == 1, stderr
    assert errors[0]["event"] == "refused", errors
    detail: str = errors[0]["detail"]
    assert "\n" not in detail
    return detail


def _refused_serve(data: Path, *args: str) -> str:
    """Start `nereus serve` on `data`, which must refuse: exit 2 with one error line; returns
    its detail. A serve that runs instead is killed, not left behind."""
    proc, _ = serve(data, *args)
    try:
        code = proc.wait(WAIT_S)
    except subprocess.TimeoutExpired:
        code = None
    finally:
        if proc.poll() is None:
            _kill(proc)
    assert code == 2, f"the second serve {'ran' if code is None else f'exited {code}'}"
    assert proc.stderr is not None
    return _serve_refusal(proc.stderr.read())


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, int, int]]:
    """`nereus serve` on a directory of its own, TIMERS timers delivered: (data, pid, port)."""
    data = tmp_path_factory.mktemp("served") / "data"
    proc, port = serve(data)
    try:
        _wait_serving(proc)
        keys = [f"first-{i}" for i in range(TIMERS)]
        for start in range(0, TIMERS, 100):
            _post(port, keys[start : start + 100])
        deadline = time.monotonic() + WAIT_S
        while _tail_count(data) < TIMERS:
            assert time.monotonic() < deadline, "the service did not deliver its timers"
            time.sleep(0.2)
        yield data, proc.pid, port
    finally:
        stop(proc)


def _tail_count(data: Path) -> int:
    done = _nereus("tail", QUEUE, "--data", str(data))
    assert done.returncode == 0, done.stderr
    return len(done.stdout.splitlines())


def test_a_second_serve_on_a_served_directory_exits_2_naming_the_holder(
    served: tuple[Path, int, int],
) -> None:
    data, pid, _ = served
    detail = _refused_serve(data)
    assert detail.startswith(f"{data}: in use by process {pid} ("), detail
    assert "nereus serve --data" in detail, detail  # the holder's command line


def test_a_library_process_cannot_open_a_served_directory(served: tuple[Path, int, int]) -> None:
    data, pid, _ = served
    done = _run("-m", "tests.support.lock_worker", "open", str(data))
    assert done.returncode == REFUSED_EXIT, (done.stdout, done.stderr)
    said = json.loads(done.stdout)
    assert said["holder_pid"] == pid
    assert said["path"] == str(data)
    assert f"in use by process {pid}" in said["refused"]


def test_cli_writers_of_a_served_store_are_refused_in_one_line(
    served: tuple[Path, int, int], tmp_path: Path
) -> None:
    data, pid, _ = served
    done = _nereus("snapshot", "--data", str(data))
    assert done.returncode == 2, done.stderr
    line = _one_refusal_line(done.stderr)
    assert line.startswith(f"nereus snapshot: refused: {data / 'shard'}: in use by process {pid}")
    exported = tmp_path / "log.jsonl"
    assert _nereus("export", "--data", str(data), "--out", str(exported)).returncode == 0
    done = _nereus("import", "--log", str(exported), "--data", str(data / "shard"))
    assert done.returncode == 2, done.stderr
    line = _one_refusal_line(done.stderr)
    assert line.startswith(f"nereus import: refused: {data / 'shard'}: in use by process {pid}")


def test_read_only_tools_work_beside_the_running_service(
    served: tuple[Path, int, int], tmp_path: Path
) -> None:
    data, _, port = served
    stop_writing = threading.Event()
    written: list[int] = []

    def write() -> None:
        # The service keeps appending and delivering while the tools read.
        for start in range(0, TIMERS, 10):
            if stop_writing.is_set():
                return
            _post(port, [f"more-{i}" for i in range(start, min(start + 10, TIMERS))])
            written.append(min(start + 10, TIMERS))

    writer = threading.Thread(target=write)
    writer.start()
    try:
        for _ in range(3):
            done = _nereus("replay", "--data", str(data), "--verify", "--json")
            assert done.returncode == 0, (done.stdout, done.stderr)
            assert json.loads(done.stdout)["verify"] == {"ok": True, "first_difference": None}
        out = tmp_path / "export.jsonl"
        done = _nereus("export", "--data", str(data), "--out", str(out))
        assert done.returncode == 0, done.stderr
        # The export is a whole log up to where it was taken: it replays, with every timer
        # delivered before the tools started among what it holds.
        done = _nereus("replay", "--log", str(out), "--json")
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["counters"]["delivered"] >= TIMERS
        # A consumer group in a process of its own, and `tail` as another group.
        consumed = _run(
            "-m", "tests.support.lock_worker", "consume", str(data), QUEUE, "g1", str(TIMERS)
        )
        assert consumed.returncode == 0, consumed.stderr
        assert json.loads(consumed.stdout)["offsets"] == list(range(TIMERS))
        done = _nereus("tail", QUEUE, "--data", str(data), "--group", "g2", "--limit", str(TIMERS))
        assert done.returncode == 0, done.stderr
        assert [json.loads(x)["offset"] for x in done.stdout.splitlines()] == list(range(TIMERS))
    finally:
        stop_writing.set()
        writer.join(WAIT_S)
    assert written, "nothing was written while the tools read"


def test_the_served_directory_is_its_owners_alone(served: tuple[Path, int, int]) -> None:
    """After delivering, a consumer group in another process and `tail --group` (the
    tests above): every file `nereus serve` and the tools made under DIR is 0600 and every
    directory 0700, DIR itself included (specs/library.md, "File modes")."""
    data, _, _ = served
    names = {p.name for p in data.rglob("*")}
    assert {"LOCK", "shard", "destination", "data.mdb", "lock.mdb", "consumers"} <= names
    assert wrong_modes(data, file_mode=0o600, directory_mode=0o700) == []


def test_a_sigkilled_library_holder_leaves_its_directory_free_at_once(tmp_path: Path) -> None:
    data = tmp_path / "data"
    holder = _worker("hold", str(data), str(TIMERS))
    try:
        refused = _run("-m", "tests.support.lock_worker", "open", str(data))
        assert refused.returncode == REFUSED_EXIT, refused.stdout
        assert json.loads(refused.stdout)["holder_pid"] == holder.pid
        with pytest.raises(StoreLocked) as caught:
            Nereus.open(str(data), assume_clock_error_ms=5)
        assert caught.value.holder_pid == holder.pid
    finally:
        _kill(holder)
    started = time.monotonic()
    # No retry, no timeout to wait out: the kernel dropped the lock with the process.
    with Nereus.open(str(data), assume_clock_error_ms=5) as reopened:
        opened_s = time.monotonic() - started
        assert reopened.peek(QUEUE, f"k{TIMERS - 1}").status == "DELIVERED"
    assert opened_s < 10, opened_s


def test_a_sigkilled_serve_leaves_its_directory_to_the_next_serve(tmp_path: Path) -> None:
    data = tmp_path / "data"
    first, _ = serve(data)
    _wait_serving(first)
    try:
        detail = _refused_serve(data)
        assert f"in use by process {first.pid}" in detail
    finally:
        _kill(first)
    third, _ = serve(data)
    try:
        _wait_serving(third)  # the first try: the dead holder's lock is gone
    finally:
        stop(third)


def test_a_supervisor_refuses_a_data_directory_someone_owns(tmp_path: Path) -> None:
    data = tmp_path / "data"
    holder = _worker("lock", str(data))
    try:
        # Refused before it binds, resets DATA/siblings or starts a process: no broker needed.
        done = _nereus(
            "serve", "--kafka", "127.0.0.1:1", "--processes", "2", "--data", str(data),
            "--http", f"127.0.0.1:{free_port()}", "--assume-clock-error-ms", "5",
        )  # fmt: skip
        assert done.returncode == 2, done.stderr
        detail = _serve_refusal(done.stderr)
        assert detail.startswith(f"{data}: in use by process {holder.pid}"), detail
    finally:
        _kill(holder)


def test_a_second_kafka_mode_process_on_one_data_directory_is_refused(
    kafka_bootstrap: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    topic = unique_topic("lock")
    kafka = [
        "--kafka", kafka_bootstrap, "--shards", "2", "--commands-topic", topic,
        "--replies-topic", f"{topic}.replies", "--group", topic,
    ]  # fmt: skip
    first, _ = serve(data, *kafka)
    try:
        _wait_serving(first, timeout_s=90)
        detail = _refused_serve(data, *kafka)
        assert f"{data}: in use by process {first.pid}" in detail, detail
    finally:
        stop(first)
