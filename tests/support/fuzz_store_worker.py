"""Child process of tests/storage/test_fuzz_store.py: damage copies of a store, open and read each.

One JSON line per case on stdout: {"case", "result": "opened" | "refused", "detail"}. Any
other exception escapes as a traceback and a non-zero exit, and an LMDB crash as a signal:
both are what the test fails on. A separate process, because a crash in the C library would
otherwise take pytest down with it.
"""

from __future__ import annotations

import json
import random
import shutil
import sys
from pathlib import Path

from nereus.storage.errors import StoreError
from nereus.storage.store import ShardStore


def damage(rng: random.Random, data: bytearray) -> tuple[str, bytearray]:
    kind = rng.choice(["flip", "flip", "burst", "truncate", "zero_page", "garbage"])
    if kind == "flip":
        for _ in range(rng.choice([1, 2, 8, 64])):
            i = rng.randrange(len(data))
            data[i] ^= 1 << rng.randrange(8)
    elif kind == "burst":
        i = rng.randrange(len(data))
        data[i : i + 64] = bytes(rng.randrange(256) for _ in range(64))
    elif kind == "truncate":
        del data[rng.randrange(len(data)) :]
    elif kind == "zero_page":
        page = rng.randrange(len(data) // 4096) * 4096
        data[page : page + 4096] = bytes(4096)
    else:
        data = bytearray(rng.randbytes(len(data)))
    return kind, data


def main() -> None:
    base, work, seed, cases = (
        Path(sys.argv[1]),
        Path(sys.argv[2]),
        int(sys.argv[3]),
        int(sys.argv[4]),
    )
    original = (base / "data.mdb").read_bytes()
    for case in range(cases):
        rng = random.Random(seed * 1_000_003 + case)
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        kind, data = damage(rng, bytearray(original))
        (work / "data.mdb").write_bytes(bytes(data))
        try:
            with ShardStore.open(str(work), create=False) as store:
                entries = sum(1 for _ in store.iter_log())
                with store.read() as view:
                    rows = sum(1 for _ in view.list_timers("acme", "reminders", None, 10_000)[0])
            result, detail = "opened", f"{entries} entries, {rows} live"
        except StoreError as exc:
            result, detail = "refused", str(exc)
        print(json.dumps({"case": case, "kind": kind, "result": result, "detail": detail}))
        sys.stdout.flush()


if __name__ == "__main__":
    main()
