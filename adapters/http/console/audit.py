"""The console's audit: `replay --verify` of one shard, in a child process, with its progress.

Theory of operation: an audit replays the shard's log from nothing (or its newest snapshot)
and compares the state reached with the store's, as `nereus replay --verify` does. Folding
a log is long pure-Python work, and on a thread of the serving process it took the
interpreter lock from the fire path and the pages; so it runs in a child process
(`replay.audit_child`: the same interpreter and environment as this process), over its own
read-only open of the store, while a thread here reads the child's JSON lines into the job.

One audit runs at a time per process: a second request while one runs is shown the running
one instead, so the console can never start more than one replay. The job's thread starts
the child and outlives it, so a parent-death link tied to the starting thread would hold;
the link the child relies on is its stdin, whose end it sees however this process ends.
`stop` (the service stopping) kills the child and waits for its thread. The child's answer
maps onto the job's states: its last line (`verified`: ok or mismatch, `refused`,
`cancelled`), else `failed` with its exit status and the end of its stderr; a child this
process killed is `cancelled`. A job is kept until the next audit of its shard replaces it.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import IO, Final

import msgspec

from nereus.replay.audit_child import (
    Cancelled,
    Progress,
    Refused,
    Started,
    Verified,
    decode_line,
)
from nereus.service.audit_view import AuditView

CHILD_MODULE: Final = "nereus.replay.audit_child"
STOP_WAIT_S: Final = 10.0
STDERR_TAIL_BYTES: Final = 2000


@dataclass
class _Job:
    """A running audit: its view (replaced whole on each change) and its child."""

    view: AuditView
    proc: subprocess.Popen[bytes] | None = None
    killed: bool = False
    thread: threading.Thread | None = None


class Audits:
    """The audits of the shards this process holds (`stores`: shard -> store directory)."""

    def __init__(self, stores: Callable[[], Mapping[int, str]]) -> None:
        self._stores = stores
        self._lock = threading.Lock()
        self._jobs: dict[int, _Job] = {}
        self._running: _Job | None = None

    def jobs(self) -> dict[int, AuditView]:
        with self._lock:
            return {shard: job.view for shard, job in self._jobs.items()}

    def start(self, shard: int, by: str) -> AuditView | None:
        path = self._stores().get(shard)
        if path is None:
            return None
        with self._lock:
            if self._running is not None and self._running.view.state == "running":
                return self._running.view
            job = _Job(AuditView(shard, int(time.time() * 1000), by, "running"))
            self._jobs[shard] = self._running = job
            job.thread = threading.Thread(
                target=self._run, args=(job, path), name=f"nereus-audit-{shard}", daemon=True
            )
            job.thread.start()
            return job.view

    def stop(self) -> None:
        """Kill the running audit's child, if any, and wait until its job says so."""
        with self._lock:
            job = self._running
            if job is None or job.view.state != "running":
                return
            job.killed = True
            if job.proc is not None:
                job.proc.kill()
        if job.thread is not None:
            job.thread.join(STOP_WAIT_S)

    def _update(self, job: _Job, **changes: object) -> None:
        with self._lock:
            job.view = msgspec.structs.replace(job.view, **changes)

    def _run(self, job: _Job, path: str) -> None:
        scratch = tempfile.mkdtemp(prefix="nereus-audit-")
        try:
            with tempfile.TemporaryFile() as stderr:
                last = self._follow(job, path, scratch, stderr)
                self._finish(job, last, stderr)
        except Exception as exc:  # an audit that crashed says so on the page, not silently
            self._update(job, state="failed", difference=repr(exc))
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
            if job.view.finished_at_ms is None:
                self._update(job, finished_at_ms=int(time.time() * 1000))

    def _follow(
        self, job: _Job, path: str, scratch: str, stderr: IO[bytes]
    ) -> Verified | Refused | Cancelled | None:
        """Start the child, read its lines into the job until it ends; its answer, if it
        gave one."""
        command = [sys.executable, "-m", CHILD_MODULE, path, "--scratch", scratch]
        with self._lock:
            if job.killed:  # stopped before the child began
                return None
            # Its stdin is the link to this process (see replay.audit_child): never written.
            job.proc = subprocess.Popen(
                command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr
            )
        proc = job.proc
        assert proc.stdout is not None
        last: Verified | Refused | Cancelled | None = None
        for raw in proc.stdout:
            try:
                line = decode_line(raw)
            except msgspec.DecodeError:
                continue  # not one of the child's lines: its stderr has the story
            if isinstance(line, Started):
                self._update(job, pid=line.pid, parent_pid=line.parent_pid)
            elif isinstance(line, Progress):
                self._update(job, done=line.done, total=line.total)
            else:
                last = line
        proc.wait()
        if proc.stdin is not None:
            proc.stdin.close()
        return last

    def _finish(
        self, job: _Job, last: Verified | Refused | Cancelled | None, stderr: IO[bytes]
    ) -> None:
        now_ms = int(time.time() * 1000)
        if job.killed:
            self._update(job, state="cancelled", finished_at_ms=now_ms)
        elif isinstance(last, Verified):
            self._update(
                job,
                state="ok" if last.difference is None else "mismatch",
                position=last.position,
                entries_folded=last.entries_folded,
                replay_digest=last.replay_digest,
                store_digest=last.store_digest,
                difference=last.difference,
                finished_at_ms=now_ms,
            )
        elif isinstance(last, Refused):
            self._update(job, state="refused", difference=last.message, finished_at_ms=now_ms)
        elif isinstance(last, Cancelled):
            self._update(job, state="cancelled", difference=last.message, finished_at_ms=now_ms)
        else:
            code = job.proc.returncode if job.proc is not None else None
            self._update(
                job,
                state="failed",
                difference=f"the audit process exited with status {code}: {_tail(stderr)}",
                finished_at_ms=now_ms,
            )


def _tail(stderr: IO[bytes]) -> str:
    stderr.seek(0, 2)
    size = stderr.tell()
    stderr.seek(max(size - STDERR_TAIL_BYTES, 0))
    return stderr.read().decode("utf-8", "replace").strip() or "(no output)"
