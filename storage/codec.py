"""Framing of every value Nereus writes to LMDB.

Theory of operation: LMDB checks its own page structure but not the bytes of values, so a
flipped bit in a value would otherwise decode into a plausible wrong row. Every value is
stored as `crc32(body) (4 bytes, big-endian) + body`, where body is msgpack; reads verify the
checksum before decoding and raise `CorruptRecord` naming the table and key.

Table rows (schema 6) are msgpack arrays of the value's fields in declaration order, not maps:
a message row drops from ~720 to ~290 bytes and its encoding costs half, because the field
names are neither written nor matched. The kernel's value types keep their map form
everywhere else (state digests, snapshots, replies); only the store's rows are positional, so
storage decodes them through a positional twin of each type and builds the kernel value from
it. A field added at the end with a default reads from an older row without it, as before.
Nested values (a message's capability and evidence) keep their map form. Schema 5 rows
(maps) are rewritten by the schema 5 -> 6 migration, which reads them with `decode_map_row`.
"""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec

from nereus.kernel.model import VALUE_TYPES, Table, Value
from nereus.kernel.native import checksum_ok

# Re-exported: the framing is storage's, and its users import it from here.
from nereus.kernel.native import frame as frame  # noqa: PLC0414
from nereus.kernel.records import LogEntry
from nereus.storage.errors import CorruptRecord

T = TypeVar("T")

_encoder = msgspec.msgpack.Encoder()


def _positional_twin(kind: type[Value]) -> type[msgspec.Struct]:
    """A struct with `kind`'s fields, types and defaults, decoded from an array."""
    fields: list[tuple[str, Any] | tuple[str, Any, Any]] = []
    for f in msgspec.structs.fields(kind):
        if f.default is not msgspec.NODEFAULT:
            fields.append((f.name, f.type, f.default))
        else:
            fields.append((f.name, f.type))
    return msgspec.defstruct(
        f"Stored{kind.__name__}",
        fields,
        array_like=True,
        frozen=True,
        gc=False,
        forbid_unknown_fields=True,
    )


_DECODERS: dict[Table, msgspec.msgpack.Decoder[Any]] = {
    table: msgspec.msgpack.Decoder(_positional_twin(kind)) for table, kind in VALUE_TYPES.items()
}
_MAP_DECODERS: dict[Table, msgspec.msgpack.Decoder[Any]] = {
    table: msgspec.msgpack.Decoder(kind) for table, kind in VALUE_TYPES.items()
}
_astuple = msgspec.structs.astuple
_ENTRY_DECODER = msgspec.msgpack.Decoder(LogEntry)


def _checksum_error(data: bytes) -> str | None:
    """What is wrong with a framed value's checksum, or None when it holds."""
    if checksum_ok(data):
        return None
    if len(data) < 4:
        return "value shorter than its checksum"
    return "checksum mismatch: the stored value is damaged"


def unframe(data: bytes, path: str, where: str) -> bytes:
    error = _checksum_error(data)
    if error is not None:
        raise CorruptRecord(path, error, where)
    return data[4:]


class _Memo:
    """Decoded rows by their stored bytes, for one table: decoding is a pure function of the
    bytes, so a row read again unchanged (a message read by discovery, then by the fold of its
    Admission, then by the fold of its outcome) is checked and decoded once, and a row this
    process wrote is never decoded at all. No snapshot can see a wrong value through it: a
    row is answered from here only when its bytes equal bytes that were checked (or made
    here). Rows are filed under their checksum, which every stored value starts with, so a
    lookup hashes four bytes, not the row. Two generations bound it: when the young one is
    full it becomes the old one, and the old one is dropped, so a row used in the last `rows`
    lookups or writes stays, at a cost of at most 2 * `rows` entries."""

    __slots__ = ("old", "rows", "young")

    def __init__(self, rows: int) -> None:
        self.rows = rows
        self.young: dict[int, tuple[bytes, Value]] = {}
        self.old: dict[int, tuple[bytes, Value]] = {}

    def get(self, data: bytes) -> Value | None:
        crc = int.from_bytes(data[:4], "big")
        found = self.young.get(crc)
        if found is None:
            found = self.old.get(crc)
            if found is None:
                return None
            self._put(crc, found)
        return found[1] if found[0] == data else None

    def put(self, data: bytes, value: Value) -> None:
        self._put(int.from_bytes(data[:4], "big"), (data, value))

    def _put(self, crc: int, row: tuple[bytes, Value]) -> None:
        young = self.young
        if len(young) >= self.rows:
            self.old = young
            young = self.young = {}
        young[crc] = row


# Per table; 4,096 rows a generation covers the rows a fire touches between two reads of
# them (a tick admits at most a few hundred) at a few MB.
MEMO_ROWS = 4096
_MEMOS: dict[Table, _Memo] = {table: _Memo(MEMO_ROWS) for table in VALUE_TYPES}


def remember(table: Table, data: bytes, value: Value) -> None:
    """File a row made elsewhere (a compiled fold writes rows as bytes) under the value the
    caller also holds, as `encode_row` files the rows it makes: the next read of those bytes
    is not decoded. `value` must be what the bytes decode to; the compiled folds' tests
    decode every row they filed and compare (`remembered`)."""
    _MEMOS[table].put(data, value)


def remembered(table: Table, data: bytes) -> Value | None:
    """The value filed for these bytes, if any (without decoding them)."""
    return _MEMOS[table].get(data)


def encode_value(value: Value | msgspec.Struct) -> bytes:
    return frame(_encoder.encode(value))


def encode_row(table: Table, value: Value) -> bytes:
    """A table row's stored bytes; the value is remembered for reads of those bytes."""
    data = frame(_encoder.encode(_astuple(value)))
    _MEMOS[table]._put(int.from_bytes(data[:4], "big"), (data, value))
    return data


def decode_value(table: Table, data: bytes, path: str, key: bytes) -> Value:
    memo = _MEMOS[table]
    found = memo.get(data)
    if found is not None:
        return found
    # The row is named only when something is wrong: the hot read path pays no formatting.
    error = _checksum_error(data)
    if error is None:
        try:
            stored = _DECODERS[table].decode(data[4:])
        except msgspec.MsgspecError as exc:
            error = f"undecodable {table.value} row: {exc}"
        else:
            value: Value = VALUE_TYPES[table](*_astuple(stored))
            memo.put(data, value)
            return value
    raise CorruptRecord(path, error, f"table {table.value}, key {key.hex()}")


def decode_map_row(table: Table, data: bytes, path: str, key: bytes) -> Value:
    """A row as schema 5 and earlier stored it (a map of field names): for the migration."""
    body = unframe(data, path, f"table {table.value}, key {key.hex()}")
    try:
        value: Value = _MAP_DECODERS[table].decode(body)
    except msgspec.MsgspecError as exc:
        raise CorruptRecord(
            path, f"undecodable {table.value} row: {exc}", f"table {table.value}, key {key.hex()}"
        ) from exc
    return value


def encode_entry(entry: LogEntry) -> bytes:
    return frame(_encoder.encode(entry))


def decode_entry(data: bytes, path: str, position: int) -> LogEntry:
    error = _checksum_error(data)
    if error is None:
        try:
            entry = _ENTRY_DECODER.decode(data[4:])
        except msgspec.MsgspecError as exc:
            error = f"undecodable log entry: {exc}"
        else:
            if entry.position == position:
                return entry
            error = f"entry claims position {entry.position}"
    raise CorruptRecord(path, error, f"shard log position {position}")


def decode_struct(kind: type[T], data: bytes, path: str, where: str) -> T:
    body = unframe(data, path, where)
    try:
        return msgspec.msgpack.decode(body, type=kind)
    except msgspec.MsgspecError as exc:
        raise CorruptRecord(path, f"undecodable {kind.__name__}: {exc}", where) from exc


def position_key(position: int) -> bytes:
    return position.to_bytes(8, "big")


def key_position(key: bytes) -> int:
    return int.from_bytes(key, "big")


def story_key(message_id: str, position: int, index: int) -> bytes:
    """message id (ASCII hex) + position (8 bytes BE) + batch item (2 bytes BE): a message's
    marks are exactly the keys with its id as prefix (ids have one length), in log order."""
    return message_id.encode() + position.to_bytes(8, "big") + index.to_bytes(2, "big")


def lane_index_key(tenant: str, queue: str, timeline_key: bytes) -> bytes:
    """tenant NUL queue NUL timeline-key: identities never contain NUL, so a lane's rows are
    exactly the keys with its prefix, in due order."""
    return lane_prefix(tenant, queue) + timeline_key


def timer_index_key(tenant: str, queue: str, timer_key: str) -> bytes:
    """tenant NUL queue NUL timer key: a queue's rows are exactly the keys with its lane
    prefix, in byte order of the timer key."""
    return lane_prefix(tenant, queue) + timer_key.encode()


def lane_prefix(tenant: str, queue: str) -> bytes:
    return tenant.encode() + b"\x00" + queue.encode() + b"\x00"
