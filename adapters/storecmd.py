"""`nereus export`, `nereus import` and `nereus snapshot`: moving a shard log around."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from kernel.model import Obligation, Table
from storage.errors import StoreError
from storage.jsonl import export_log, import_log
from storage.snapshot import compact_log, write_snapshot
from storage.store import ShardStore


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser("export", help="export a shard log as JSON Lines")
    p.add_argument("--data", required=True, help="shard store directory")
    p.add_argument("--out", help="output file (default: stdout)")
    p.add_argument("--to", type=int, metavar="POSITION", help="last position to export")
    p.set_defaults(handler=_guard(_export))

    p = sub.add_parser("import", help="create a store from an exported JSON Lines log")
    p.add_argument("--log", required=True, help="exported log file")
    p.add_argument("--data", required=True, help="new shard store directory")
    p.set_defaults(handler=_guard(_import))

    p = sub.add_parser("snapshot", help="snapshot the applied state; optionally compact the log")
    p.add_argument("--data", required=True, help="shard store directory")
    p.add_argument(
        "--compact",
        action="store_true",
        help="then delete the log below the snapshot, except what open obligations need",
    )
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
    with ShardStore.open(args.data, create=False) as store:
        if args.out:
            with open(args.out, "w", encoding="utf-8") as f:
                n = export_log(store, f, args.to)
            print(f"exported {n:,} entries to {args.out}", file=sys.stderr)
        else:
            export_log(store, sys.stdout, args.to)
    return 0


def _import(args: argparse.Namespace) -> int:
    with import_log(args.log, args.data) as store:
        print(f"imported {store.log_last_position:,} entries; applied {store.meta.position:,}")
    return 0


def _snapshot(args: argparse.Namespace) -> int:
    with ShardStore.open(args.data, create=False) as store:
        path, header = write_snapshot(store)
        print(f"snapshot at position {header.position:,}: {path}")
        if args.compact:
            floor = header.position + 1
            with store.read() as base:
                for _key, ob in base.items(Table.OBLIGATIONS):
                    assert isinstance(ob, Obligation)
                    floor = min(floor, ob.admitted_position)
            removed = compact_log(store, floor)
            print(
                f"compacted {removed:,} log entries; the log now starts at {store.log_info.floor:,}"
            )
    return 0
