"""Wake-ups across processes for consumers of the local destination: one FIFO per waiter.

Theory of operation: the process that writes the local destination (the runtime that owns
the data directory) cannot signal a condition variable in another process, and LMDB has no
change notification. So a consumer that is about to wait makes itself a named pipe (FIFO)
in `DEST/wake/`, and the writer, after every committed batch of sends, writes one byte into
every FIFO there (`notify`). A waiting consumer blocks in `poll` (sync) or in the event
loop's reader callback (asyncio) on its FIFO's read end; nothing wakes up until a byte
arrives. The wake-up costs the writer one `listdir` plus an open, a one-byte write and a
close per waiting consumer, and reaches the consumer within the scheduler's latency (tens of
microseconds when the machine is idle).

No wake-up is lost: a waiter makes its FIFO visible *before* it reads the topic's end
(`Waker.drain` then the check), and the writer lists the directory *after* its
transaction committed, so either the check sees the records or the writer sees the FIFO
and the byte is waiting in the pipe when the waiter selects.

A FIFO becomes visible only once it is open for reading (made under a `.tmp` name, opened,
then renamed), so a writer that cannot open one for writing (`ENXIO`: no reader) has found
a FIFO whose consumer died, and removes it. The waiter also holds its own FIFO open for
writing: a FIFO whose last writer closed reads as end-of-file forever, which would turn the
wait into a busy loop.

Backstop: a waiter still re-reads the topic every `BACKSTOP_S` without a wake-up. That only
matters when the writer committed records and died before it wrote the bytes, or when the
writer is a build without this module; it is a bound on the latency of those cases, not
the way records are normally seen.

A waiter that cannot make its FIFO (a reader of another user without write permission on
the destination's folder, as `--file-mode 0640` allows; a file system without FIFOs) falls
back to looking every `UNWAKEABLE_POLL_S`: the one case that polls, said here so that it
is not a surprise.
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import stat
import uuid

from nereus.storage import files

WAKE_DIR = "wake"
SUFFIX = ".fifo"
# See the module docstring: the longest a waiter goes without looking when no wake-up came.
BACKSTOP_S = 5.0
# How often a waiter that cannot make a FIFO looks instead (the one case that polls).
UNWAKEABLE_POLL_S = 0.1


def wake_dir(destination_path: str) -> str:
    return os.path.join(destination_path, WAKE_DIR)


class Waker:
    """One waiter's FIFO: `fileno()` becomes readable when the writer commits records (or
    `wake()` is called). Call `drain()` before looking at the topic, then wait."""

    def __init__(self, destination_path: str) -> None:
        folder = wake_dir(destination_path)
        files.make_dirs(folder)
        name = f"{os.getpid()}-{uuid.uuid4().hex}"
        temporary = os.path.join(folder, name + ".tmp")
        self.path = os.path.join(folder, name + SUFFIX)
        os.mkfifo(temporary, files.file_mode())
        try:
            self._read_fd = os.open(temporary, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            self._write_fd = os.open(temporary, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            os.rename(temporary, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            self._close_fds()
            raise
        self.closed = False

    def fileno(self) -> int:
        return self._read_fd

    def drain(self) -> None:
        """Forget the wake-ups so far (the caller is about to look for itself)."""
        with contextlib.suppress(BlockingIOError):
            while os.read(self._read_fd, 4096):
                pass

    def wait(self, timeout_s: float | None) -> bool:
        """Block until a wake-up arrives (True) or `timeout_s` passes (False); never longer
        than `BACKSTOP_S`."""
        limit = BACKSTOP_S if timeout_s is None else min(timeout_s, BACKSTOP_S)
        # poll, not select: a descriptor above FD_SETSIZE is fine.
        poller = select.poll()
        poller.register(self._read_fd, select.POLLIN)
        return bool(poller.poll(max(limit, 0.0) * 1000.0))

    def wake(self) -> None:
        """Wake the waiter from this process (a consumer closed by another thread)."""
        with contextlib.suppress(BlockingIOError):
            os.write(self._write_fd, b"\x00")

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        self._close_fds()

    def _close_fds(self) -> None:
        for name in ("_read_fd", "_write_fd"):
            fd = getattr(self, name, None)
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
                setattr(self, name, None)

    def __enter__(self) -> Waker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def notify(destination_path: str) -> int:
    """Write a wake-up byte into every waiter's FIFO; remove those of dead waiters. Returns
    how many waiters were woken. Called by the writer after a committed batch."""
    folder = wake_dir(destination_path)
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return 0
    woken = 0
    for name in names:
        if not name.endswith(SUFFIX):
            continue
        path = os.path.join(folder, name)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # nobody reads it: its waiter died
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
            continue  # ENOENT: its waiter closed it meanwhile
        try:
            if not stat.S_ISFIFO(os.fstat(fd).st_mode):
                continue  # not a waiter's: never write into another kind of file
            os.write(fd, b"\x00")
        except BlockingIOError:
            pass  # the pipe is full of wake-ups already: the waiter will look
        except OSError:
            continue
        finally:
            os.close(fd)
        woken += 1
    return woken
