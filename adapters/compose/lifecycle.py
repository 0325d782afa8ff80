"""What every mode of a composed service does around serving: the collector, the signals,
the start-up line about authentication, and a stop that cannot hang.

Theory of operation: a service process runs until SIGTERM or SIGINT (or its supervisor's
end, `adapters.compose.lifeline`) sets one stop event; it then runs its stopping steps in
order, on a thread, for at most `--stop-timeout-s`. A step still running then (a broker that
does not answer, say) is abandoned and the process exits at once with code 1: what it held
is durable or settled by the next start, never lost. Only the service tunes the cyclic
garbage collector (`tune_gc`): an embedding program owns its process's collector.
"""

from __future__ import annotations

import gc
import os
import signal
import sys
import threading
import time
from collections.abc import Callable

from nereus.adapters.tenancy import Tenancy
from nereus.runtime.log import Logger

# The cyclic garbage collector's thresholds for the service's process. The fire path and the
# intake make and drop many small containers per timer, almost none of them in a cycle, so
# the default (a young-generation pass every 700 allocations) spends ~4 % of a fired timer's
# instructions walking objects that reference counting frees anyway (callgrind, bench.cost's
# fire: 758k -> 726k per timer). Cycles still get collected, a little later.
GC_THRESHOLDS = (100_000, 50, 100)


def tune_gc() -> None:
    """Collect what start-up made, keep it out of later passes, and collect less often.
    Only the service does this: an embedding program owns its process's collector."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def stop_on_signals(stop: threading.Event) -> None:
    """SIGTERM and SIGINT ask for the stop (from here on, not the default handlers)."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())


def log_auth(tenancy: Tenancy, log: Logger) -> None:
    if tenancy.auth_disabled:
        log.warning(
            "auth_disabled",
            detail="no --config: one tenant 'default', no credentials, every grant, loopback only",
        )
    else:
        log.info(
            "tenancy",
            config=tenancy.source,
            tenants=sorted(tenancy.tenants),
            tokens=len(tenancy.credentials),
        )


def stop_within(timeout_s: float, log: Logger, code: int, *steps: Callable[[], None]) -> int:
    """Run the stopping steps, for at most `timeout_s`. A step still running then (a broker
    that does not answer, say) is abandoned and the process exits at once with code 1: what
    it held is durable or settled by the next start, never lost."""
    started = time.monotonic()
    done = threading.Event()

    def run() -> None:
        for step in steps:
            step()
        done.set()

    threading.Thread(target=run, name="nereus-stop", daemon=True).start()
    if done.wait(timeout_s):
        log.info("stopped", took_ms=int((time.monotonic() - started) * 1000))
        return code
    log.error("stop_timeout", timeout_s=timeout_s, detail="exiting with work still running")
    sys.stderr.flush()
    os._exit(1)
