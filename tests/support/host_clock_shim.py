"""`python -m tests.support.host_clock_shim ARGS...`: the `nereus` command on a host clock the test
chooses, so a test of `nereus serve`'s clock rules never depends on this machine's clock.

Theory of operation: `SystemClock` reads its host through `LinuxHost` (`adapters/clock.py`).
Before the command runs, this shim replaces that host's synchronisation report with the one
named by the environment variable `NEREUS_TEST_HOST_CLOCK` (read here only; the product never
reads it):

* `unsynchronised`: the host answers with STA_UNSYNC set (as an unsynchronised Linux does);
* `no_reading`: the host gives no report at all (no adjtimex);
* `synchronised:US`: synchronised, with a maximum error of US microseconds.

The wall and monotonic clocks stay the machine's own: only the claim about them changes.
"""

from __future__ import annotations

import os
import sys

ENV = "NEREUS_TEST_HOST_CLOCK"


def _report(spec: str) -> object:
    from nereus.adapters.clock import SyncReport  # noqa: PLC0415

    if spec == "unsynchronised":
        return SyncReport(synchronized=False, max_error_us=16_000_000)
    if spec == "no_reading":
        return None
    name, _, error_us = spec.partition(":")
    if name == "synchronised" and error_us.isdigit():
        return SyncReport(synchronized=True, max_error_us=int(error_us))
    raise SystemExit(f"{ENV}={spec!r}: want unsynchronised, no_reading or synchronised:US")


def _run() -> int:
    # As `python -m nereus` does: choose the kernel's build before any compiled import.
    from nereus.runtime import compiled  # noqa: PLC0415

    compiled.from_environment()
    from nereus.adapters import clock  # noqa: PLC0415
    from nereus.adapters.cli.main import main  # noqa: PLC0415

    report = _report(os.environ[ENV])
    clock.LinuxHost.sync_report = lambda self: report  # type: ignore[method-assign,assignment,return-value]
    return main()


if __name__ == "__main__":
    sys.exit(_run())
