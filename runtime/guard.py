"""The last check before a command is queued: can the shard log carry it?

Theory of operation: the runtime appends and folds a tick's commands in one commit; a record
that cannot be written, or that is written but does not read back as the record it claims to
be (a naive `datetime` in an int field is written as a string), would be found only inside
that commit, which then halts the shard for every caller. So `ShardRuntime.submit` hands each
item here first: it must be a record of the catalogue with bytes or nothing beside it, it must
survive the log's own encoding and decoding, and a schedule's bytes must match the digest and
size it names (the store refuses a mismatch inside the commit). A refused item raises
`TypeError`/`ValueError` to its caller and nothing of the submission is queued. The library
checks its arguments before this (`service.arguments`), so there this is defence in
depth; whatever else submits records gets the same protection.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import get_args

import msgspec

from nereus.kernel.records import (
    Appendable,
    CommandBatch,
    Record,
    Schedule,
    decode_record,
    encode_record,
    record_type,
)
from nereus.kernel.validation import payload_matches

_RECORD_TYPES: tuple[type, ...] = get_args(Record)


def check_items(items: Sequence[Appendable]) -> None:
    """Raise TypeError/ValueError naming the first item the log could not carry."""
    guarded(items)


def guarded(items: Sequence[Appendable]) -> list[Appendable]:
    """`items` with each record replaced by the record its log encoding decodes to (what a
    replay of the log will fold), after the checks of `check_items`. The store folds such a
    command as it is, without decoding it again (`ShardStore.commit(guarded=True)`)."""
    out: list[Appendable] = []
    for index, item in enumerate(items):
        if not isinstance(item, tuple) or len(item) != 2:
            raise TypeError(f"item {index}: expected a (record, payload) pair")
        record, payload = item
        if not isinstance(record, _RECORD_TYPES):
            raise TypeError(f"item {index}: {type(record).__name__} is not a shard log record")
        name = record_type(record)
        try:
            decoded = decode_record(encode_record(record))
        except (msgspec.MsgspecError, OverflowError, UnicodeError, TypeError, ValueError) as exc:
            raise ValueError(f"item {index}: the log cannot carry this {name}: {exc}") from None
        if isinstance(decoded, CommandBatch):
            if payload is not None and (
                not isinstance(payload, tuple) or len(payload) != len(decoded.items)
            ):
                raise TypeError(
                    f"item {index} ({name}): the payloads must be None or one per command"
                )
            for n, member in enumerate(decoded.items):
                _check_payload(f"item {index}.{n}", member, None if payload is None else payload[n])
        else:
            _check_payload(f"item {index}", decoded, payload)
        out.append((decoded, payload))
    return out


def _check_payload(where: str, record: Record, payload: object) -> None:
    name = record_type(record)
    if payload is not None and not isinstance(payload, bytes):
        raise TypeError(f"{where} ({name}): the payload must be bytes or None")
    if not isinstance(record, Schedule):
        if payload is not None:
            raise ValueError(f"{where}: {name} carries no payload")
    elif payload is not None and not payload_matches(record, payload):
        raise ValueError(
            f"{where}: the payload bytes do not match the schedule's payload_digest "
            "and payload_size"
        )
