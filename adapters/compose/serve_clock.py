"""The clock of `nereus serve`: refused at start when it cannot bound true time.

Theory of operation: an unbounded clock makes every time decision PAUSE, so a service
started on one accepts timers and fires none (`service.clock_bound`). `nereus serve`
therefore reads the host clock before it opens anything that takes time or resources (after
the configuration is checked, before the store, the listening socket or a broker) and refuses
to start, with one `refused` log line and a message for the person at the terminal, unless
`--assume-clock-error-ms` gives a bound or `--allow-unbounded-clock` says to start anyway,
in which case `/readyz` answers 503 `clock_unbounded` until the host clock is bounded. The
flags are parsed by `adapters.cli.serve`.
"""

from __future__ import annotations

import argparse
import sys

from nereus.adapters.clock import SystemClock
from nereus.runtime.log import Logger
from nereus.service.clock_bound import CLOCK_UNBOUNDED, cli_refusal, clock_problem


def serve_clock(args: argparse.Namespace, log: Logger) -> SystemClock | None:
    """The host clock, with the operator's assumed error if any; None when it cannot bound
    true time and the operator did not allow that (refused: logged and said on stderr)."""
    clock = SystemClock(assumed_error_ms=args.assume_clock_error_ms)
    measured = clock_problem(clock)
    if measured is None:
        status = clock.describe()
        if status.assumed:
            log.warning("clock_error_assumed", error_bound_ms=status.error_bound_ms)
        return clock
    if not args.allow_unbounded_clock:
        log.error(
            "refused",
            reason=CLOCK_UNBOUNDED,
            measured=measured,
            detail=f"the clock cannot bound true time ({measured}): give "
            "--assume-clock-error-ms N or --allow-unbounded-clock",
        )
        print(cli_refusal(measured), file=sys.stderr, flush=True)
        return None
    log.warning(
        CLOCK_UNBOUNDED,
        measured=measured,
        detail="--allow-unbounded-clock: nothing is admitted or expired, and /readyz answers "
        "503, until the clock is bounded",
    )
    return clock
