"""Fewer, larger records: a tick's Admissions as one record, its outcomes as another, and
the commands a client sent together as a third.

Theory of operation: every record costs the log a write, an encoding, a checksum and a fold
step of its own, whatever it carries. A tick proposes its Admissions together (one owner, one
clock reading, one fence) and collects many outcomes at once, so each consecutive run of them
becomes one batch record (`kernel.records.batched`), which the reducer folds item by item
exactly as the single records (`kernel.records.members`). The commands of one submission
(a client's batch, for this shard) become one `COMMANDS_V1` record, their payloads beside
it, one per item; each command's reply is its item's outcome. Commands of different
submissions are never mixed in one record, and a submission holding anything but client
commands (an operator's gate, say) stays as it was sent. Runs are cut at `MAX_BATCH_ITEMS`
so that one record stays far below a broker's message size limit.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from nereus.kernel.records import (
    COMMAND_TYPES,
    Appendable,
    CommandBatch,
    PublishAdmission,
    PublishOutcome,
    Record,
    batched,
)

MAX_BATCH_ITEMS: Final = 500


def _run_key(record: Record) -> object:
    """Records with equal keys may share a batch record; None never batches."""
    if isinstance(record, PublishOutcome):
        return "outcome"
    if isinstance(record, PublishAdmission):
        return (record.owner, record.interval, record.fence_id)
    return None


def _is_commands(unit: Sequence[Appendable]) -> bool:
    return all(isinstance(record, COMMAND_TYPES) for record, _payload in unit)


def command_record(unit: Sequence[Appendable]) -> Appendable:
    """A run of client commands (at most `MAX_BATCH_ITEMS`) as the record that carries it:
    itself if it is one, else a `COMMANDS_V1` batch with one payload slot per item (None
    when no item has bytes)."""
    if len(unit) == 1:
        return unit[0]
    payloads: list[bytes | None] = []
    for _record, payload in unit:
        assert not isinstance(payload, tuple), "a command carries one payload or none"
        payloads.append(payload)
    record = CommandBatch(tuple(r for r, _p in unit if isinstance(r, COMMAND_TYPES)))
    return record, tuple(payloads) if any(p is not None for p in payloads) else None


def batch_runs(
    items: Sequence[Appendable], units: Sequence[tuple[int, int]] = ()
) -> tuple[list[Appendable], list[tuple[int, int]]]:
    """`items` with each consecutive run of batchable records made one batch record, and
    each submission of several commands (`units`: the index of its first item, its count)
    made one; and for each original item, the index of the item that now carries it and
    its index among that record's items (0 for a record not batched)."""
    out: list[Appendable] = []
    where: list[tuple[int, int]] = []
    run: list[Record] = []
    run_key: object = None

    def close() -> None:
        if run:
            out.append((batched(run), None))
            run.clear()

    unit_at = dict(units)
    skip_to = 0
    for i, (record, payload) in enumerate(items):
        if i < skip_to:
            continue
        count = unit_at.get(i, 0) if unit_at else 0
        if count > 1 and _is_commands(items[i : i + count]):
            close()
            run_key = None
            for at in range(i, i + count, MAX_BATCH_ITEMS):
                chunk = items[at : min(at + MAX_BATCH_ITEMS, i + count)]
                where.extend((len(out), k) for k in range(len(chunk)))
                out.append(command_record(chunk))
            skip_to = i + count
            continue
        key = _run_key(record) if payload is None else None
        if key is None or key != run_key or len(run) >= MAX_BATCH_ITEMS:
            close()
        if key is None:
            where.append((len(out), 0))
            out.append((record, payload))
        else:
            where.append((len(out), len(run)))
            run.append(record)
        run_key = key
    close()
    return out, where
