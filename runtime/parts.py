"""The shard runtime's parts, built and connected once.

Theory of operation: a `ShardRuntime` (`runtime.shard`) is small parts, each owning its own
state: the settler (evidence searches at the destination), dead letters, recovery,
discovery and the effects runner. Who talks to whom is decided here, once, at construction:
recovery settles through the settler and owes dead letters, discovery checks its retries
with recovery, the effects runner admits claims, tells discovery about unavailable lanes and
records dead letters. The parts that learn of records for the next commit outside a gather
get the runtime's one `Deferred` queue. Nothing here runs per tick.
"""

from __future__ import annotations

from collections.abc import Callable

from nereus.runtime.claims import ClaimTable
from nereus.runtime.config import RuntimeConfig
from nereus.runtime.dead_letters import DeadLetters
from nereus.runtime.deferred import Deferred
from nereus.runtime.destination import Destination
from nereus.runtime.discovery import Discovery
from nereus.runtime.effects import EffectsRunner
from nereus.runtime.log import Logger
from nereus.runtime.metrics import Metrics
from nereus.runtime.recovery import Recovery
from nereus.runtime.settle import Settler
from nereus.storage.store import ShardStore


class Parts:
    """The connected parts of one shard runtime."""

    def __init__(
        self,
        store: ShardStore,
        destination: Destination,
        claims: ClaimTable,
        deferred: Deferred,
        wake: Callable[[], None],
        *,
        config: RuntimeConfig,
        metrics: Metrics,
        log: Logger,
    ) -> None:
        self.settler = Settler(
            destination,
            wake,
            retry_ms=config.evidence_retry_ms,
            retry_max_ms=config.evidence_retry_max_ms,
        )
        self.dead_letters = DeadLetters(
            store,
            destination,
            self.settler,
            config=config,
            metrics=metrics,
            log=log,
            deferred=deferred,
        )
        self.recovery = Recovery(
            store, destination, self.settler, self.dead_letters, config=config, log=log
        )
        self.discovery = Discovery(config, claims, destination, self.recovery.retry_checked, log)
        self.effects = EffectsRunner(
            store,
            claims,
            self.discovery,
            self.dead_letters,
            metrics=metrics,
            log=log,
            deferred=deferred,
        )
