"""Whether a clock source bounds true time now, and what to say when it does not.

Theory of operation: without a bound the trusted interval is unbounded, `decide` answers
PAUSE for every timer, and nothing is admitted or expired (`specs/time.md`). That rule is
what keeps a send from ever being early, so it stays; what must not happen is that a process
starts in that state and says nothing. Whoever starts a runtime asks `clock_problem` first:
None while the clock's interval is bounded, else what the clock source reported (the host
said it is unsynchronised, or gave no reading at all). The library raises `ClockUnbounded`
at `start()` naming its keywords; `nereus serve` refuses to start naming its flags. Either
may be told to start anyway, and then reports not-ready (`/readyz`) and `clock_unbounded` in
the `lastError` of every SCHEDULED timer it holds until the clock is bounded.
"""

from __future__ import annotations

from nereus.runtime.clock import ClockSource

# The code a readiness reason and a waiting timer's lastError carry (specs/http.md).
CLOCK_UNBOUNDED = "clock_unbounded"


class ClockUnbounded(RuntimeError):
    """The clock cannot bound true time, so no timer would ever fire: raised by `start()`
    unless the application allowed an unbounded clock. `measured` is what the clock source
    reported."""

    def __init__(self, message: str, measured: str) -> None:
        super().__init__(message)
        self.measured = measured


def clock_problem(clock: ClockSource) -> str | None:
    """None when the clock bounds true time now; else what its source reported."""
    if clock.interval().bounded:
        return None
    return clock.describe().source


def library_refusal(measured: str) -> ClockUnbounded:
    """The error of a library `start()` on an unbounded clock: what was measured and the two
    keywords that settle it."""
    return ClockUnbounded(
        f"the clock cannot bound true time (measured: {measured}), so no timer "
        "would fire. Synchronise the host clock (NTP, chrony), or pass "
        "assume_clock_error_ms=N for an error bound you vouch for, or pass "
        "allow_unbounded_clock=True to start anyway (nothing fires until the clock is "
        "bounded; peek shows lastError 'clock_unbounded').",
        measured,
    )


def cli_refusal(measured: str) -> str:
    """The human message of `nereus serve` refusing to start on an unbounded clock."""
    return (
        f"nereus serve: refusing to start: the clock cannot bound true time (the host "
        f"reported: {measured}), so no timer would fire.\n"
        "  Fix the host clock (run NTP or chrony until it reports synchronised), or\n"
        "  pass --assume-clock-error-ms N to vouch for an error bound of N ms, or\n"
        "  pass --allow-unbounded-clock to start anyway: nothing fires and /readyz answers "
        "503 (clock_unbounded) until the clock is bounded."
    )
