"""`nereus demo`: fold a short scripted shard log through the kernel and narrate it.

Until the embedded service exists this is the quickest way to watch the state machine decide:
schedule, an identical retry, a cancel that wins, an Admission, a cancel that is too late, an
outcome, and a stale Admission that must not publish.
"""

from __future__ import annotations

import argparse
import hashlib
from typing import Any

from nereus import kernel as k


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser("demo", help="narrate a scripted shard log")
    p.set_defaults(handler=run)


def _script() -> list[k.LogEntry]:
    digest = hashlib.sha256(b'{"kind":"day7"}').hexdigest()
    base_ms = 1_780_000_000_000
    mid = k.message_id("acme", "reminders", "trial:acme:day7")
    interval = k.TrustedInterval(base_ms + 5_000, base_ms + 5_010)
    records: list[tuple[int, k.Record]] = [
        (0, k.Schedule("acme", "reminders", "trial:acme:day7", "t-1", digest, 15, delay_ms=5_000)),
        (1, k.Schedule("acme", "reminders", "trial:acme:day7", "t-1", digest, 15, delay_ms=5_000)),
        (2, k.Schedule("acme", "reminders", "other", "t-2", digest, 15, delay_ms=60_000)),
        (3, k.Cancel("acme", "reminders", "other")),
        (
            5_005,
            k.PublishAdmission(
                mid,
                1,
                1,
                f"{mid}.1.1",
                "claim-1",
                "node-a",
                "d1",
                k.Capability(),
                interval,
                k.Capacity(True),
            ),
        ),
        (5_006, k.Cancel("acme", "reminders", "trial:acme:day7")),
        (
            5_007,
            k.PublishAdmission(
                mid,
                1,
                1,
                f"{mid}.1.2",
                "claim-2",
                "node-b",
                "d1",
                k.Capability(),
                interval,
                k.Capacity(True),
            ),
        ),
        (
            5_020,
            k.PublishOutcome(
                f"{mid}.1.1", mid, 1, k.Published(k.Evidence("reminders", 0, 41, base_ms + 5_019))
            ),
        ),
    ]
    return [
        k.LogEntry(position, base_ms + offset_ms, record)
        for position, (offset_ms, record) in enumerate(records, start=1)
    ]


def run(_args: argparse.Namespace) -> int:
    state = k.State.initial()
    for entry in _script():
        state, effects = k.reduce(state, entry)
        outcome = effects[0]
        assert isinstance(outcome, k.EntryOutcome)
        verdict = "applied " if outcome.applied else "rejected"
        others = ", ".join(type(e).__name__ for e in effects[1:]) or "-"
        print(f"#{entry.position} {outcome.record_type:<21} {verdict} {outcome.code:<20} {others}")
    k.assert_invariants(state)
    print(f"state digest {k.state_digest(state)[:16]}  counters {state.meta.counters}")
    return 0
