"""The suite's two plots, drawn with matplotlib's Agg backend (no display needed)."""

from __future__ import annotations

from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt


def fire_lag(rows: list[dict[str, Any]], path: str, subtitle: str) -> None:
    """Fire lag p50/p99 against offered rate, Nereus beside the raw wake-and-write loop."""
    rows = sorted(rows, key=lambda r: r["rate_per_s"])
    rates = [r["rate_per_s"] for r in rows]
    fig, ax = plt.subplots(figsize=(11, 5))
    ax.plot(rates, [r["lag_p50_ms"] for r in rows], "o-", color="tab:blue", label="Nereus p50")
    ax.plot(rates, [r["lag_p99_ms"] for r in rows], "s-", color="tab:red", label="Nereus p99")
    raw = [r for r in rows if "raw" in r]
    if raw:
        raw_rates = [r["rate_per_s"] for r in raw]
        ax.plot(
            raw_rates,
            [r["raw"]["lag_p50_ms"] for r in raw],
            "o--",
            color="tab:blue",
            alpha=0.5,
            label="raw loop p50",
        )
        ax.plot(
            raw_rates,
            [r["raw"]["lag_p99_ms"] for r in raw],
            "s--",
            color="tab:red",
            alpha=0.5,
            label="raw loop p99",
        )
    ax.scatter([2000], [20], marker="_", s=600, color="tab:red", label="target p99 <= 20 ms")
    ax.scatter([2000], [5], marker="_", s=600, color="tab:blue", label="target p50 <= 5 ms")
    for r in rows:
        if r["delivered"] < r["scheduled"]:
            ax.annotate(
                f"{r['delivered']:,}/{r['scheduled']:,} delivered",
                (r["rate_per_s"], r["lag_p99_ms"]),
                fontsize=7,
            )
    ax.set_yscale("log")
    ax.set_xlabel("offered rate (timers/s, delay 200 ms)")
    ax.set_ylabel("fire lag (ms, durable at the local destination - deliverAt)")
    ax.set_title(f"Fire lag against offered rate\n{subtitle}", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def apply_rate(
    kernel_rows: list[dict[str, Any]], memory_rows: list[dict[str, Any]], path: str, subtitle: str
) -> None:
    """Apply rate against live timers (log x): the reducer over an in-memory base (replay),
    its raw decode baseline, and durable applies through the runtime on LMDB."""
    fig, ax = plt.subplots(figsize=(11, 5))
    if kernel_rows:
        rows = sorted(kernel_rows, key=lambda r: r["live_timers"])
        live = [r["live_timers"] for r in rows]
        ax.plot(
            live, [r["apply_per_s"] for r in rows], "o-", label="reducer apply / replay (in memory)"
        )
        ax.plot(
            live,
            [r["decode_per_s"] for r in rows],
            "o--",
            alpha=0.5,
            label="raw msgspec decode (baseline)",
        )
    if memory_rows:
        rows = sorted(memory_rows, key=lambda r: r["live_timers"])
        ax.plot(
            [r["live_timers"] for r in rows],
            [r["apply_per_s"] for r in rows],
            "s-",
            label="durable apply via the runtime\n(LMDB, batches of 1000, fsync)",
        )
    ax.axhline(50_000, color="tab:red", linestyle=":", label="target 50,000/s at 1M")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("live (pending) timers")
    ax.set_ylabel("log entries applied per second")
    ax.set_title(f"Apply rate against live timers\n{subtitle}", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
