"""The console's audits under `nereus serve --processes N`: any shard's, from any process.

Theory of operation: an audit runs beside the process holding the shard's store, as a child
of it (`adapters.http.console.audit`), and each process keeps its own audits. Behind the one
HTTP port a page may be answered by any process, so `MachineAudits` asks the siblings over
their private port (`Siblings`, `/inspect`, answered by `adapters.kafka.inspect.answer_sibling`
from each sibling's own audits): `audit_jobs` gathers every process's jobs, `audit_start`
starts the audit of a shard in the first process that holds it. What crosses the port is an
`AuditView`, a copy of the job. A sibling that does not answer is left out, as for the other
console reads: its audits are not shown, and a shard only it holds cannot be audited.
"""

from __future__ import annotations

from typing import Any, Final

from nereus.adapters.kafka.siblings import Siblings
from nereus.service.audit_view import AuditPort, AuditView

# What a sibling's audits answer (`MachineAudits`): the one call here that acts, starting
# an audit of a shard that sibling holds.
AUDIT_CALLS: Final[dict[str, Any]] = {
    "audit_jobs": dict[int, AuditView],
    "audit_start": AuditView | None,
}


class MachineAudits:
    """The console's audits under `--processes`: a shard's audit runs beside the process
    holding it, asked for by whichever process answered the page."""

    def __init__(self, local: AuditPort, siblings: Siblings) -> None:
        self.local = local
        self.siblings = siblings

    def jobs(self) -> dict[int, AuditView]:
        """Every process's latest audit of each shard (a shard that moved between processes
        may have one in each: the newest is shown)."""
        found = self.local.jobs()
        for part in self.siblings.inspect("audit_jobs", [], AUDIT_CALLS["audit_jobs"]):
            for shard, view in part.items():
                if shard not in found or view.started_at_ms > found[shard].started_at_ms:
                    found[shard] = view
        return found

    def start(self, shard: int, by: str) -> AuditView | None:
        here = self.local.start(shard, by)
        if here is not None:
            return here
        view: AuditView | None = self.siblings.first(
            "audit_start", [shard, by], AUDIT_CALLS["audit_start"]
        )
        return view
