"""Fewer, larger records: a tick's Admissions as one record, its outcomes as another.

Theory of operation: every record costs the log a write, an encoding, a checksum and a fold
step of its own, whatever it carries. A tick proposes its Admissions together (one owner, one
clock reading, one fence) and collects many outcomes at once, so each consecutive run of them
becomes one batch record (`kernel.records.batched`), which the reducer folds item by item
exactly as the single records (`kernel.records.members`). Runs are cut at `MAX_BATCH_ITEMS`
so that one record stays far below a broker's message size limit. Commands are never
batched: each one's reply is the outcome at its own position.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from nereus.kernel.records import PublishAdmission, PublishOutcome, Record, batched
from nereus.storage.store import Appendable

MAX_BATCH_ITEMS: Final = 500


def _run_key(record: Record) -> object:
    """Records with equal keys may share a batch record; None never batches."""
    if isinstance(record, PublishOutcome):
        return "outcome"
    if isinstance(record, PublishAdmission):
        return (record.owner, record.interval, record.fence_id)
    return None


def batch_runs(items: Sequence[Appendable]) -> tuple[list[Appendable], list[int]]:
    """`items` with each consecutive run of batchable records made one batch record, and
    for each original item the index of the item that now carries it."""
    out: list[Appendable] = []
    where: list[int] = []
    run: list[Record] = []
    run_key: object = None

    def close() -> None:
        if run:
            out.append((batched(run), None))
            run.clear()

    for record, payload in items:
        key = _run_key(record) if payload is None else None
        if key is None or key != run_key or len(run) >= MAX_BATCH_ITEMS:
            close()
        if key is None:
            out.append((record, payload))
        else:
            run.append(record)
        run_key = key
        where.append(len(out) if key is not None else len(out) - 1)
    close()
    return out, where
