"""The runtime reads time only from its clock source: no module under runtime/ imports a
clock (`time`, `datetime`) of its own, so a tick does the same with the same readings on any
thread, in the loop, on a caller's thread or in the simulator.

One exception, named here: the embedded shard log times its group commits for the
`nereus_commit_duration_seconds` histogram, a measurement that decides nothing.

The readings themselves come from the clock source (adapters/clock.py `SystemClock` in
production), whose trusted interval must hold true time: a table of host readings worked out
by hand, each at a bound of the host's claims (the property over many such hosts is
tests/adapters/test_clock_props.py).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

from nereus.adapters.clock import SystemClock
from nereus.kernel.timing import UNBOUNDED
from tests.support.host_clock import EPOCH_NS, ScriptedHost

RUNTIME = Path(__file__).resolve().parents[2] / "runtime"
CLOCKS = {"time", "datetime"}
MEASURES_ONLY = {"shardlog.py"}


def _clock_imports(path: Path) -> list[str]:
    found: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.split(".")[0] in CLOCKS]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            module = node.module or ""
            found += [module] if module.split(".")[0] in CLOCKS else []
    return found


def test_no_runtime_module_reads_a_clock_of_its_own() -> None:
    modules = sorted(RUNTIME.glob("*.py"))
    assert len(modules) > 10
    reading = {p.name: _clock_imports(p) for p in modules}
    assert {name for name, found in reading.items() if found} == MEASURES_ONLY


# The clock source the runtime reads: its interval by hand ----------------------------------

T_MS = EPOCH_NS // 1_000_000


@dataclass(frozen=True)
class Reading:
    """A host at sample time (true time, wall clock offset, reported error), then
    `mono_elapsed_ns` later with true time `true_elapsed_ns` on; the interval expected then,
    worked out by hand from the rule: [wall - error - drift, wall + error + drift], the
    earliest end rounded down and the latest up to whole milliseconds."""

    case: str
    true_ns: int
    wall_offset_ns: int
    max_error_us: int | None
    mono_elapsed_ns: int
    true_elapsed_ns: int
    expected: tuple[int, int] | None  # (earliest_ms, latest_ms); None: UNBOUNDED
    assumed_error_ms: int | None = None


READINGS = (
    Reading(
        # true T+0.4 ms read exactly, good to 1 µs: [T+0.399, T+0.401] -> [T, T+1]
        "sub-millisecond-true-time",
        EPOCH_NS + 400_000, 0, 1, 0, 0, (T_MS, T_MS + 1),
    ),
    Reading(
        # true T+0.999999 ms, wall exact, error 0: [T, T+1], never [T+1, T+1]
        "a-nanosecond-before-a-millisecond",
        EPOCH_NS + 999_999, 0, 0, 0, 0, (T_MS, T_MS + 1),
    ),
    Reading(
        # wall T+1 ms (true T), 1 s of monotonic time during which true time moved 999.5 ms:
        # wall now T+1001, error 1 ms + 0.5 ms drift: [T+999.5, T+1002.5] -> [T+999, T+1003]
        "wall-high-monotonic-fast-1s",
        EPOCH_NS, 1_000_000, 1_000, 1_000_000_000, 999_500_000, (T_MS + 999, T_MS + 1_003),
    ),
    Reading(
        # wall T-1 ms, true moved 1000.5 ms: wall now T+999, [T+997.5, T+1000.5] -> [T+997, T+1001]
        "wall-low-monotonic-slow-1s",
        EPOCH_NS, -1_000_000, 1_000, 1_000_000_000, 1_000_500_000, (T_MS + 997, T_MS + 1_001),
    ),
    Reading(
        # an hour unsampled, error 0, 500 ppm of an hour is 1.8 s either way
        "an-hour-unsampled",
        EPOCH_NS, 0, 0, 3_600_000_000_000, 3_601_800_000_000,
        (T_MS + 3_598_200, T_MS + 3_601_800),
    ),
    Reading(
        "unsynchronised-unbounded",
        EPOCH_NS, 0, None, 5_000_000, 5_000_000, None,
    ),
    Reading(
        # wall T+5 ms (the assumption's edge), 2 ms on: wall T+7, error 5 ms + 1 µs drift:
        # [T+1.999, T+12.001] -> [T+1, T+13]
        "unsynchronised-assumed-5ms",
        EPOCH_NS, 5_000_000, None, 2_000_000, 2_000_000, (T_MS + 1, T_MS + 13), 5,
    ),
)  # fmt: skip


@pytest.mark.parametrize("r", READINGS, ids=[r.case for r in READINGS])
def test_the_system_clocks_interval_holds_true_time(r: Reading) -> None:
    host = ScriptedHost(
        r.true_ns,
        drift_ppm=500,
        max_error_us=r.max_error_us,
        assumed_error_ms=r.assumed_error_ms,
        wall_offset_ns=r.wall_offset_ns,
    )
    clock = SystemClock(
        assumed_error_ms=r.assumed_error_ms,
        drift_ppm=500,
        sample_interval_ms=7_200_000,  # no new sample: the drift allowance is what holds
        host=host,
    )
    host.advance(r.mono_elapsed_ns, r.true_elapsed_ns)
    interval = clock.interval()
    if r.expected is None:
        assert interval == UNBOUNDED
        return
    assert (interval.earliest_ms, interval.latest_ms) == r.expected
    true_ns = host.true_ns
    assert interval.earliest_ms * 1_000_000 <= true_ns <= interval.latest_ms * 1_000_000


def test_the_host_clock_finds_adjtimex_once_not_at_every_sample(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Finding libc runs `ldconfig -p` in a child process: done at every sample, it held
    the clock's lock for milliseconds once a second, beside the fire path."""
    import ctypes.util  # noqa: PLC0415

    from nereus.adapters import clock  # noqa: PLC0415

    lookups: list[str] = []
    real = ctypes.util.find_library

    def counting(name: str) -> str | None:
        lookups.append(name)
        return real(name)

    clock._adjtimex.cache_clear()
    monkeypatch.setattr(ctypes.util, "find_library", counting)
    reports = [clock.read_adjtimex() for _ in range(5)]
    host = clock.SystemClock(assumed_error_ms=1.0, sample_interval_ms=0)
    for _ in range(5):
        host.interval()
    assert len(lookups) <= 1
    assert len({r is None for r in reports}) == 1  # every sample read the same way
