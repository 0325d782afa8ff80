"""One owner per directory: an exclusive lock that the kernel lets go when its holder dies.

Theory of operation: a writer of a shard store (`storage.env.open_env`) and the owner of a
data directory (`Nereus.open`, a Kafka-mode process, the `serve --processes` supervisor)
take an exclusive `flock` on the file `LOCK` in that directory before they read or write
anything there, and keep the file open for as long as they own the directory. `flock` locks
belong to the open file description, not to the process: a second open of the directory in
the same process (a new description) is refused exactly as one in another process, and the
kernel drops the lock when the last descriptor of it closes, which a SIGKILL does too. So
there is never a stale lock to clean up and never a pid file to trust.

The holder writes its pid and command line into the file after it has the lock; a refused
opener reads them for its message (`StoreLocked`). The file is never deleted: deleting it
would let a late opener lock the removed file while a third one locks a new one.

Readers take no lock (LMDB keeps readers and its one writer apart by itself): `holder()`
only tells a reader whether a live writer owns the directory (and which), without stopping
one from starting later.
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
import time
from typing import NamedTuple

from nereus.storage import files
from nereus.storage.errors import StoreError

LOCK_NAME = "LOCK"
# A holder writes its identity just after it takes the lock; a refused opener that reads in
# between sees the previous holder's (or nothing) and looks again, this many times.
_HOLDER_READS = 20
_HOLDER_READ_PAUSE_S = 0.005
_COMMAND_CHARS = 300


class Holder(NamedTuple):
    """Who holds a directory's lock, as its lock file says: `pid` None when it names no
    live process."""

    pid: int | None
    command: str


class StoreLocked(StoreError):
    """Another opener owns the directory: at most one process (and one open in it) at a
    time. `holder_pid` is None when the lock file names no live process (a holder that has
    not written it yet, or one in another pid namespace)."""

    def __init__(self, directory: str, held_by: Holder) -> None:
        holder_pid, holder_command = held_by
        self.holder_pid = holder_pid
        self.holder_command = holder_command
        if holder_pid == os.getpid():
            who = f"this process (pid {holder_pid}) already has it open"
        elif holder_pid is None:
            who = "another process has it open (its pid could not be read from the lock)"
        else:
            shown = f" ({holder_command})" if holder_command else ""
            who = f"in use by process {holder_pid}{shown}"
        super().__init__(
            directory,
            f"{who}; one owner at a time (the lock is {os.path.join(directory, LOCK_NAME)}, "
            "released when its holder closes it or dies)",
        )


class DirectoryLock:
    """An exclusive lock held on `directory`, until `release()`."""

    def __init__(self, directory: str, fd: int) -> None:
        self.directory = directory
        self._fd: int | None = fd

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # the last descriptor of the description: the kernel unlocks

    def __enter__(self) -> DirectoryLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def lock_directory(directory: str) -> DirectoryLock:
    """Take the exclusive lock of `directory` (which must exist) or raise StoreLocked naming
    the holder. Never waits: a second owner is a mistake to report, not a turn to wait for."""
    path = os.path.join(directory, LOCK_NAME)
    try:
        fd = files.create_file(path, os.O_RDWR | os.O_CLOEXEC)
    except OSError as exc:
        raise StoreError(path, f"cannot open the lock file: {exc.strerror}") from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise StoreLocked(directory, _holder_of(path)) from None
    except OSError as exc:
        os.close(fd)
        raise StoreError(path, f"cannot lock: {exc.strerror}") from exc
    try:
        os.ftruncate(fd, 0)
        identity = {"pid": os.getpid(), "command": _own_command()}
        os.pwrite(fd, (json.dumps(identity) + "\n").encode(), 0)
    except OSError as exc:
        os.close(fd)
        raise StoreError(path, f"cannot write the lock's holder: {exc.strerror}") from exc
    return DirectoryLock(directory, fd)


def holder(directory: str) -> Holder | None:
    """The live owner of `directory`, or None when nobody holds its lock (or it has no lock
    file). Takes nothing: a shared probe, dropped at once, so a writer may still start the
    moment after."""
    try:
        fd = os.open(os.path.join(directory, LOCK_NAME), os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None  # no lock file: nobody ever wrote here through this build
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return _holder_of(os.path.join(directory, LOCK_NAME))
    finally:
        os.close(fd)  # a shared lock we got is gone with the descriptor
    return None


def _holder_of(path: str) -> Holder:
    """What the lock file says about its holder: a pid that is alive, and its command line;
    no pid when it says nothing usable however often it is read."""
    for _ in range(_HOLDER_READS):
        try:
            with open(path, "rb") as f:
                said = json.loads(f.read(4096) or b"null")
        except (OSError, ValueError):
            said = None
        if isinstance(said, dict) and isinstance(said.get("pid"), int) and _alive(said["pid"]):
            return Holder(said["pid"], str(said.get("command", "")))
        time.sleep(_HOLDER_READ_PAUSE_S)
    return Holder(None, "")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: it exists
    return True


def _own_command() -> str:
    try:
        with open("/proc/self/cmdline", "rb") as f:
            words = [w.decode(errors="replace") for w in f.read().split(b"\0") if w]
    except OSError:
        words = [sys.executable, *sys.argv]
    # One line: a refusal is printed as one (a `python -c` program has newlines in it).
    return " ".join(" ".join(words).split())[:_COMMAND_CHARS]
