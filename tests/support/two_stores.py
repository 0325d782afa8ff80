"""One log folded into two LMDB stores, with the compiled folds on and off.

The compiled folds (`storage.published`, `storage.admitted`, `storage.scheduled`) are
second implementations of the reducer's row work; the tests that hold them to it fold the
same entries twice and compare every database byte for byte and every effect.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, settings

from nereus import kernel as k
from nereus.storage import compiled_rows
from nereus.storage.schema import StoreOptions
from nereus.storage.store import ShardStore
from tests.support import strategies

Dump = dict[bytes, dict[bytes, bytes]]

# Generated histories, each folded into two new stores: slower than the kernel's own.
SETTINGS = settings(
    max_examples=strategies.max_examples(150),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


def dump(store: ShardStore) -> Dump:
    """Every named database of the store, every row, as bytes; the header (which names the
    store itself) left out."""
    lmdb_env = store.env.env
    out: Dump = {}
    with lmdb_env.begin() as txn:
        names = list(txn.cursor().iternext(values=False))
    for name in names:
        db = lmdb_env.open_db(name)
        with lmdb_env.begin(db=db) as txn:
            rows = dict(txn.cursor().iternext())
        rows.pop(b"store_header", None)  # the store's own id
        out[name] = rows
    return out


@contextmanager
def compiled(on: bool) -> Iterator[None]:
    """The compiled folds switched on or off for the block."""
    before = compiled_rows.set_enabled(on)
    try:
        yield
    finally:
        compiled_rows.set_enabled(before)


def fold_into(
    path: Path, entries: Sequence[k.LogEntry], batch: int, *, on: bool, config: k.KernelConfig
) -> tuple[list[Any], Dump]:
    """The entries applied to a new store `batch` at a time: what each apply returned, and
    the store's rows after."""
    options = StoreOptions(max_batch_entries=batch)
    with compiled(on), ShardStore.open(str(path), config=config, options=options) as s:
        applied: list[Any] = []
        for i in range(0, len(entries), batch):
            applied.extend(s.apply(list(entries[i : i + batch])))
        return applied, dump(s)


def assert_same_stores(reference: tuple[list[Any], Dump], compiled: tuple[list[Any], Dump]) -> None:
    """Every entry's effects and every database, byte for byte (the story index too: the
    folds hand their effects to one loop that marks them, `storage.story`)."""
    assert compiled[0] == reference[0]
    assert b"story" in reference[1]
    assert compiled[1].keys() == reference[1].keys()
    for name in reference[1]:
        assert compiled[1][name] == reference[1][name], name.decode()


class Calls:
    """A compiled fold that counts the records it took (answered other than None)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.taken = 0

    def __call__(self, *args: Any) -> Any:
        answer = self.inner(*args)
        self.taken += answer is not None
        return answer
