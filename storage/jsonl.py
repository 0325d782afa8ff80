"""Export a shard log to JSON Lines and import it back, for audits off the machine.

Theory of operation: line 1 is a header naming the store, shard and kernel configuration
fingerprint and the position range; every further line is one `LogEntry` as JSON, in
position order. Payload bytes are not exported (the log holds only their digests). Reading
checks the header and that positions are dense, and names the line of any bad entry.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TextIO

import msgspec

from nereus.kernel.config import KernelConfig
from nereus.kernel.records import LogEntry, entry_from_json, entry_to_json
from nereus.storage.errors import StoreError
from nereus.storage.store import ShardStore

LOG_FORMAT = "nereus-log"
# 2: Admissions may carry a fence id and NOT_PUBLISHED outcomes a proof of absence (both
# optional fields, so a version-1 export still reads). 3: evidence may carry the destination's
# own message id (`broker_message_id`, Pulsar; optional as well).
LOG_VERSION = 3
READABLE_LOG_VERSIONS = frozenset({1, 2, 3})


class LogHeader(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    format: str
    version: int
    store_id: str
    shard_id: str
    config_fingerprint: str
    first_position: int
    last_position: int
    config: KernelConfig


def export_log(
    store: ShardStore,
    out: TextIO,
    to_position: int | None = None,
    on_entry: Callable[[int], None] | None = None,
) -> int:
    """Write the header and the entries up to `to_position` (default: the log's end);
    `on_entry(count)` after each entry written (a progress line). Returns the count."""
    last = store.log_last_position if to_position is None else to_position
    header = LogHeader(
        format=LOG_FORMAT,
        version=LOG_VERSION,
        store_id=store.header.store_id,
        shard_id=store.header.shard_id,
        config_fingerprint=store.header.config_fingerprint,
        first_position=store.log_info.floor,
        last_position=last,
        config=store.config,
    )
    out.write(msgspec.json.encode(header).decode() + "\n")
    count = 0
    for entry in store.iter_log(store.log_info.floor, last):
        out.write(entry_to_json(entry).decode() + "\n")
        count += 1
        if on_entry is not None:
            on_entry(count)
    return count


class JsonlLog:
    """A read-only log source over an exported file."""

    def __init__(self, path: str) -> None:
        self.path = path
        # Bytes, not text: msgspec refuses invalid UTF-8 as a DecodeError, which becomes the
        # StoreError below, where a text-mode read would raise UnicodeDecodeError instead.
        with open(path, "rb") as f:
            first = f.readline()
        try:
            self.header = msgspec.json.decode(first, type=LogHeader)
        except msgspec.MsgspecError as exc:
            raise StoreError(path, f"not a Nereus log export: {exc}", "line 1") from exc
        if self.header.format != LOG_FORMAT or self.header.version not in READABLE_LOG_VERSIONS:
            raise StoreError(
                path, f"unsupported log format {self.header.format} v{self.header.version}"
            )

    def check_config(self, config: KernelConfig) -> None:
        if self.header.config_fingerprint != config.fingerprint():
            raise StoreError(
                self.path,
                f"log was written under kernel configuration {self.header.config_fingerprint}, "
                f"this process has {config.fingerprint()}",
            )

    def entries(self, from_position: int = 1, to_position: int | None = None) -> Iterator[LogEntry]:
        expected = self.header.first_position
        with open(self.path, "rb") as f:
            f.readline()
            for line_no, line in enumerate(f, start=2):
                if not line.strip():
                    continue
                try:
                    entry = entry_from_json(line)
                except msgspec.MsgspecError as exc:
                    raise StoreError(self.path, f"bad log entry: {exc}", f"line {line_no}") from exc
                if entry.position != expected:
                    raise StoreError(
                        self.path,
                        f"position {entry.position} where {expected} was expected",
                        f"line {line_no}",
                    )
                expected += 1
                if entry.position < from_position:
                    continue
                if to_position is not None and entry.position > to_position:
                    return
                yield entry
        if expected - 1 != self.header.last_position and to_position is None:
            raise StoreError(
                self.path,
                f"log ends at position {expected - 1}, header says {self.header.last_position}",
            )


def import_log(path: str, dest: str, shard_id: str | None = None) -> ShardStore:
    """Create a new store at `dest` whose log is the exported one, and fold it under the
    configuration the log was written with."""
    source = JsonlLog(path)
    config = source.header.config
    source.check_config(config)
    if source.header.first_position != 1:
        raise StoreError(path, "only a log that starts at position 1 can be imported")
    store = ShardStore.open(dest, shard_id=shard_id or source.header.shard_id, config=config)
    if store.log_last_position != 0:
        store.close()
        raise StoreError(dest, "import target already holds a log")
    batch: list[LogEntry] = []
    for entry in source.entries():
        batch.append(entry)
        if len(batch) >= store.options.max_batch_entries:
            store.apply(batch)
            batch = []
    if batch:
        store.apply(batch)
    return store
