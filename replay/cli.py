"""`nereus replay`: rebuild a shard's state from its log alone, and audit it.

    nereus replay --data DIR [--shard N] [--obligations] [--verify] [--to POSITION] [--json]
                  [--fold auto|memory|disk] [--scratch DIR]
    nereus replay --log FILE.jsonl [--obligations] [--to POSITION] [--json]

`--data` is the directory `nereus serve --data` was given (`replay.layout`): its one shard,
or in Kafka mode every shard under it (or the one `--shard N` names), each in turn; a shard
store's own directory works too. With several shards the text output has one section per
shard and `--json` one document `{"shards": {"shard-0": {...}, ...}}`.

`--fold memory` folds into Python objects (fast; ~1 KB of memory per live timer); `--fold
disk` into a scratch LMDB store (`replay.disk`: memory bounded by a batch, the state in a
file under `--scratch`, by default a temporary directory, removed afterwards). `auto`, the
default, folds on disk once the state to rebuild covers more than
`replay.audit.AUTO_DISK_POSITIONS` log positions.

`--kafka BOOTSTRAP --shard N` rebuilds a shard from Kafka alone. Replay sits below the
edges and imports none of them: the Kafka source is given to `register` from above (`nereus`
gives `adapters.compose.replay.kafka_rebuild`), as a `KafkaRebuild` returning what the
rebuild read as a `KafkaOrigin`.

Exit status: 0 done (and verified, with --verify); 1 a store differs from its replay;
2 a store or log was refused (the message says which file and why).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import msgspec

from nereus.kernel.invariants import InvariantViolation, assert_invariants
from nereus.replay.audit import folded, open_read_only, replay_open
from nereus.replay.fold import ReplayResult
from nereus.replay.layout import shard_stores
from nereus.replay.progress import Progress
from nereus.storage.errors import StoreError
from nereus.storage.jsonl import JsonlLog
from nereus.storage.store import ShardStore


@dataclass(frozen=True)
class KafkaOrigin:
    """Where a shard rebuilt from Kafka started (its newest snapshot, None: offset 0) and
    which command offsets were folded after it, with the records that got no position."""

    snapshot_id: str | None
    snapshot_covered_offset: int | None
    snapshot_position: int | None
    first_offset: int
    last_offset: int
    skipped: int


class KafkaRebuild(Protocol):
    """Shard `partition` of the commands topic `topic`, rebuilt into a new store at
    `scratch` (the caller closes the store and removes the directory)."""

    def __call__(
        self,
        settings: dict[str, Any],
        topic: str,
        partition: int,
        scratch: str,
        *,
        on_entry: Callable[[int], None] | None = None,
    ) -> tuple[ShardStore, ReplayResult, KafkaOrigin]: ...


def register(sub: Any, *, kafka: KafkaRebuild | None = None) -> None:
    """`nereus replay`; `kafka` is the source `--kafka` rebuilds from (without it,
    `--kafka` is refused)."""
    p: argparse.ArgumentParser = sub.add_parser(
        "replay", help="rebuild state from the shard log; list obligations; verify the store"
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--data", help="the data directory of `nereus serve` (or one shard store)")
    p.add_argument("--shard", type=int, metavar="N", help="only this shard (Kafka mode)")
    src.add_argument("--log", help="an exported JSON Lines log")
    src.add_argument(
        "--kafka",
        metavar="BOOTSTRAP",
        help="rebuild --shard N from Kafka alone: its newest snapshot and the commands after",
    )
    p.add_argument(
        "--commands-topic",
        default="nereus.commands",
        help="with --kafka: the commands topic (default nereus.commands)",
    )
    p.add_argument("--obligations", action="store_true", help="list open obligations")
    p.add_argument("--verify", action="store_true", help="compare replay with the store")
    p.add_argument("--to", type=int, metavar="POSITION", help="state as of this position")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument(
        "--fold",
        choices=("auto", "memory", "disk"),
        default="auto",
        help="fold in memory, or into a scratch LMDB store (default: disk for large states)",
    )
    p.add_argument("--scratch", metavar="DIR", help="where --fold disk keeps its store")
    p.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="progress bar on stderr (default: when stderr is a terminal)",
    )
    p.set_defaults(handler=run, kafka_rebuild=kafka)


def run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except StoreError as exc:
        print(f"nereus replay: refused: {exc}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    show_progress = sys.stderr.isatty() if args.progress is None else bool(args.progress)
    if args.kafka is not None:
        return _run_kafka(args, show_progress)
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
        entries = source.entries(1, args.to)
        progress = Progress("replay", None, enabled=show_progress)
        with folded(
            entries,
            config,
            snapshot=None,
            first=0,
            last=last,
            fold=args.fold,
            scratch=args.scratch,
            on_progress=_progress_to(progress),
        ) as (result, _):
            progress.finish()
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


def _run_kafka(args: argparse.Namespace, show_progress: bool) -> int:
    """The shard rebuilt from Kafka: --verify checks the kernel's invariants on the state
    reached (the snapshot's digest is checked by its restore, the rest is the fold)."""
    if args.shard is None or args.to is not None:
        print("nereus replay: --kafka needs --shard N, and takes no --to", file=sys.stderr)
        return 2
    rebuild: KafkaRebuild | None = getattr(args, "kafka_rebuild", None)
    if rebuild is None:
        print("nereus replay: --kafka is not available in this build", file=sys.stderr)
        return 2
    progress = Progress("replay", 0, enabled=show_progress)
    scratch = tempfile.mkdtemp(prefix="nereus-replay-kafka-", dir=args.scratch)
    try:
        settings = {"bootstrap.servers": args.kafka}
        store, result, origin = rebuild(
            settings, args.commands_topic, args.shard, scratch, on_entry=progress.update
        )
        progress.finish()
        try:
            verified = _verified(store) if args.verify else None
        finally:
            store.close()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    _print_kafka(result, args, verified, origin)
    return 0 if verified in (None, "ok") else 1


def _verified(store: ShardStore) -> str:
    """The verdict on the state reached: "ok" when it holds the kernel's invariants, else
    what broke."""
    with store.state_view() as state:
        try:
            assert_invariants(state)
            return "ok"
        except InvariantViolation as exc:
            return f"invariant broken: {exc}"


def _print_kafka(
    result: ReplayResult, args: argparse.Namespace, verified: str | None, origin: KafkaOrigin
) -> None:
    if args.json:
        doc = _doc(result, args, verified)
        doc["kafka"] = {
            "snapshot": None
            if origin.snapshot_id is None
            else {"id": origin.snapshot_id, "covered_offset": origin.snapshot_covered_offset},
            "first_offset": origin.first_offset,
            "last_offset": origin.last_offset,
            "skipped_records": origin.skipped,
        }
        print(msgspec.json.encode(doc).decode())
        return
    start = "offset 0"
    if origin.snapshot_id is not None:
        start = f"snapshot {origin.snapshot_id} (position {origin.snapshot_position:,}, "
        start += "digest checked)"
    print(
        f"kafka        {args.commands_topic}[{args.shard}] from {start}, then offsets "
        f"{origin.first_offset}..{origin.last_offset} ({origin.skipped} skipped)"
    )
    _print(result, args, verified=None)
    if verified is not None:
        print(
            "verify       ok: the rebuilt state holds the kernel's invariants"
            if verified == "ok"
            else f"verify       MISMATCH: {verified}"
        )


def _replay_store(
    path: str, args: argparse.Namespace, show_progress: bool
) -> tuple[ReplayResult, str | None]:
    """Replay one store to --to (or its log's end); with --verify, compare it with the store
    (`replay.audit.replay_open`). The store is opened read-only, so this runs beside the
    service that writes it."""
    with open_read_only(path) as store:
        progress = Progress("replay", None, enabled=show_progress)
        result, verified, _ = replay_open(
            store,
            to=args.to,
            verify=args.verify,
            fold=args.fold,
            scratch=args.scratch,
            on_progress=_progress_to(progress),
        )
        progress.finish()
        return result, verified


def _progress_to(progress: Progress) -> Callable[[int, int], None]:
    def update(done: int, total: int) -> None:
        progress.total = total
        progress.update(done)

    return update


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
