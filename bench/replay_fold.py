"""`nereus replay` of a large shard log: the in-memory fold beside the disk-backed one.

For each size, a store holding that many pending timers (`bench.preload`, one schedule per
log position) is replayed by `nereus replay --data STORE --json` in a child process, once
with `--fold disk` and, up to `--memory-max`, once with `--fold memory`. This process samples
the child's /proc status every 10 ms: peak anonymous memory (RssAnon: Python objects and
malloc, what the fold itself holds) and the peak resident set (VmHWM, which also counts the
pages of the LMDB files mapped in: page cache, which the kernel reclaims). Both folds must
report the same digest. The target: the disk fold of 10M timers within 2 GB.

Where this process may make a memory cgroup (root, cgroup v1's memory controller), the disk
fold runs inside one limited to `--limit-mb` (2048): page cache counts against the limit
there too, so a fold that finishes has shown it needs no more than that machine, and one
that does not is killed by the kernel and reported so.

    .venv/bin/python -m bench.replay_fold [--live 1000000[,10000000]] [--memory-max 1000000]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

from bench.common import say, write_json
from bench.storage_apply import _remove, _sample

CGROUPS_V1_MEMORY = "/sys/fs/cgroup/memory"


class MemoryLimit:
    """A cgroup v1 memory cgroup limited to `limit_mb`, or nothing where none can be made."""

    def __init__(self, limit_mb: int) -> None:
        self.limit_mb = limit_mb
        self.path: str | None = os.path.join(CGROUPS_V1_MEMORY, f"nereus-bench-{os.getpid()}")
        try:
            os.mkdir(self.path)
            with open(os.path.join(self.path, "memory.limit_in_bytes"), "w") as f:
                f.write(str(limit_mb * 2**20))
        except OSError:
            self.path = None

    def wrap(self, argv: list[str]) -> list[str]:
        """`argv` run by a shell that first moves itself into the cgroup."""
        if self.path is None:
            return argv
        procs = os.path.join(self.path, "cgroup.procs")
        return ["sh", "-c", f'echo $$ > "{procs}" && exec "$@"', "sh", *argv]

    def max_usage_mb(self) -> float | None:
        if self.path is None:
            return None
        with open(os.path.join(self.path, "memory.max_usage_in_bytes")) as f:
            return round(int(f.read()) / 2**20, 1)

    def close(self) -> None:
        if self.path is not None:
            os.rmdir(self.path)


def _replay(store: str, fold: str, scratch: str, limit: MemoryLimit | None) -> dict[str, Any]:
    argv = [sys.executable, "-m", "nereus", "replay", "--data", store, "--json"]
    argv += ["--fold", fold, "--scratch", scratch, "--no-progress"]
    if limit is not None:
        argv = limit.wrap(argv)
        _evict(os.path.join(store, "data.mdb"))  # its pages are charged to the fold alone
    t = time.perf_counter()
    with tempfile.TemporaryFile("w+") as errors:
        child = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=errors, text=True)
        peaks = _sample(child)
        out, _ = child.communicate()
        errors.seek(0)
        error_text = errors.read()
    took_s = time.perf_counter() - t
    limited = None if limit is None or limit.path is None else limit.limit_mb
    if child.returncode != 0:
        if limited is not None and child.returncode == -9:
            raise RuntimeError(f"replay --fold {fold} was killed at its {limited} MB limit")
        raise RuntimeError(f"replay --fold {fold} failed: {error_text[-1500:]}")
    doc = json.loads(out)
    return {
        "fold": fold,
        "entries": doc["entries_folded"],
        "digest": doc["digest"],
        "seconds": round(took_s, 1),
        "entries_per_s": round(doc["entries_folded"] / took_s),
        "peak_rssanon_mb": peaks.get("RssAnon"),
        "peak_vmhwm_mb": peaks.get("VmHWM"),
        "memory_limit_mb": limited,
        "cgroup_max_usage_mb": None if limit is None else limit.max_usage_mb(),
    }


def _evict(path: str) -> None:
    """Drop the file's pages from the page cache (they were cached, and charged, when the
    store was built by another process)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def run(lives: list[int], memory_max: int, limit_mb: int) -> list[dict[str, Any]]:
    rows = []
    with tempfile.TemporaryDirectory(
        prefix="nereus-bench-", dir=os.environ.get("NEREUS_BENCH_DIR")
    ) as root:
        for live in lives:
            store = os.path.join(root, f"live-{live}")
            say(f"replay_fold: preloading {live:,} pending timers")
            argv = [sys.executable, "-m", "bench.storage_apply", "--build", store]
            subprocess.run([*argv, "--live", str(live)], check=True)
            folds = ["disk", "memory"] if live <= memory_max else ["disk"]
            results = []
            for fold in folds:
                say(f"replay_fold: {live:,} entries, --fold {fold}")
                limit = MemoryLimit(limit_mb) if fold == "disk" else None
                try:
                    results.append(_replay(store, fold, root, limit))
                finally:
                    if limit is not None:
                        limit.close()
            digests = {r["digest"] for r in results}
            assert len(digests) == 1, f"the folds disagree at {live:,}: {results}"
            rows.append({"live": live, "store_file_mb": _file_mb(store), "folds": results})
            _remove(store)
    return rows


def _file_mb(store: str) -> int:
    return round(os.path.getsize(os.path.join(store, "data.mdb")) / 2**20)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--live", default="1000000", help="comma-separated sizes")
    parser.add_argument("--memory-max", type=int, default=1_000_000, help="largest memory fold")
    parser.add_argument("--limit-mb", type=int, default=2048, help="the disk fold's cgroup limit")
    parser.add_argument("--json", help="write results to this file")
    args = parser.parse_args(argv)
    rows = run([int(n) for n in args.live.split(",")], args.memory_max, args.limit_mb)
    for row in rows:
        for r in row["folds"]:
            limited = r["memory_limit_mb"]
            within = f"  within a {limited} MB cgroup" if limited else ""
            print(
                f"{row['live']:>11,} entries  --fold {r['fold']:<6} {r['entries_per_s']:>8,}/s  "
                f"peak anonymous {r['peak_rssanon_mb']:>8} MB  VmHWM {r['peak_vmhwm_mb']:>8} MB"
                f"{within}"
            )
    write_json(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
