"""The claims table, behind a small port: the runtime's claim rows, read at start and written
inside the store's commit.

Theory of operation: claims (`runtime.claims`) are not facts of the log. They are kept so a
restarted process knows which claims died with its predecessor, and so the claim sequence
(attempt ids are built from it) never repeats. The table holds one row per persisted claim,
keyed `c` + its sequence (8 bytes, big-endian: a commit's new claims land side by side in one
or two B-tree pages, where message ids would spread them over all of them), and one row for
the sequence itself.

The runtime never touches the table: at start it asks `read_claims` for the sequence and how
many rows a gone process left; on each commit it hands the store a writer, and the store
calls it with a `ClaimRows` bound to the commit's (or fold's) own write transaction, so the
claims a commit's Admissions name are durable with them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

import msgspec

from nereus.storage.codec import encode_value
from nereus.storage.env import Env

_SEQ_KEY: Final = b"\x00claim_sequence"
_CLAIM_PREFIX: Final = b"c"


def read_claims(env: Env) -> tuple[int, int]:
    """The claim sequence and the number of claim rows, as stored."""
    with env.env.begin() as txn:
        raw = txn.get(_SEQ_KEY, db=env.claims)
        sequence = 0 if raw is None else int.from_bytes(raw, "big")
        rows = 0
        with txn.cursor(db=env.claims) as cursor:
            for key in cursor.iternext(values=False):
                if key != _SEQ_KEY:
                    rows += 1
    return sequence, rows


class ClaimRows:
    """The claims table inside one write transaction."""

    def __init__(self, txn: Any, env: Env) -> None:
        self._txn = txn
        self._db = env.claims

    def write(
        self,
        puts: Mapping[int, msgspec.Struct],
        deletes: Iterable[int],
        sequence: int,
        *,
        wipe: bool = False,
    ) -> None:
        """Apply a batch of changes: first (with `wipe`) delete every claim row, then the
        rows of the claims `deletes` names, then put each row of `puts` by its sequence,
        and record `sequence` as the claim sequence."""
        txn, db = self._txn, self._db
        if wipe:
            with txn.cursor(db=db) as cursor:
                doomed = [k for k in cursor.iternext(values=False) if k != _SEQ_KEY]
            for key in doomed:
                txn.delete(key, db=db)
        for seq in deletes:
            txn.delete(_CLAIM_PREFIX + seq.to_bytes(8, "big"), db=db)
        for seq, row in puts.items():
            txn.put(_CLAIM_PREFIX + seq.to_bytes(8, "big"), encode_value(row), db=db)
        txn.put(_SEQ_KEY, sequence.to_bytes(8, "big"), db=db)


ClaimWriter = Callable[[ClaimRows], None]
