"""`nereus replay`: rebuild a shard's state from its log alone, and audit it.

    nereus replay --data DIR [--obligations] [--verify] [--to POSITION] [--json]
    nereus replay --log FILE.jsonl [--obligations] [--to POSITION] [--json]

Exit status: 0 done (and verified, with --verify); 1 the store differs from its replay;
2 the store or log was refused (the message says which file and why).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from typing import Any

import msgspec

from kernel.config import KernelConfig
from kernel.digest import state_digest
from kernel.records import LogEntry
from replay.fold import ReplayResult, replay
from replay.progress import Progress
from replay.verify import first_difference
from storage.errors import StoreError
from storage.jsonl import JsonlLog
from storage.memory import MemoryStore
from storage.schema import StoreOptions
from storage.snapshot import latest_snapshot, read_snapshot
from storage.store import ShardStore


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "replay", help="rebuild state from the shard log; list obligations; verify the store"
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--data", help="a shard store directory")
    src.add_argument("--log", help="an exported JSON Lines log")
    p.add_argument("--obligations", action="store_true", help="list open obligations")
    p.add_argument("--verify", action="store_true", help="compare replay with the store")
    p.add_argument("--to", type=int, metavar="POSITION", help="state as of this position")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="progress bar on stderr (default: when stderr is a terminal)",
    )
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except StoreError as exc:
        print(f"nereus replay: refused: {exc}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    show_progress = sys.stderr.isatty() if args.progress is None else bool(args.progress)
    if args.verify and args.data is None:
        print("nereus replay: --verify needs --data (a store to compare)", file=sys.stderr)
        return 2
    if args.log is not None:
        source = JsonlLog(args.log)
        config = source.header.config
        source.check_config(config)
        if source.header.first_position != 1:
            raise StoreError(
                args.log,
                f"the log starts at position {source.header.first_position} (compacted); "
                "replaying it needs the store's snapshot: use --data",
            )
        last = source.header.last_position if args.to is None else args.to
        result, _ = _fold(source.entries(1, args.to), config, None, last, show_progress)
        _print(result, args, verified=None)
        return 0

    options = StoreOptions(check_invariants_on_open=False)
    with ShardStore.open(args.data, options=options, create=False) as store:
        if args.verify:
            target = store.meta.position
        else:
            target = store.log_last_position if args.to is None else args.to
        if args.verify and args.to is not None:
            print(
                "nereus replay: --verify compares at the applied position; drop --to",
                file=sys.stderr,
            )
            return 2
        start = _start_from_snapshot(store, target)
        first = (start.meta.position if start else 0) + 1
        result, replayed = _fold(
            store.iter_log(first, target), store.config, start, target, show_progress
        )
        if result.position != target:
            raise StoreError(
                store.env.data_file,
                f"log ends at position {result.position}, before position {target}",
            )
        verified: str | None = None
        if args.verify:
            with store.state_view() as live:
                if state_digest(live) == result.digest:
                    verified = "ok"
                else:
                    verified = first_difference(live, replayed.state) or "digests differ"
        _print(result, args, verified)
        return 0 if verified in (None, "ok") else 1


def _start_from_snapshot(store: ShardStore, target: int) -> MemoryStore | None:
    path = latest_snapshot(store)
    if path is None:
        return None
    header, memory = read_snapshot(path, store.config)
    if target < header.position:
        raise StoreError(
            path,
            f"the log below position {store.log_info.floor} was compacted; "
            f"the earliest reconstructible position is {header.position}",
        )
    return memory


def _fold(
    entries: Iterator[LogEntry],
    config: KernelConfig,
    start: MemoryStore | None,
    last: int,
    show_progress: bool,
) -> tuple[ReplayResult, MemoryStore]:
    first = start.meta.position if start else 0
    progress = Progress("replay", max(last - first, 0), enabled=show_progress)
    store, result = replay(
        entries, config, start=start, on_entry=lambda pos: progress.update(pos - first)
    )
    progress.finish()
    return result, store


def _print(result: ReplayResult, args: argparse.Namespace, verified: str | None) -> None:
    if args.json:
        doc: dict[str, Any] = msgspec.to_builtins(result)
        if not args.obligations:
            doc["obligations_open"] = len(result.obligations)
            del doc["obligations"]
        if verified is not None:
            doc["verify"] = {
                "ok": verified == "ok",
                "first_difference": None if verified == "ok" else verified,
            }
        print(msgspec.json.encode(doc).decode())
        return
    c = result.counters
    print(f"position     {result.position:,} ({result.entries_folded:,} entries folded)")
    print(f"digest       {result.digest}")
    print(
        f"messages     scheduled {c.scheduled}  publishing {c.publishing}  "
        f"uncertain {c.uncertain}  delivered {c.delivered}  canceled {c.canceled}  "
        f"expired {c.expired}  dead-lettered {c.dead_lettered}"
    )
    print(f"dead letters {c.dead_letters_pending} copies owed (not yet recorded written)")
    print(
        f"attempts     publishing {c.attempts_publishing}  published {c.attempts_published}  "
        f"not-published {c.attempts_not_published}  unknown {c.attempts_unknown}"
    )
    outcomes = ", ".join(f"{code} {n}" for code, n in result.outcome_counts.items()) or "-"
    print(f"outcomes     {outcomes}")
    print(f"obligations  {len(result.obligations)} open")
    if args.obligations and result.obligations:
        print(f"  {'attempt':<44} {'status':<10} {'destination':<16} {'admitted at':>12}")
        for o in result.obligations:
            print(
                f"  {o.attempt_id:<44} {o.status:<10} {o.destination:<16} "
                f"{o.admitted_position:>12} ({o.admitted_at_ms} ms)"
            )
    if verified is not None:
        print(
            "verify       ok: the store equals the replay of its log"
            if verified == "ok"
            else f"verify       MISMATCH: {verified}"
        )
