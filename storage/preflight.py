"""Walk an LMDB environment's page structure in a throwaway child process before trusting it.

Theory of operation: LMDB checks no page checksums. A damaged branch or leaf page is found
only when a cursor lands on it, and then LMDB's own assertions abort the process
(`mdb.c: Assertion 'IS_LEAF(mp)' failed`) — no exception, no chance to say which file is
bad. So before the store is opened in this process, a forked child opens the environment
read-only and walks every key and value of the main database and of each of our
sub-databases, touching every branch, leaf and overflow page a later read could reach. If the
child dies of a signal or LMDB reports an error, the store is refused with a `StoreError`
naming the file and carrying LMDB's message; if it exits cleanly the parent opens the file
knowing every page it will read is well formed (the free list, read only by writers, is the
one structure left to LMDB). Values are CRC-checked later, when decoded.

The walk is O(pages) at C speed plus one Python step per key: an audit at open, like the
invariant check beside it (`StoreOptions.check_structure_on_open` turns it off).
`os.fork` rather than a new interpreter keeps it at milliseconds for the small stores of
tests; the child runs no Python code of the parent's threads and leaves with `os._exit`.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterable

import lmdb

from nereus.storage import files
from nereus.storage.errors import StoreError

_LMDB_ERROR_EXIT = 3
_OTHER_ERROR_EXIT = 4


def _walk(path: str, names: Iterable[bytes]) -> None:
    # A read-only open still makes lock.mdb where there is none (a copied store).
    env = lmdb.open(
        path, readonly=True, create=False, max_dbs=64, readahead=False, mode=files.file_mode()
    )
    try:
        with env.begin() as txn:
            present = set(txn.cursor().iternext(values=False))
            for name in names:
                if name not in present:
                    continue
                db = env.open_db(name, txn=txn, create=False)
                with txn.cursor(db=db) as cursor:
                    for _key, _value in cursor.iternext(keys=True, values=True):
                        pass
    finally:
        env.close()


def check_structure(path: str, data_file: str, names: Iterable[bytes]) -> None:
    """Raise StoreError unless a child process can walk every page of the named
    sub-databases of the environment at `path` (which this process must not have open)."""
    if not os.path.exists(data_file):
        return
    wanted = list(names)
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report through the pipe (stderr too), never return
        code = 0
        try:
            os.close(read_fd)
            os.dup2(write_fd, 2)  # LMDB's assertion text lands in the parent's message
            _walk(path, wanted)
        except lmdb.Error as exc:
            os.write(write_fd, str(exc).encode()[:2000])
            code = _LMDB_ERROR_EXIT
        except BaseException as exc:  # the child must reach os._exit whatever happens
            os.write(write_fd, repr(exc).encode()[:2000])
            code = _OTHER_ERROR_EXIT
        os._exit(code)
    os.close(write_fd)
    chunks: list[bytes] = []
    with os.fdopen(read_fd, "rb") as pipe:
        while chunk := pipe.read(4096):
            chunks.append(chunk)
    _, status = os.waitpid(pid, 0)
    said = b"".join(chunks).decode(errors="replace").strip()[:2000]
    if os.WIFSIGNALED(status):
        name = signal.Signals(os.WTERMSIG(status)).name
        raise StoreError(
            data_file,
            f"damaged: LMDB crashed ({name}) walking the file's page structure"
            + (f": {said}" if said else ""),
        )
    code = os.WEXITSTATUS(status)
    if code == _LMDB_ERROR_EXIT:
        raise StoreError(data_file, f"damaged: LMDB cannot walk the file's pages: {said}")
    if code != 0:
        raise StoreError(data_file, f"the structure check failed (exit {code}): {said}")
