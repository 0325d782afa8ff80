"""Readiness: whether this process serves every shard it should, and if not, why.

Theory of operation: liveness (`/healthz`) says the process runs; readiness (`/readyz`) says
a timer given to it now would be kept *and fire on time*. A process is ready only when the
set of reasons below is empty, so a load balancer or an orchestrator can hold traffic back
(or page someone) while it is not. The reasons are a closed list of codes (`REASON_CODES`,
documented in `specs/http.md`), each naming the shard it concerns where there is one:

* the shards this process should own are not settled yet (Kafka mode: before the group's
  assignment reached it, or before the service started);
* an owned shard is recovering (catching up on its log, or reopening after a fence);
* an owned shard halted (a gap in its log, a failed commit: it needs an operator);
* the clock cannot bound true time, so no timer would fire (`service.clock_bound`);
* the process is stopping.

Each implementation of the port gathers its own facts (`EmbeddedService.readiness`,
`KafkaService.readiness`);
`answer` turns them into the HTTP status and body, and is the one place that decides: ready
means no reason at all.
"""

from __future__ import annotations

from typing import Any, Final

import msgspec

from nereus.service.clock_bound import CLOCK_UNBOUNDED

OWNERSHIP_UNSETTLED: Final = "ownership_unsettled"
SHARD_RECOVERING: Final = "shard_recovering"
SHARD_HALTED: Final = "shard_halted"

STOPPING: Final = "stopping"

REASON_CODES: Final[dict[str, str]] = {
    OWNERSHIP_UNSETTLED: "the shards this process should own are not known yet (Kafka mode: "
    "the group's assignment has not reached it, or the service has not started)",
    SHARD_RECOVERING: "an owned shard is catching up on its log or reopening",
    SHARD_HALTED: "an owned shard halted on an error it must not guess past (a gap in its "
    "log, a failed commit): restart or repair it",
    CLOCK_UNBOUNDED: "the clock cannot bound true time: no timer is admitted or expired "
    "until it can (`--assume-clock-error-ms` states a bound)",
    STOPPING: "the process is stopping",
}


class Reason(msgspec.Struct, frozen=True, omit_defaults=True):
    """One reason this process is not ready: a code of `REASON_CODES`, the shard it
    concerns (None: the whole process) and a human detail."""

    code: str
    detail: str
    shard: int | None = None

    def __post_init__(self) -> None:
        if self.code not in REASON_CODES:
            raise ValueError(f"unknown readiness code {self.code!r}")


def shard_reasons(shard: int, *, halted: str | None, recovered: bool) -> list[Reason]:
    """What keeps one owned shard from serving (its clock is the process's: `clock_reason`)."""
    if halted is not None:
        return [Reason(SHARD_HALTED, f"halted: {halted}", shard)]
    if not recovered:
        return [Reason(SHARD_RECOVERING, "catching up on its log", shard)]
    return []


def clock_reason(measured: str | None) -> list[Reason]:
    """The process's clock (`service.clock_bound.clock_problem`): None when bounded."""
    if measured is None:
        return []
    return [Reason(CLOCK_UNBOUNDED, f"the clock cannot bound true time ({measured})")]


def answer(reasons: list[Reason]) -> tuple[int, dict[str, Any]]:
    """The status and body of `/readyz`: 200 `{"ready": true}` with no reason at all, else
    503 with every reason (one per code and shard, in a stable order)."""
    if not reasons:
        return 200, {"ready": True}
    unique = sorted(set(reasons), key=lambda r: (r.code, -1 if r.shard is None else r.shard))
    return 503, {"ready": False, "reasons": [msgspec.to_builtins(r) for r in unique]}
