"""A fold request: what a caller asks of one `ShardStore.apply` besides the entries.

Theory of operation: three callers fold entries that did not come from `append`: a
Kafka-sourced shard (`adapters.kafka.log.KafkaLog`: the entries come from a topic partition),
a disk-backed replay or audit (a scratch store that only materializes state), and tests.
Each wants a little more written in the fold's one transaction, or a little less. Those
wishes travel together as one immutable value, as the `eventsourcing` library carries a
tracking record beside the events it records: whatever is in the request is written in the
same transaction as the fold, or not at all.

* `source` — the Kafka offset of the last record folded (`LogSource`): the tracking record,
  where a restarted owner resumes.
* `payloads` — the payload bytes the batch's schedules carried, by log position.
  `payloads_checked`: the caller already matched each to its schedule's digest (so it is not
  hashed again; its size still is checked).
* `claims` — writes the runtime's claim rows (`storage.claims.ClaimRows`) in the same
  transaction.
* `before_commit` — sees the fold's results while the transaction is still open (to produce
  replies first); if it raises, nothing of the batch is written.
* `mirror` — write entries that extend the local log into it (the default). A scratch store
  that only materializes state passes False: its log stays empty.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final

from nereus.kernel.records import Payload
from nereus.storage.claims import ClaimWriter
from nereus.storage.fold import Applied
from nereus.storage.schema import LogSource


@dataclass(frozen=True, slots=True)
class FoldRequest:
    """The options of one fold (see the module docstring); the default asks for nothing."""

    source: LogSource | None = None
    payloads: Mapping[int, Payload] | None = None
    payloads_checked: bool = False
    claims: ClaimWriter | None = None
    before_commit: Callable[[list[Applied]], None] | None = None
    mirror: bool = True


# The two requests callers without options make, built once.
PLAIN: Final = FoldRequest()
STATE_ONLY: Final = FoldRequest(mirror=False)
