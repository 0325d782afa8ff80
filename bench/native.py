"""The Rust twins against their Python references, per call, side by side in one run.

Each function of `kernel/native.py` is timed both ways on inputs of the sizes the hot path
gives it (a stored row, a payload), best of five runs of `--calls` calls. The reference is
the baseline: the ratio is reference / twin (above 1: the twin is faster).

    .venv/bin/python -m bench.native [--calls 200000] [--json FILE]
"""

from __future__ import annotations

import argparse
import sys
import timeit
from collections.abc import Callable
from typing import Any

from bench.common import say, write_json
from nereus.kernel import native

SIZES_BYTES = (90, 1024)


def _per_call_ns(fn: Callable[[bytes], Any], data: bytes, calls: int) -> float:
    best = min(timeit.repeat(lambda: fn(data), number=calls, repeat=5))
    return best / calls * 1e9


def run(calls: int) -> dict[str, Any]:
    rust = native.load()
    if rust is None:
        sys.exit("bench.native: no Rust module in this build (`nereus --version` says which)")
    pairs = {
        "sha256_hex": (native.reference_sha256_hex, rust.sha256_hex),
        "frame": (native.reference_frame, rust.frame),
        "checksum_ok": (native.reference_checksum_ok, rust.checksum_ok),
    }
    rows = []
    for name, (reference, twin) in pairs.items():
        for size in SIZES_BYTES:
            data = native.reference_frame(b"x" * size)
            python_ns = _per_call_ns(reference, data, calls)
            rust_ns = _per_call_ns(twin, data, calls)
            rows.append(
                {
                    "function": name,
                    "bytes": size,
                    "python_ns": round(python_ns),
                    "rust_ns": round(rust_ns),
                    "ratio": round(python_ns / rust_ns, 2),
                }
            )
            say(f"{name:12} {size:5} B: Python {python_ns:6.0f} ns, Rust {rust_ns:6.0f} ns")
    return {"build": rust.BUILD, "calls": calls, "per_call": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200_000)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    write_json(args.json, run(args.calls))


if __name__ == "__main__":
    main()
