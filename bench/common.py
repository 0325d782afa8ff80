"""Helpers the benches share: progress on stderr, process memory from /proc, percentiles,
a description of the machine, the writing of results files, scratch directories and the
command line of a bench sized by live timers."""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from nereus.runtime import compiled

PAYLOAD = b'{"kind":"bench","pad":"' + b"x" * 64 + b'"}'
T0_MS = 1_780_000_000_000


class Progress:
    """Progress of one long step on stderr: rewritten in place on a terminal, else one line
    every `every_s` seconds (so CI logs show the suite is alive without flooding), and always
    a last line when done."""

    def __init__(self, label: str, total: int, every_s: float = 5.0) -> None:
        self.label = label
        self.total = total
        self.every_s = every_s if not sys.stderr.isatty() else 0.2
        self.tty = sys.stderr.isatty()
        self.started = time.monotonic()
        self._last = 0.0
        self._finished = False

    def update(self, done: int, note: str = "") -> None:
        now = time.monotonic()
        if done < self.total and now - self._last < self.every_s:
            return
        if done >= self.total:
            if self._finished:
                return
            self._finished = True
        self._last = now
        text = f"{self.label}: {done:,}/{self.total:,}{note} ({now - self.started:.0f} s)"
        if self.tty:
            sys.stderr.write("\r\x1b[K" + text + ("\n" if done >= self.total else ""))
        else:
            sys.stderr.write(text + "\n")
        sys.stderr.flush()


def say(text: str) -> None:
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


def status_mb(pid: int | str = "self") -> dict[str, float]:
    """Memory figures of a process from /proc/PID/status, in MB: the peak resident set
    (VmHWM, which, unlike ru_maxrss, starts afresh at exec), the current resident set
    (VmRSS), and its split into anonymous memory (RssAnon: the process's own heap, Python
    objects, LMDB's dirty pages of a write transaction) and file-backed pages (RssFile:
    LMDB's read-only map, shared and reclaimable page cache)."""
    fields: dict[str, float] = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            name, _, value = line.partition(":")
            if name in ("VmHWM", "VmRSS", "RssAnon", "RssFile"):
                fields[name] = round(int(value.split()[0]) / 1024, 1)
    return fields


def process_cpu_s() -> float:
    """User + system CPU seconds this process has used so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def process_system_s() -> float:
    """System CPU seconds this process has used so far (the kernel's share: LMDB's page
    writes and syncs, for the fire path)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_stime


def pct(values: list[int] | list[float], q: float) -> float:
    """The q-quantile of sorted `values` (nearest rank), 0 for none."""
    return values[min(len(values) - 1, int(len(values) * q))] if values else 0


def machine() -> dict[str, object]:
    mem_kb = 0
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    mem_kb = int(line.split()[1])
    except OSError:
        pass
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                name, _, value = line.partition(":")
                if name.strip() in ("model name", "Model", "cpu model"):
                    model = value.strip()
                    break
    except OSError:
        pass
    return {
        "cores": os.cpu_count(),
        "memory_gib": round(mem_kb / 1024**2, 1),
        "cpu_model": model,
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "kernel": compiled.describe(),
        "platform": platform.platform(),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
    }


def git_revision() -> dict[str, object]:
    """The commit measured and whether the tree had uncommitted changes, results of earlier
    runs aside (they are tracked, and every run rewrites them)."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
            cwd=compiled.ROOT,
        ).stdout.strip()
        dirty = subprocess.run(
            [
                "git",
                "status",
                "--porcelain",
                "--untracked-files=no",
                "--",
                ".",
                ":(exclude)bench/results",
            ],
            capture_output=True,
            text=True,
            check=True,
            cwd=compiled.ROOT,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return {}
    return {"commit": head, "uncommitted_changes": bool(dirty)}


def write_json(path: str | None, doc: object) -> None:
    """A bench's results, to the file its --json names (nothing without one). Every results
    file has this one format: the suite writes its own with it and reads the benches' back."""
    if path:
        with open(path, "w") as out:
            json.dump(doc, out, indent=1)


@contextmanager
def scratch(prefix: str) -> Iterator[str]:
    """A scratch directory for one run (under $NEREUS_BENCH_DIR if set), removed after."""
    root = tempfile.mkdtemp(prefix=prefix, dir=os.environ.get("NEREUS_BENCH_DIR"))
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def live_timers_main(
    doc: str | None,
    run: Callable[[int], dict[str, Any]],
    line: Callable[[dict[str, Any]], str],
    argv: list[str] | None,
) -> int:
    """The command line of a bench sized by `--live` timers: run, print `line`, `--json`."""
    parser = argparse.ArgumentParser(description=(doc or "").splitlines()[0])
    parser.add_argument("--live", type=int, default=1_000_000)
    parser.add_argument("--json", help="write results to this file")
    args = parser.parse_args(argv)
    result = run(args.live)
    print(line(result))
    write_json(args.json, result)
    return 0
