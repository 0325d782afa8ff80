"""An embedded program that receives its timers, for `tests/adapters/local/test_consumer_crash.py`.

    python -m tests.support.consumer_worker DATA_DIR HANDLED_LOG RUN [TRAP_OFFSET]

Opens the shard on DATA_DIR (the host clock, an assumed error of 5 ms), starts its runtime
(which fires the timers due) and consumes the queue "q" as the group "app" with the handler
form. The handler appends "RUN OFFSET MESSAGE_ID" to HANDLED_LOG (a write(2) of its own: it
survives SIGKILL) before returning; the consumer then commits. At TRAP_OFFSET the handler,
after writing its line, prints "trap" and waits to be killed: the kill falls between
handling and commit. The worker exits by itself once every record of the queue has been
handled and none arrived for 3 s.
"""

from __future__ import annotations

import os
import sys
import time

from nereus import LocalRecord, Nereus


def main() -> int:
    data, handled_log, run = sys.argv[1], sys.argv[2], sys.argv[3]
    trap = int(sys.argv[4]) if len(sys.argv) > 4 else None
    out = os.open(handled_log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    with Nereus.open(data, assume_clock_error_ms=5) as nereus:
        nereus.start()
        with nereus.consumer("q", group="app") as consumer:
            print("ready", flush=True)

            def handle(record: LocalRecord) -> None:
                os.write(out, f"{run} {record.offset} {record.message_id}\n".encode())
                if record.offset == trap:
                    print("trap", flush=True)
                    time.sleep(600)

            consumer.run(handle, idle_timeout_s=3.0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
