"""A stand-in supervisor for the lifeline tests, and what they read in /proc.

Run as `python -m tests.support.lifeline_worker MODE DIR`. It makes a lifeline the way the
supervisor does (`adapters.compose.lifeline.lifeline_pipe`), starts one child holding the read
end (without the parent-death signal, so the pipe is the only link), prints the child's pid
and sleeps until it is killed. The child's stderr goes to DIR/child.log. MODE picks the child:

* `serve`: `nereus serve --data DIR/data --http 127.0.0.1:0 --supervisor-fd R`;
* `late`: the same, started only once this process is dead and reaped (a shell waits for
  that first), so the supervisor is gone before the child can have watched anything;
* `stuck`: a process whose orderly stop never ends: it follows the lifeline with a stop
  that does nothing, `exit_after_s` = 0.5, and sleeps.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from nereus.adapters.compose.lifeline import lifeline_pipe

STUCK_EXIT_AFTER_S = 0.5

_STUCK = f"""
import sys, time
from nereus.adapters.compose.lifeline import follow_supervisor
from nereus.runtime.log import Logger, configure_json_logging
configure_json_logging(level="info")
assert follow_supervisor(int(sys.argv[1]), lambda: None, {STUCK_EXIT_AFTER_S}, Logger())
print("watching", file=sys.stderr, flush=True)
time.sleep(120)
"""


def child_command(mode: str, directory: Path, read_fd: int) -> list[str]:
    serve = [
        *(sys.executable, "-m", "nereus", "serve", "--data", str(directory / "data")),
        *("--http", "127.0.0.1:0", "--supervisor-fd", str(read_fd)),
        *("--assume-clock-error-ms", "5"),
    ]
    if mode == "serve":
        return serve
    if mode == "late":
        wait = 'while kill -0 "$0" 2>/dev/null; do sleep 0.05; done; exec "$@"'
        return ["sh", "-c", wait, str(os.getpid()), *serve]
    if mode == "stuck":
        return [sys.executable, "-c", _STUCK, str(read_fd)]
    raise SystemExit(f"unknown mode {mode!r}")


def pipe_ends(pid: int) -> dict[int, set[str]]:
    """Pipe inode -> the ends ("r", "w") process `pid` holds, read from /proc."""
    ends: dict[int, set[str]] = {}
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            with open(f"/proc/{pid}/fdinfo/{fd}") as f:
                info = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:
            continue  # closed meanwhile
        if target.startswith("pipe:["):
            inode = int(target[len("pipe:[") : -1])
            access = int(info["flags"].strip(), 8) & os.O_ACCMODE
            ends.setdefault(inode, set()).add("w" if access == os.O_WRONLY else "r")
    return ends


def main(mode: str, directory: Path) -> None:
    read_fd, _write_fd = lifeline_pipe()
    with open(directory / "child.log", "wb") as err:
        child = subprocess.Popen(
            child_command(mode, directory, read_fd), pass_fds=(read_fd,), stderr=err
        )
    print(child.pid, flush=True)
    time.sleep(600)  # holding the write end until killed


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
