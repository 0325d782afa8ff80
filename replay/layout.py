"""Which shard stores a `--data DIR` names, for `nereus replay`, `export` and `snapshot`.

The same directory `nereus serve --data DIR` was given: the embedded default keeps its one
shard in `DIR/shard`; Kafka mode keeps one store per shard it owned, `DIR/shard-N`. A shard
store's own directory (the one holding `data.mdb`) is accepted too.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from nereus.storage.errors import StoreError

_KAFKA_SHARD = re.compile(r"shard-(\d+)")


@dataclass(frozen=True)
class ShardDir:
    name: str  # "shard" (embedded), "shard-N" (Kafka mode), or the store directory's name
    path: str


def _is_store(path: str) -> bool:
    return os.path.isfile(os.path.join(path, "data.mdb"))


def shard_stores(data: str, shard: int | None = None) -> list[ShardDir]:
    """The stores under `data` in shard order, or the one `shard` names (Kafka mode).
    Raises StoreError saying what was looked for when there is none."""
    if _is_store(data):
        if shard is not None:
            raise StoreError(
                data, "is one shard store; --shard picks a shard of a Kafka-mode data directory"
            )
        return [ShardDir(os.path.basename(os.path.normpath(data)), data)]
    found: list[tuple[int, ShardDir]] = []
    embedded = os.path.join(data, "shard")
    if _is_store(embedded):
        found.append((-1, ShardDir("shard", embedded)))
    names = os.listdir(data) if os.path.isdir(data) else []
    for name in names:
        match = _KAFKA_SHARD.fullmatch(name)
        if match and _is_store(os.path.join(data, name)):
            found.append((int(match.group(1)), ShardDir(name, os.path.join(data, name))))
    found.sort(key=lambda pair: pair[0])
    if shard is not None:
        numbered = {n: d for n, d in found if n >= 0}
        if shard not in numbered:
            have = ", ".join(str(n) for n in sorted(numbered)) or "none"
            raise StoreError(data, f"holds no store of shard {shard} (Kafka-mode shards: {have})")
        return [numbered[shard]]
    if not found:
        raise StoreError(
            data,
            "no shard store here: expected DIR/shard (nereus serve --data DIR), DIR/shard-N "
            "(nereus serve --kafka) or a shard store's own directory",
        )
    return [d for _, d in found]
