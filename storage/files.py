"""The modes of the files and directories Nereus creates: private unless configured.

    from nereus.storage import files

    files.set_file_mode(files.parse_file_mode("0640"))  # once, before anything is opened
    assert (files.file_mode(), files.directory_mode()) == (0o640, 0o750)
    files.set_file_mode(files.DEFAULT_FILE_MODE)

Theory of operation: a data directory holds every timer's payload, headers and history, so
what Nereus creates in it is its own user's alone: files 0600, directories 0700. One setting
widens that for a deployment that needs it (a backup agent in the service's group:
`--file-mode 0640`); the directories' mode follows from the files' (search permission
wherever read permission is granted, so 0640 gives 0750).

The setting belongs to the process, as its umask does: every layer that creates a file (the
shard store and its lock, the local destination and its consumers' locks, snapshots,
exports, Kafka mode's registries) asks it here and they share one answer. The composition
root sets it once, before it opens anything (`nereus ... --file-mode`; a program that embeds
Nereus calls `set_file_mode`). The umask still applies on top: it can only take
permissions away, never add them.

Only what Nereus creates gets these modes. A directory that exists keeps its own (it may be
the operator's: a mount point, a home directory), and so does an existing file (a store
opened again, an export written over a file that was there).
"""

from __future__ import annotations

import os

__all__ = [
    "DEFAULT_FILE_MODE",
    "create_file",
    "directory_mode",
    "file_mode",
    "make_dirs",
    "opener",
    "parse_file_mode",
    "set_file_mode",
]

DEFAULT_FILE_MODE = 0o600
# Read and write bits only: a data file is never executable, and set-id or sticky bits
# would mean something else entirely.
_ALLOWED_BITS = 0o666
# Nereus must read and write its own files whatever else is granted.
_OWNER_BITS = 0o600


class _Policy:
    """The process's one file mode, set by the composition root (one attribute: a reader
    sees the old mode or the new one, never a mix)."""

    def __init__(self) -> None:
        self.file_mode = DEFAULT_FILE_MODE


_POLICY = _Policy()


def _check(mode: int) -> int:
    if isinstance(mode, bool) or not isinstance(mode, int):
        raise TypeError(f"a file mode is an int, not {type(mode).__name__}")
    if mode & ~_ALLOWED_BITS:
        raise ValueError(f"file mode {mode:04o}: only read and write bits (at most 0666)")
    if mode & _OWNER_BITS != _OWNER_BITS:
        raise ValueError(f"file mode {mode:04o}: the owner must read and write (0600 at least)")
    return mode


def parse_file_mode(text: str) -> int:
    """An octal file mode as an operator writes it (`0640`, `640`, `0o640`), checked: read
    and write bits only, and the owner's both."""
    digits = text.strip().lower().removeprefix("0o")
    if not digits or len(digits) > 4 or any(c not in "01234567" for c in digits):
        raise ValueError(f"file mode {text!r}: not an octal mode such as 0600 or 0640")
    return _check(int(digits, 8))


def set_file_mode(mode: int) -> None:
    """Make `mode` the mode of every file Nereus creates from now on in this process (and
    the matching `directory_mode` of every directory)."""
    _POLICY.file_mode = _check(mode)


def file_mode() -> int:
    return _POLICY.file_mode


def directory_mode() -> int:
    """The file mode with search permission added wherever read permission is granted."""
    mode = _POLICY.file_mode
    return mode | ((mode & 0o444) >> 2)


def make_dirs(path: str) -> None:
    """Create `path` and each missing parent with `directory_mode()`. `os.makedirs` gives
    its mode to the last directory only (Python 3.7 on), so the parents are made here one by
    one; directories that exist are left as they are."""
    missing: list[str] = []
    at = os.path.abspath(path)
    while not os.path.isdir(at):
        missing.append(at)
        parent = os.path.dirname(at)
        if parent == at:
            break
        at = parent
    mode = directory_mode()
    for directory in reversed(missing):
        try:
            os.mkdir(directory, mode)
        except FileExistsError:
            if not os.path.isdir(directory):
                raise  # a file where a directory belongs: the caller's error to report
            # Made meanwhile by another thread or process: theirs, and fine.


def create_file(path: str, flags: int) -> int:
    """`os.open` of `path` with `flags | O_CREAT`, a new file getting `file_mode()`."""
    return os.open(path, flags | os.O_CREAT, file_mode())


def opener(path: str, flags: int) -> int:
    """For `open(path, mode, opener=files.opener)`: a file it creates gets `file_mode()`."""
    return os.open(path, flags, file_mode())
