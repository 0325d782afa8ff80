"""The links that stop a supervised process when its supervisor is gone, however it went.

Theory of operation: `nereus serve --processes N` must not leave its processes serving
unsupervised when the supervisor dies, SIGKILL and the OOM killer included, where it runs
no code of its own. The one thing the kernel does for every dying process is close its
descriptors. So the supervisor makes one pipe (`lifeline_pipe`), keeps the write end open
for its whole life and never writes to it, and hands each process the read end (inherited,
`serve --supervisor-fd N`). While the supervisor lives, a read of the pipe blocks; once no
process holds the write end, the read returns end-of-file at once and for ever after, so a
process that starts after its supervisor died sees it at its first look. Each process looks
when it starts and refuses to serve if the supervisor is gone already (`follow_supervisor`);
then a thread of its own blocks on the read and, at end-of-file, asks for the same orderly
stop as SIGTERM. Should the process still be running `exit_after_s` later (its stop timeout
and a margin: the orderly stop never began, or hung past its own limit), the thread ends it.

The link holds only while the supervisor is the sole holder of the write end: both ends are
close-on-exec and the supervisor passes the read end alone (`pass_fds`), so no process,
broker or tool started by the supervisor or by its processes can keep the pipe open.

The parent-death signal (`die_with_parent`: `prctl(PR_SET_PDEATHSIG, SIGTERM)`, Linux) stays
as a second link. Alone it was not enough: CPython runs a Python signal handler only in the
main thread, while the kernel may hand a process-directed signal to any thread that does not
block it. The handler's C half then only notes the signal, and a main thread asleep in an
untimed wait never looks (seen under load: the SIGTERM of a serving process delivered on a
short-lived worker thread; the process went on serving with the signal noted, unhandled). So
a main thread waiting for its stop wakes every `STOP_POLL_S` (`wait_for_stop`), which runs a
noted handler.
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import stat
import sys
import threading
import time
from collections.abc import Callable

from nereus.runtime.log import Logger

# How often a main thread waiting for its stop runs the signal handlers noted meanwhile.
STOP_POLL_S = 0.5
# Past its --stop-timeout-s, how long a process whose supervisor is gone may still take
# before its lifeline ends it (the orderly stop ends it at the timeout itself).
EXIT_MARGIN_S = 5.0
_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def lifeline_pipe() -> tuple[int, int]:
    """(read end, write end) of a new lifeline. Both are close-on-exec, so a process started
    later holds the read end only where it is named in `pass_fds`, and the write end never."""
    read_fd, write_fd = os.pipe()
    assert not os.get_inheritable(write_fd)
    return read_fd, write_fd


def die_with_parent(parent_pid: int) -> Callable[[], None]:
    """The second link, run in the child before it executes: SIGTERM when the forking
    process dies. A parent gone before the request is made is seen by the pid check."""

    def arm() -> None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        except (OSError, AttributeError):
            return  # not Linux: the lifeline alone
        if os.getppid() != parent_pid:
            os.kill(os.getpid(), signal.SIGTERM)

    return arm


def supervisor_gone(fd: int) -> bool:
    """True when no process holds the lifeline's write end any more. Never blocks."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return any(events & (select.POLLHUP | select.POLLERR) for _, events in poller.poll(0))


def follow_supervisor(
    fd: int,
    stop: Callable[[], None],
    exit_after_s: float,
    log: Logger,
    exit_process: Callable[[int], object] = os._exit,
) -> bool:
    """Look at the lifeline on `fd` now, then watch it from a thread: at its end, `stop()`
    (what SIGTERM does), and `exit_process(1)` if the process still runs `exit_after_s`
    later. False, logged, when the process must not start (nothing is watched then)."""
    try:
        is_pipe = stat.S_ISFIFO(os.fstat(fd).st_mode)
    except OSError:
        is_pipe = False
    if not is_pipe:
        log.error("refused", detail=f"--supervisor-fd {fd} is not an open pipe")
        return False
    if supervisor_gone(fd):
        log.error("refused", detail=f"the supervisor is gone (its lifeline, fd {fd}, is closed)")
        return False
    os.set_inheritable(fd, False)  # this process's own children are not supervised by it
    watcher = threading.Thread(
        target=_watch,
        args=(fd, stop, exit_after_s, log, exit_process),
        name="nereus-lifeline",
        daemon=True,
    )
    watcher.start()
    return True


def _watch(
    fd: int,
    stop: Callable[[], None],
    exit_after_s: float,
    log: Logger,
    exit_process: Callable[[int], object],
) -> None:
    try:
        while os.read(fd, 512):
            continue  # nobody writes to it: only its end means anything
        detail = "the supervisor's lifeline closed: stopping as on SIGTERM"
    except OSError as exc:
        # The descriptor was taken from under the watch: nothing proves the supervisor
        # lives, and serving unsupervised is what the link exists to prevent.
        detail = f"the supervisor's lifeline cannot be read ({exc}): stopping as on SIGTERM"
    log.warning("supervisor_gone", detail=detail)
    stop()
    time.sleep(exit_after_s)
    log.error("stop_timeout", timeout_s=exit_after_s, detail="supervisor gone, exiting anyway")
    sys.stderr.flush()
    exit_process(1)


def wait_for_stop(stop: threading.Event) -> None:
    """Return once `stop` is set, waking every `STOP_POLL_S` so that a signal the kernel
    handed to another thread still has its handler run here, in the main thread."""
    while not stop.wait(STOP_POLL_S):
        continue
