"""`nereus export`, `nereus import` and `nereus snapshot`: moving a shard log around.

`export` and `snapshot` take the directory `nereus serve --data` was given, as `replay`
does (`replay.layout`): its one shard, or in Kafka mode every shard under it (or the one
`--shard N` names); a shard store's own directory works too. Exporting several shards
writes one file per shard, `OUT/shard-N.jsonl`, into the directory `--out` names.

`export` draws a progress line on stderr as `replay` does (`--progress`; by default when
stderr is a terminal), so a long export is seen to move.

`export` only reads (the store opened read-only), so it runs beside the service that writes
the store; `snapshot` and `import` write, so they need the store to themselves and are
refused, naming the holder's pid, while a service has it open (`storage.lock`).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from nereus.adapters.cli.modes import add_file_mode
from nereus.kernel.model import Obligation, Table
from nereus.replay.layout import shard_stores
from nereus.replay.progress import Progress
from nereus.storage import files
from nereus.storage.errors import StoreError
from nereus.storage.jsonl import export_log, import_log
from nereus.storage.snapshot import compact_log, write_snapshot
from nereus.storage.store import ShardStore

_DATA_HELP = "the data directory of `nereus serve` (or one shard store)"


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser("export", help="export a shard log as JSON Lines")
    p.add_argument("--data", required=True, help=_DATA_HELP)
    p.add_argument("--shard", type=int, metavar="N", help="only this shard (Kafka mode)")
    p.add_argument(
        "--out",
        help="output file (default: stdout); with several shards, a directory to write "
        "shard-N.jsonl files into",
    )
    p.add_argument("--to", type=int, metavar="POSITION", help="last position to export")
    p.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="progress bar on stderr (default: when stderr is a terminal)",
    )
    add_file_mode(p)
    p.set_defaults(handler=_guard(_export))

    p = sub.add_parser("import", help="create a store from an exported JSON Lines log")
    p.add_argument("--log", required=True, help="exported log file")
    p.add_argument("--data", required=True, help="new shard store directory")
    add_file_mode(p)
    p.set_defaults(handler=_guard(_import))

    p = sub.add_parser("snapshot", help="snapshot the applied state; optionally compact the log")
    p.add_argument("--data", required=True, help=_DATA_HELP)
    p.add_argument("--shard", type=int, metavar="N", help="only this shard (Kafka mode)")
    p.add_argument(
        "--compact",
        action="store_true",
        help="then delete the log below the snapshot, except what open obligations need",
    )
    add_file_mode(p)
    p.set_defaults(handler=_guard(_snapshot))


def _guard(fn: Any) -> Any:
    def run(args: argparse.Namespace) -> int:
        try:
            result: int = fn(args)
            return result
        except StoreError as exc:
            print(f"nereus {args.command}: refused: {exc}", file=sys.stderr)
            return 2

    return run


def _export(args: argparse.Namespace) -> int:
    stores = shard_stores(args.data, args.shard)
    progress = sys.stderr.isatty() if args.progress is None else bool(args.progress)
    if len(stores) == 1:
        _export_one(stores[0].path, args.out, args.to, progress, "export")
        return 0
    if not args.out:
        print(
            f"nereus export: {args.data} holds {len(stores)} shards; give --out DIRECTORY "
            "(one file per shard) or --shard N",
            file=sys.stderr,
        )
        return 2
    files.make_dirs(args.out)
    for store in stores:
        out = os.path.join(args.out, f"{store.name}.jsonl")
        _export_one(store.path, out, args.to, progress, f"export {store.name}")
    return 0


def _export_one(path: str, out: str | None, to: int | None, progress: bool, label: str) -> None:
    # Read-only: an export runs beside the service that writes the store.
    with ShardStore.open(path, create=False, read_only=True) as store:
        last = store.log_last_position if to is None else min(to, store.log_last_position)
        bar = Progress(label, max(last - store.log_info.floor + 1, 0), enabled=progress)
        if out:
            with open(out, "w", encoding="utf-8", opener=files.opener) as f:
                n = export_log(store, f, to, bar.update)
            bar.finish()
            print(f"exported {n:,} entries to {out}", file=sys.stderr)
        else:
            export_log(store, sys.stdout, to, bar.update)
            bar.finish()


def _import(args: argparse.Namespace) -> int:
    with import_log(args.log, args.data) as store:
        print(f"imported {store.log_last_position:,} entries; applied {store.meta.position:,}")
    return 0


def _snapshot(args: argparse.Namespace) -> int:
    stores = shard_stores(args.data, args.shard)
    for shard in stores:
        with ShardStore.open(shard.path, create=False) as store:
            path, header = write_snapshot(store)
            prefix = f"{shard.name}: " if len(stores) > 1 else ""
            print(f"{prefix}snapshot at position {header.position:,}: {path}")
            if args.compact:
                floor = header.position + 1
                with store.read() as base:
                    for _key, ob in base.items(Table.OBLIGATIONS):
                        assert isinstance(ob, Obligation)
                        floor = min(floor, ob.admitted_position)
                removed = compact_log(store, floor)
                print(
                    f"{prefix}compacted {removed:,} log entries; the log now starts at "
                    f"{store.log_info.floor:,}"
                )
    return 0
