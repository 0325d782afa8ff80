"""Storage errors: every refusal names the file and what is wrong with it."""

from __future__ import annotations


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
