"""The process's own metrics, refreshed when /metrics is scraped: `process_*` (the names
Prometheus client libraries use, so existing dashboards read them) and `nereus_build_info`.

Theory of operation: nothing samples in the background; each scrape reads /proc once (CPU
seconds, resident memory, open descriptors) and sets gauges. Off Linux the /proc figures are
left out rather than guessed.
"""

from __future__ import annotations

import os
import platform
import resource
import time
from importlib import metadata

from nereus.runtime import compiled
from nereus.runtime.metrics import Metrics

_DESCRIBED = {
    "process_cpu_seconds_total": ("counter", "User and system CPU time spent, in seconds."),
    "process_resident_memory_bytes": ("gauge", "Resident memory size in bytes."),
    "process_virtual_memory_bytes": ("gauge", "Virtual memory size in bytes."),
    "process_open_fds": ("gauge", "Open file descriptors."),
    "process_max_fds": ("gauge", "The limit on open file descriptors (soft)."),
    "process_start_time_seconds": ("gauge", "Start time of the process, in Unix seconds."),
    "nereus_build_info": ("gauge", "1, labelled with the version, Python and the kernel build."),
}


def _version() -> str:
    try:
        return metadata.version("nereus")
    except metadata.PackageNotFoundError:
        return "unknown"


def _start_time_s() -> float:
    """From /proc: the process's start in clock ticks after boot, plus the boot time."""
    try:
        with open("/proc/self/stat") as f:
            # The command name (field 2) may hold spaces: count fields after its ')'.
            fields = f.read().rpartition(")")[2].split()
        with open("/proc/stat") as f:
            boot_s = next(float(line.split()[1]) for line in f if line.startswith("btime "))
        return boot_s + int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, StopIteration, IndexError, ValueError):
        return time.time()


class ProcessMetrics:
    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        for name, (kind, text) in _DESCRIBED.items():
            metrics.describe(name, kind, text)
        metrics.set("process_start_time_seconds", _start_time_s())
        metrics.set(
            "nereus_build_info",
            1,
            {
                "version": _version(),
                "python": platform.python_version(),
                "kernel": compiled.describe(),
            },
        )
        self._page_bytes = resource.getpagesize()

    def refresh(self) -> None:
        m = self.metrics
        t = os.times()
        m.set("process_cpu_seconds_total", t.user + t.system)
        m.set("process_max_fds", resource.getrlimit(resource.RLIMIT_NOFILE)[0])
        try:
            with open("/proc/self/statm") as f:
                size, resident = (int(v) for v in f.read().split()[:2])
            m.set("process_virtual_memory_bytes", size * self._page_bytes)
            m.set("process_resident_memory_bytes", resident * self._page_bytes)
            m.set("process_open_fds", len(os.listdir("/proc/self/fd")))
        except OSError:
            pass
