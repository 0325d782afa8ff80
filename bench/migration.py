"""How long the first open after an upgrade takes: a schema-5 store of N live timers migrated
to schema 6 (every table row rewritten from a map to an array), beside a plain open of the
same store once migrated.

The store is preloaded (`bench.preload`), then put back in the version-5 form (rows as maps,
header version 5) as setup. Both opens skip the structure walk and the invariant check, which
cost the same before and after an upgrade, so what differs is the migration.

    .venv/bin/python -m bench.migration [--live 1000000]
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import msgspec

from bench.common import live_timers_main, say, scratch
from bench.preload import lmdb_store
from nereus.storage.codec import decode_value, frame
from nereus.storage.schema import HEADER_KEY, StoreOptions
from nereus.storage.store import ShardStore

_OPTIONS = StoreOptions(check_invariants_on_open=False, check_structure_on_open=False)


def rows_as_maps(txn: Any, env: Any) -> int:
    """Rewrite every table row of `env` in the map form of schema 5 and earlier, inside the
    write transaction `txn`; returns how many. (The tests make old stores with it too.)"""
    rows = 0
    for table, db in env.tables.items():
        with txn.cursor(db=db) as cursor:
            for key, raw in list(cursor):
                value = decode_value(table, raw, env.data_file, key)
                cursor.put(key, frame(msgspec.msgpack.encode(value)))
                rows += 1
    return rows


def _as_version_5(path: str) -> int:
    """Rewrite the store's rows as maps and its header as version 5; returns the rows."""
    with ShardStore.open(path, options=_OPTIONS) as store:
        env = store.env
        with env.env.begin(write=True) as txn:
            rows = rows_as_maps(txn, env)
            header = msgspec.structs.replace(store.header, schema_version=5)
            txn.put(HEADER_KEY, frame(msgspec.msgpack.encode(header)), db=env.meta)
    return rows


def _open_s(path: str) -> float:
    started = time.perf_counter()
    ShardStore.open(path, options=_OPTIONS).close()
    return time.perf_counter() - started


def run(live: int) -> dict[str, Any]:
    with scratch("nereus-migration-") as root:
        path = os.path.join(root, "shard")
        say(f"migration: preloading {live:,} live timers")
        lmdb_store(path, live)
        rows = _as_version_5(path)
        say(f"migration: opening the version-5 store ({rows:,} table rows)")
        migrate_s = _open_s(path)
        plain_s = _open_s(path)
        return {
            "live_timers": live,
            "table_rows": rows,
            "migrating_open_s": round(migrate_s, 2),
            "plain_open_s": round(plain_s, 3),
            "rows_per_s": round(rows / max(migrate_s - plain_s, 1e-9)),
        }


def main(argv: list[str] | None = None) -> int:
    return live_timers_main(
        __doc__,
        run,
        lambda r: (
            f"migrating open of {r['live_timers']:,} live timers ({r['table_rows']:,} rows): "
            f"{r['migrating_open_s']} s, then a plain open {r['plain_open_s']} s "
            f"({r['rows_per_s']:,} rows/s)"
        ),
        argv,
    )


if __name__ == "__main__":
    sys.exit(main())
