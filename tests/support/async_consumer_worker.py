"""A process that reads a data directory's deliveries with the async consumer, for
`tests/adapters/local/test_async_consumer_crash.py`.

    python -m tests.support.async_consumer_worker DATA_DIR HANDLED_LOG RUN MODE [TRAP_OFFSET]

Consumes the queue "q" of DATA_DIR as the group "app" with `nereus.open_async_consumer`
(pages of `MAX_BATCH`). MODE `auto`: auto commit. MODE `manual`: `commit(record)` after
every `COMMIT_EVERY`-th record handled. MODE `break`: auto commit, and at TRAP_OFFSET the
loop is left *before* that record is handled (a record the program could not handle), the
consumer closed, then "trap" printed and the kill awaited. Each record handled appends
"RUN OFFSET" to HANDLED_LOG (a write(2) of its own: it survives SIGKILL). In the other
modes, at TRAP_OFFSET, after writing its line, it prints "trap" and waits to be killed:
the kill falls between handling and commit. It exits by itself when no record arrived for
2 s.
"""

from __future__ import annotations

import asyncio
import os
import sys

import nereus

MAX_BATCH = 50
COMMIT_EVERY = 40


async def consume(data: str, out: int, run: str, mode: str, trap: int | None) -> None:
    auto = mode != "manual"
    async with nereus.open_async_consumer(
        data, "q", group="app", auto_commit=auto, max_batch=MAX_BATCH
    ) as consumer:
        print("ready", flush=True)
        handled = 0
        async for record in consumer.records(idle_timeout_s=2.0):
            if mode == "break" and record.offset == trap:
                break
            os.write(out, f"{run} {record.offset}\n".encode())
            handled += 1
            if record.offset == trap:
                print("trap", flush=True)
                await asyncio.sleep(600)
            if not auto and handled % COMMIT_EVERY == 0:
                await consumer.commit(record)
        if not auto:
            await consumer.commit()
    if mode == "break":
        print("trap", flush=True)
        await asyncio.sleep(600)


def main() -> int:
    data, log, run, mode = sys.argv[1:5]
    trap = int(sys.argv[5]) if len(sys.argv) > 5 else None
    out = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    asyncio.run(consume(data, out, run, mode, trap))
    return 0


if __name__ == "__main__":
    sys.exit(main())
