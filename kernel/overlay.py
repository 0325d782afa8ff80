"""A persistent map specialised for the reducer's overlay: O(1) reads and writes.

Theory of operation: a fold extends one state at a time, so a general persistent map (a HAMT
such as pyrsistent's, measured at ~3 us per set) pays for branching that almost never
happens. Here every write is recorded, with a sequence number, in a version chain shared by
all overlays of one lineage; an `Overlay` value is just (shared store, its sequence number),
and reads take the newest version not newer than that number. Old overlays therefore keep
seeing exactly what they saw. Writing to an overlay that is not the newest of its lineage
(a branch) first copies the versions it can see into a new store, so branches never see each
other's writes. From the outside this is an immutable map; inside, the common case is a dict
store.

A key's versions are a chain of `(seq, value, older)` tuples, newest first: one tuple per
write and nothing else (a list of pairs cost a list per key and a pair per write), and the
newest version, the one nearly every read wants, is the head.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator, Mapping
from typing import Any, Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

# (seq, value, older version or None); `Any` because mypy has no recursive tuple aliases
# over a type variable.
_Version = tuple[int, Any, Any]


class _Store(Generic[K, V]):
    __slots__ = ("head", "versions")

    def __init__(self) -> None:
        self.versions: dict[K, _Version] = {}
        self.head = 0  # sequence number of the newest write


class Overlay(Generic[K, V]):
    __slots__ = ("_keys", "_seq", "_store")

    def __init__(self, store: _Store[K, V] | None = None, seq: int = 0, keys: int = 0) -> None:
        self._store: _Store[K, V] = store if store is not None else _Store()
        self._seq = seq
        self._keys = keys

    def get(self, key: K, default: V | None = None) -> V | None:
        version = self._store.versions.get(key)
        seq = self._seq
        while version is not None:
            if version[0] <= seq:  # at once, unless this is an older overlay
                value: V = version[1]
                return value
            version = version[2]
        return default

    def set(self, key: K, value: V) -> Overlay[K, V]:
        store = self._store
        if store.head != self._seq:
            store = self._fork()
        store.head += 1
        older = store.versions.get(key)
        store.versions[key] = (store.head, value, older)
        return Overlay(store, store.head, self._keys + (1 if older is None else 0))

    def set_many(self, changes: Mapping[K, V]) -> Overlay[K, V]:
        """All of `changes` as ONE new version (in their iteration order), the same map
        `set` called once per item would give. A reducer step writes three or four rows and
        no state between them is ever observable, so one sequence number and one Overlay
        object per step is enough, where `set` pays for both per row."""
        store = self._store
        if store.head != self._seq:
            store = self._fork()
        seq = store.head + 1
        store.head = seq
        versions = store.versions
        added = 0
        for key, value in changes.items():
            older = versions.get(key)
            if older is None:
                added += 1
            versions[key] = (seq, value, older)
        return Overlay(store, seq, self._keys + added)

    def _visible(self, version: _Version | None) -> _Version | None:
        seq = self._seq
        while version is not None and version[0] > seq:
            version = version[2]
        return version

    def _fork(self) -> _Store[K, V]:
        """A private copy of what this overlay sees, for a write on an old branch."""
        fresh: _Store[K, V] = _Store()
        for key, versions in self._store.versions.items():
            visible = self._visible(versions)
            if visible is not None:
                fresh.versions[key] = (visible[0], visible[1], None)
        fresh.head = self._seq
        return fresh

    def items(self) -> Iterator[tuple[K, V]]:
        seq = self._seq
        for key, newest in list(self._store.versions.items()):
            # `_visible`, inlined: storage walks every row of a batch through here.
            version: _Version | None = newest
            while version is not None and version[0] > seq:
                version = version[2]
            if version is not None:
                value: V = version[1]
                yield key, value

    def flat_items(self, tombstone: object) -> Iterator[tuple[Any, Any, Any]]:
        """`items()` of an overlay whose keys are pairs, as (first, second, value), with
        the value `tombstone` given as None: storage's view of a batch. Here, in the
        compiled module, because the fold walks every row of a batch through it (the
        interpreted generator in `kernel.state` cost ~2k instructions a row)."""
        for key, value in self.items():
            pair: tuple[Any, Any] = key  # type: ignore[assignment]  # pairs, by contract
            yield pair[0], pair[1], None if value is tombstone else value

    def __len__(self) -> int:
        """Distinct keys written in this overlay's lineage up to it."""
        return self._keys

    def __repr__(self) -> str:
        return f"Overlay({len(self)} keys, seq {self._seq})"
