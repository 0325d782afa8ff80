"""`nereus replay`: rebuild a shard's state from its log alone, and audit it.

    nereus replay --data DIR [--shard N] [--obligations] [--verify] [--to POSITION] [--json]
    nereus replay --log FILE.jsonl [--obligations] [--to POSITION] [--json]

`--data` is the directory `nereus serve --data` was given (`replay.layout`): its one shard,
or in Kafka mode every shard under it (or the one `--shard N` names), each in turn; a shard
store's own directory works too. With several shards the text output has one section per
shard and `--json` one document `{"shards": {"shard-0": {...}, ...}}`.

Exit status: 0 done (and verified, with --verify); 1 a store differs from its replay;
2 a store or log was refused (the message says which file and why).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from typing import Any

import msgspec

from nereus.kernel.config import KernelConfig
from nereus.kernel.digest import state_digest
from nereus.kernel.records import LogEntry
from nereus.replay.fold import ReplayResult, replay
from nereus.replay.layout import shard_stores
from nereus.replay.progress import Progress
from nereus.replay.verify import first_difference
from nereus.storage.errors import StoreError
from nereus.storage.jsonl import JsonlLog
from nereus.storage.memory import MemoryStore
from nereus.storage.schema import StoreOptions
from nereus.storage.snapshot import latest_snapshot, read_snapshot
from nereus.storage.store import ShardStore


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "replay", help="rebuild state from the shard log; list obligations; verify the store"
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--data", help="the data directory of `nereus serve` (or one shard store)")
    p.add_argument("--shard", type=int, metavar="N", help="only this shard (Kafka mode)")
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
    if args.verify and args.to is not None:
        print(
            "nereus replay: --verify compares at the applied position; drop --to",
            file=sys.stderr,
        )
        return 2
    if args.log is not None:
        if args.shard is not None:
            print("nereus replay: --shard goes with --data", file=sys.stderr)
            return 2
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
    stores = shard_stores(args.data, args.shard)
    if len(stores) == 1:
        result, verified = _replay_store(stores[0].path, args, show_progress)
        _print(result, args, verified)
        return 0 if verified in (None, "ok") else 1
    code = 0
    docs: dict[str, Any] = {}
    for store in stores:
        try:
            result, verified = _replay_store(store.path, args, show_progress)
        except StoreError as exc:
            print(f"nereus replay: refused: {exc}", file=sys.stderr)
            docs[store.name] = {"refused": str(exc)}
            code = 2
            continue
        if verified not in (None, "ok"):
            code = max(code, 1)
        if args.json:
            docs[store.name] = _doc(result, args, verified)
        else:
            print(f"== {store.name} ({store.path})")
            _print(result, args, verified)
    if args.json:
        print(msgspec.json.encode({"shards": docs}).decode())
    return code


def _replay_store(
    path: str, args: argparse.Namespace, show_progress: bool
) -> tuple[ReplayResult, str | None]:
    """Replay one store to --to (or its log's end); with --verify, compare it with the store:
    "ok" or the first difference."""
    options = StoreOptions(check_invariants_on_open=False)
    with ShardStore.open(path, options=options, create=False) as store:
        if args.verify:
            target = store.meta.position
        else:
            target = store.log_last_position if args.to is None else args.to
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
        return result, verified


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


def _doc(result: ReplayResult, args: argparse.Namespace, verified: str | None) -> dict[str, Any]:
    doc: dict[str, Any] = msgspec.to_builtins(result)
    if not args.obligations:
        doc["obligations_open"] = len(result.obligations)
        del doc["obligations"]
    if verified is not None:
        doc["verify"] = {
            "ok": verified == "ok",
            "first_difference": None if verified == "ok" else verified,
        }
    return doc


def _print(result: ReplayResult, args: argparse.Namespace, verified: str | None) -> None:
    if args.json:
        print(msgspec.json.encode(_doc(result, args, verified)).decode())
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
