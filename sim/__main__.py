"""`python -m nereus.sim --seeds N [--seed S] [--steps K] [-v] [--sync]`: run seeds S .. S+N-1.

Prints one summary line of figures at the end (for the reliability report). On the first
failing seed it prints the failure and a one-line reproduce command and exits 1.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter

from nereus.sim import DEFAULT_STEPS, SimFailure, run_seed


def summary(figures: Counter[str], seconds: float) -> str:
    """The figures a reliability report quotes, on one line."""
    crashes = {k[6:]: v for k, v in sorted(figures.items()) if k.startswith("crash_")}
    faults = {
        "retriable": figures["send_retriable"],
        "permanent": figures["send_permanent"],
        "lane_unavailable": figures["send_lane_unavailable"],
        "timeout_after_write": figures["send_timeout_after_write"],
        "timeout_before_write": figures["send_timeout_before_write"],
        "duplicate_report": figures["fault_duplicate_report"],
        "slow_ack": figures["fault_slow_ack"],
        "find_miss": figures["fault_find_miss"],
    }
    clock = {
        "steps": figures["clock_step"],
        "backwards": figures["clock_step_backwards"],
        "sync_lost": figures["clock_lose_sync"],
        "error_grown": figures["clock_grow"],
        "resync": figures["clock_resync"],
    }
    ends = {k[6:]: v for k, v in sorted(figures.items()) if k.startswith("final_")}
    dlq_faults = sum(
        v for k, v in figures.items() if k.startswith("dlq_send_") and k != "dlq_send_ok"
    )
    parts = [
        f"seeds={figures['seeds']}",
        f"steps={figures['steps']}",
        f"ticks={figures['ticks']}",
        f"seconds={seconds:.1f}",
        f"crashes={figures['crashes']} {_fmt(crashes)}",
        f"destination_faults={sum(faults.values())} {_fmt(faults)}",
        f"clock_events={sum(clock.values())} {_fmt(clock)}",
        f"messages_checked={figures['generations_checked']}"
        f" (keys={figures['keys_checked']}) {_fmt(ends)}",
        f"sends_ok={figures['send_ok']} writes={figures['writes']}"
        f" duplicate_writes={figures['duplicate_writes']}",
        f"dead_lettered={figures['dead_lettered']}"
        f" dlq_copies_recorded={figures['code_dead_letter_recorded']}"
        f" dlq_writes={figures['dlq_writes']} dlq_write_faults={dlq_faults}"
        f" dlq_duplicate_writes={figures['dlq_duplicate_writes']}"
        f" dlq_duplicate_reports={figures['code_dead_letter_not_pending']}"
        f" dlq_copies_of_superseded={figures['dlq_copies_of_superseded']}"
        f" dlq_owed_at_crash={figures['dlq_owed_at_crash']}",
        f"open_unknown={figures['open_unknown_attempts']}"
        f" proven_absent={figures['proven_absent']}"
        f" proof_refused={figures['code_outcome_proof_invalid']}",
        f"lies={_fmt(_prefixed(figures, 'lie_'))} reached={_fmt(_prefixed(figures, 'reach_'))}",
        f"clock_edges=(landed={_fmt(_prefixed(figures, 'clock_landed_'))}"
        f" step_back_before_send={figures['clock_step_back_before_send']}"
        f" sends_held={figures['sends_held_by_step_back']})",
        f"log_entries={figures['log_entries']}",
    ]
    return "sim: " + " | ".join(parts)


def _prefixed(figures: Counter[str], prefix: str) -> dict[str, int]:
    return {k[len(prefix) :]: v for k, v in sorted(figures.items()) if k.startswith(prefix)}


def _fmt(d: dict[str, int]) -> str:
    return "(" + " ".join(f"{k}={v}" for k, v in d.items()) + ")"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nereus.sim", description=__doc__)
    parser.add_argument("--seeds", type=int, default=1, help="how many seeds (default 1)")
    parser.add_argument("--seed", type=int, default=0, help="the first seed (default 0)")
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS, help="steps per seed")
    parser.add_argument("--sync", action="store_true", help="fsync every commit")
    parser.add_argument("-v", "--verbose", action="store_true", help="print the event trace")
    parser.add_argument(
        "--no-edge-faults",
        action="store_true",
        help="draw none of the send-gate, rule-edge and lying-destination faults: a seed then "
        "runs as it did before they were added, to compare figures with an earlier commit",
    )
    args = parser.parse_args(argv)
    total: Counter[str] = Counter()
    started = time.monotonic()
    for seed in range(args.seed, args.seed + args.seeds):
        try:
            total += run_seed(
                seed,
                args.steps,
                sync=args.sync,
                verbose=args.verbose,
                edge_faults=not args.no_edge_faults,
            )
        except SimFailure as failure:
            print(failure, file=sys.stderr)
            print(summary(total, time.monotonic() - started))
            print(f"FAILED seed {failure.seed}; reproduce: {failure.reproduce}")
            return 1
    print(summary(total, time.monotonic() - started))
    return 0


if __name__ == "__main__":
    sys.exit(main())
