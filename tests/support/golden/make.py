"""Make a golden set: `python -m tests.support.golden.make NAME [--first-seed S] [--steps K]`.

Theory of operation: a golden set is a real shard log made by the real runtime, frozen. The
simulator runs seeds from S on until one produces every record type the build knows (and
every outcome kind, a proof of absence among them); that run's log is exported as JSON Lines
(`log.jsonl`), its LMDB store is copied compacted (`store/data.mdb`), and what a fold of the
log must give is written down (`expected.json`): the state digest, the open obligations, the
counters, each entry's outcome code, and each message's status, generation and version. The
set is then committed and never made again: later builds are held to it as it is.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any, get_args

import msgspec

from nereus.kernel.digest import state_digest
from nereus.kernel.effects import EntryOutcome
from nereus.kernel.model import Message, Table
from nereus.kernel.records import LogEntry, NotPublished, PublishOutcome, Record, members
from nereus.replay.fold import obligations
from nereus.sim.world import World
from nereus.storage.jsonl import LOG_VERSION, export_log
from nereus.storage.memory import MemoryStore
from nereus.storage.schema import SCHEMA_VERSION
from nereus.storage.store import ShardStore

HERE = Path(__file__).resolve().parent
RESULT_KINDS = ("PUBLISHED", "NOT_PUBLISHED", "UNKNOWN", "NOT_PUBLISHED+proof")


def record_tags() -> list[str]:
    """Every record type of this build, by its versioned tag."""
    return sorted(str(cls.__struct_config__.tag) for cls in get_args(Record))


def kinds_in(entries: list[LogEntry]) -> Counter[str]:
    """How often each record tag and each outcome kind occurs."""
    found: Counter[str] = Counter()
    for entry in entries:
        found[str(type(entry.record).__struct_config__.tag)] += 1
        for record in members(entry.record):
            if not isinstance(record, PublishOutcome):
                continue
            result = record.result
            found[str(type(result).__struct_config__.tag)] += 1
            if isinstance(result, NotPublished) and result.proof is not None:
                found["NOT_PUBLISHED+proof"] += 1
    return found


def expectations(store: ShardStore, entries: list[LogEntry]) -> dict[str, Any]:
    """What a fold of `entries` must give, in plain JSON."""
    codes: list[str] = []

    def keep(_entry: LogEntry, effects: tuple[Any, ...]) -> None:
        # One outcome per record, or per item of a batch record.
        codes.extend(str(e.code) for e in effects if isinstance(e, EntryOutcome))

    memory = MemoryStore(store.config)
    memory.feed(entries, keep)
    digest = state_digest(memory.state)
    with store.state_view() as live:
        assert state_digest(live) == digest, "the store differs from its log's replay"
        messages = {
            m.message_id: [str(m.status), m.generation, m.version]
            for _key, m in live.items(Table.MESSAGES)
            if isinstance(m, Message)
        }
        open_obligations = [msgspec.to_builtins(o) for o in obligations(live)]
    found = kinds_in(entries)
    return {
        "made_with": {
            "log_export_version": LOG_VERSION,
            "store_schema_version": SCHEMA_VERSION,
            "record_tags": {tag: found[tag] for tag in record_tags()},
            "outcome_kinds": {kind: found[kind] for kind in RESULT_KINDS},
        },
        "shard_id": store.header.shard_id,
        "config_fingerprint": store.header.config_fingerprint,
        "last_position": entries[-1].position,
        "digest": digest,
        "counters": msgspec.to_builtins(memory.state.meta.counters),
        "obligations": open_obligations,
        "messages": dict(sorted(messages.items())),
        "codes": codes,
    }


def make(name: str, first_seed: int, steps: int) -> Path:
    out = HERE / name
    if out.exists():
        raise SystemExit(f"{out} exists: a golden set is made once and never remade")
    wanted = set(record_tags()) | set(RESULT_KINDS)
    with tempfile.TemporaryDirectory(prefix="nereus-golden-") as root:
        for seed in range(first_seed, first_seed + 500):
            run = Path(root) / str(seed)
            world = World(seed, steps, str(run))
            try:
                world.run()
                entries = list(world.store.iter_log())
                missing = wanted - set(kinds_in(entries))
                if missing:
                    print(f"seed {seed}: lacks {sorted(missing)}", file=sys.stderr)
                    continue
                out.mkdir()
                (out / "store").mkdir()
                with (out / "log.jsonl").open("w") as f:
                    export_log(world.store, f)
                world.store.env.env.copy(str(out / "store"), compact=True)
                expected = expectations(world.store, entries)
                expected["made_by"] = (
                    f"python -m tests.support.golden.make {name} (sim seed {seed}, {steps} steps)"
                )
            finally:
                world.close()
            (out / "expected.json").write_text(json.dumps(expected, indent=1) + "\n")
            print(f"golden set {name}: seed {seed}, {len(entries)} entries, in {out}")
            return out
    raise SystemExit("no seed produced every record type: widen the search")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.support.golden.make", description=__doc__
    )
    parser.add_argument("name", help="the new set's directory name under tests/support/golden/")
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=150)
    args = parser.parse_args(argv)
    make(args.name, args.first_seed, args.steps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
