"""Records deferred to the next commit: one small queue with one owner.

Theory of operation: while the runtime acts on a fold's effects (`runtime.effects`) or on a
destination's report (`runtime.dead_letters`), it may learn something that must enter the
shard log — an attempt whose send gate closed, a dead-letter copy written — but the commit
that produced the effects is already over. Such records wait here. The shard runtime owns
the queue and hands it to the parts that add to it; only the runtime drains it, into the
next tick's batch, and empties it when it lets go of the shard.
"""

from __future__ import annotations

from nereus.kernel.records import Appendable


class Deferred:
    """Records for the next commit, in the order they arose."""

    def __init__(self) -> None:
        self._items: list[Appendable] = []

    def add(self, item: Appendable) -> None:
        self._items.append(item)

    def drain_into(self, batch: list[Appendable]) -> None:
        """Move every waiting record to the end of `batch`."""
        if self._items:
            batch.extend(self._items)
            self._items.clear()

    def clear(self) -> None:
        """Drop every waiting record (the shard was let go)."""
        self._items.clear()

    def __bool__(self) -> bool:
        return bool(self._items)

    def __len__(self) -> int:
        return len(self._items)
