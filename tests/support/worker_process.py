"""Shared by the crash tests: wait for a worker subprocess to say it is ready, and tell
whether a process (not necessarily a child of this one) has exited."""

from __future__ import annotations

import os
import selectors
import subprocess
import time


def read_line(proc: subprocess.Popen[bytes], timeout_s: float) -> bytes | None:
    """The worker's next stdout line (b"" once it closed stdout), or None if none came in
    time. Byte by byte from the pipe itself: `readline` on the buffered reader may take the
    lines after this one into its buffer (a fast worker on a busy machine writes them before
    this reads), where neither a selector on the pipe nor `communicate` sees them."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    deadline = time.monotonic() + timeout_s
    line = b""
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while not line.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or not selector.select(left):
                return None
            byte = os.read(fd, 1)
            if not byte:
                return line
            line += byte
    return line


def wait_ready(proc: subprocess.Popen[bytes], where: str, timeout_s: float) -> None:
    """Block until the worker prints `ready`; fail with its stderr tail if it does not."""
    line = read_line(proc, timeout_s)
    if line is None:
        proc.kill()
        _, err = proc.communicate()
        raise AssertionError(f"{where}: worker never became ready: {err.decode()[-2000:]}")
    if line.strip() != b"ready":
        _, err = proc.communicate()
        raise AssertionError(f"{where}: worker failed to start: {line!r} {err.decode()[-2000:]}")


def gone(pid: int) -> bool:
    """The process has exited (reaped, or a zombie its new parent has not reaped yet)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1].startswith("Z")
    except OSError:
        return True
