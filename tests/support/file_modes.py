"""Shared by the tests of what lies at rest in a data directory: the modes of its tree and the
bytes of its files.

`wrong_modes` walks a tree (its root included) and names every directory and file whose
permission bits are not the ones the test expects, after the process's umask (read once, at
import, before any test starts a thread: reading it means setting it). `files_holding` names
every file that holds any of the given byte strings anywhere in it: LMDB files are searched
whole, free pages included, because a page that was freed still sits on the disk.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from pathlib import Path


def _read_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


UMASK = _read_umask()


def wrong_modes(root: Path, *, file_mode: int, directory_mode: int) -> list[str]:
    """`path: found (wanted)` for each entry of the tree at `root` whose mode is not
    `file_mode` (files) or `directory_mode` (directories), as the umask leaves them."""
    want_file, want_dir = file_mode & ~UMASK, directory_mode & ~UMASK
    found: list[str] = []
    for path in [root, *sorted(root.rglob("*"))]:
        try:
            st = path.lstat()
        except FileNotFoundError:
            continue  # gone since the listing (a running service's temporary file)
        if stat.S_ISDIR(st.st_mode):
            want = want_dir
        elif stat.S_ISREG(st.st_mode):
            want = want_file
        else:
            found.append(f"{path}: neither a file nor a directory")
            continue
        mode = stat.S_IMODE(st.st_mode)
        if mode != want:
            found.append(f"{path}: {mode:04o} (wanted {want:04o})")
    return found


def files_holding(paths: Iterable[Path], needles: Iterable[bytes]) -> list[str]:
    """`path: needle` for each regular file among `paths` that holds a needle."""
    wanted = [n for n in needles if n]
    found: list[str] = []
    for path in paths:
        if not path.is_file():
            continue
        data = path.read_bytes()
        found += [f"{path}: {n!r}" for n in wanted if n in data]
    return found


def tree_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())
