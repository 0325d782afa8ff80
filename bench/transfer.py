"""What a snapshot restore costs before Kafka is involved: a store of N live timers exported
as chunks (`storage/transfer.py`) and imported into an empty store.

The chunks go from the export to the import in the same process, so the figures are the two
ends' own work: reading and chunking the rows; appending them and reading them back for the
digest. What a new owner pays without a snapshot, folding the log from the start, is
`bench.replay_fold`'s rate (entries/s) times the log's length.

    .venv/bin/python -m bench.transfer [--live 1000000]
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from bench.common import live_timers_main, say, scratch
from bench.preload import lmdb_store
from nereus.storage.schema import StoreOptions
from nereus.storage.store import ShardStore
from nereus.storage.transfer import StateImport, export_state

_OPTIONS = StoreOptions(check_invariants_on_open=False, check_structure_on_open=False)


def run(live: int) -> dict[str, Any]:
    with scratch("nereus-transfer-") as root:
        source_path = os.path.join(root, "source")
        say(f"transfer: preloading {live:,} live timers")
        lmdb_store(source_path, live)
        with ShardStore.open(source_path, options=_OPTIONS) as source:
            target = ShardStore.open(
                os.path.join(root, "target"),
                shard_id=source.header.shard_id,
                config=source.config,
                options=_OPTIONS,
            )
            say("transfer: export and import")
            started = time.perf_counter()
            export_s = 0.0
            with target, export_state(source) as export:
                into = StateImport(target)
                chunks = export.chunks()
                while True:
                    t0 = time.perf_counter()
                    chunk = next(chunks, None)
                    export_s += time.perf_counter() - t0
                    if chunk is None:
                        break
                    into.add(chunk)
                manifest = export.manifest()
                into.finish(manifest)
            took_s = time.perf_counter() - started
        return {
            "live_timers": live,
            "rows": manifest.rows,
            "chunks": manifest.chunks,
            "megabytes": round(manifest.bytes / 1e6, 1),
            "export_s": round(export_s, 2),
            "import_s": round(took_s - export_s, 2),
            "total_s": round(took_s, 2),
            "rows_per_s": round(manifest.rows / took_s),
        }


def main(argv: list[str] | None = None) -> int:
    return live_timers_main(
        __doc__,
        run,
        lambda r: (
            f"{r['live_timers']:,} live timers: {r['rows']:,} rows in {r['chunks']:,} chunks "
            f"({r['megabytes']} MB): export {r['export_s']} s, import {r['import_s']} s, "
            f"{r['rows_per_s']:,} rows/s"
        ),
        argv,
    )


if __name__ == "__main__":
    sys.exit(main())
