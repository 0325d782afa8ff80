"""Storage errors: every refusal names the file and what is wrong with it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import lmdb


class StoreError(Exception):
    """The store cannot be opened or used safely. The message says which file, what is
    wrong, and where (a position, table or key) when that is known."""

    def __init__(self, path: str, problem: str, where: str | None = None) -> None:
        self.path = path
        self.problem = problem
        self.where = where
        at = f" (at {where})" if where else ""
        super().__init__(f"{path}: {problem}{at}")


class CorruptRecord(StoreError):
    """A stored value failed its checksum or did not decode."""


@contextmanager
def lmdb_refusal(path: str, where: str | None = None) -> Iterator[None]:
    """Turn LMDB's own complaints while reading (a page of the wrong type, a page that is not
    there, an invalidated transaction: what a damaged data file causes) into the StoreError
    refusal that names the file, instead of a traceback from the binding."""
    try:
        yield
    except lmdb.Error as exc:
        raise StoreError(path, f"LMDB cannot read the file (damaged?): {exc}", where) from exc
