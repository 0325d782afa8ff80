"""Shared by the crash tests: wait for a worker subprocess to say it is ready, and tell
whether a process (not necessarily a child of this one) has exited."""

from __future__ import annotations

import selectors
import subprocess


def wait_ready(proc: subprocess.Popen[bytes], where: str, timeout_s: float) -> None:
    """Block until the worker prints `ready`; fail with its stderr tail if it does not."""
    assert proc.stdout is not None
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        if not selector.select(timeout_s):
            proc.kill()
            _, err = proc.communicate()
            raise AssertionError(f"{where}: worker never became ready: {err.decode()[-2000:]}")
    line = proc.stdout.readline()
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
