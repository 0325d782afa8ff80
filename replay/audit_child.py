"""One shard's audit in a process of its own: `python -m nereus.replay.audit_child STORE`.

    python -m nereus.replay.audit_child DIR/shard --scratch /tmp/nereus-audit-x

Theory of operation: the console's audit is `nereus replay --verify` of one shard. Folded
inside the serving process it competed with the fire path for the interpreter lock, so it
runs here instead, over a read-only open of the store (`replay.audit.open_read_only`: no
lock, beside the live writer) and the same `replay_open`, whose verification compares the
store's state as of one read snapshot with the replay of the log up to that state's own
position, however far the writer has moved on meanwhile.

What it says goes to stdout as JSON lines, each one `Line` (a tagged union): `started` (its
pid) first, `progress` at most every `PROGRESS_EVERY_S`, then exactly one of `verified`,
`refused` (a store it cannot trust: missing, damaged, compacted below the snapshot) or
`cancelled`. A process that ends without one of those failed (its stderr says why); the exit
status repeats the answer for a human (0 equal, 1 different, 2 refused, 3 cancelled).

It never outlives the process that started it: that process holds the write end of its
stdin and never writes, so the kernel closes it however the parent ends (SIGKILL included).
At end-of-file the fold is cancelled between entries; should the audit still run
`ORPHAN_EXIT_S` later (in a digest, a comparison), it removes its scratch directory and
exits at once. The parent cancels an audit by killing it (`adapters.http.console.audit`).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import threading
import time
from typing import Final, TextIO

import msgspec

from nereus.replay.audit import AuditCancelled, open_read_only, replay_open
from nereus.storage.errors import StoreError

PROGRESS_EVERY_S: Final = 0.1
ORPHAN_EXIT_S: Final = 2.0
EXIT_OK, EXIT_MISMATCH, EXIT_REFUSED, EXIT_CANCELLED = 0, 1, 2, 3


class Started(msgspec.Struct, frozen=True, tag="started"):
    pid: int
    parent_pid: int


class Progress(msgspec.Struct, frozen=True, tag="progress"):
    done: int
    total: int


class Verified(msgspec.Struct, frozen=True, tag="verified"):
    position: int
    entries_folded: int
    replay_digest: str
    store_digest: str
    difference: str | None  # None: the store equals its replay


class Refused(msgspec.Struct, frozen=True, tag="refused"):
    message: str


class Cancelled(msgspec.Struct, frozen=True, tag="cancelled"):
    message: str


Line = Started | Progress | Verified | Refused | Cancelled


def decode_line(raw: bytes) -> Line:
    """One line of the child's stdout (msgspec.DecodeError: not one of ours)."""
    return msgspec.json.decode(raw, type=Line)


class _Out:
    """stdout, one whole line per message, progress thinned to one per PROGRESS_EVERY_S."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._last_s = 0.0

    def send(self, line: Line) -> None:
        self._stream.write(msgspec.json.encode(line).decode() + "\n")
        self._stream.flush()

    def progress(self, done: int, total: int) -> None:
        now = time.monotonic()
        if now - self._last_s >= PROGRESS_EVERY_S:
            self._last_s = now
            self.send(Progress(done, total))


def audit(path: str, scratch: str | None, cancel: threading.Event, out: _Out) -> int:
    """Verify the store at `path`; the answer is the last line sent."""
    out.send(Started(os.getpid(), os.getppid()))
    try:
        with open_read_only(path) as store:
            result, verified, digest = replay_open(
                store, verify=True, scratch=scratch, on_progress=out.progress, cancel=cancel
            )
    except AuditCancelled as exc:
        out.send(Cancelled(str(exc)))
        return EXIT_CANCELLED
    except StoreError as exc:
        out.send(Refused(str(exc)))
        return EXIT_REFUSED
    assert digest is not None  # a verification always reads the store's digest
    out.send(Progress(result.entries_folded, result.entries_folded))
    difference = None if verified == "ok" else verified
    out.send(Verified(result.position, result.entries_folded, result.digest, digest, difference))
    return EXIT_OK if difference is None else EXIT_MISMATCH


def _watch_parent(stdin: TextIO, cancel: threading.Event, scratch: str | None) -> None:
    """Block until the parent is gone (stdin's end), cancel, and exit if the audit does not
    stop in time."""
    while stdin.buffer.read(512):
        continue  # nobody writes to it: only its end means anything
    cancel.set()
    time.sleep(ORPHAN_EXIT_S)
    if scratch is not None:
        shutil.rmtree(scratch, ignore_errors=True)
    os._exit(EXIT_CANCELLED)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nereus.replay.audit_child")
    parser.add_argument("store", help="the shard store's directory (the one with data.mdb)")
    parser.add_argument("--scratch", help="where a fold on disk keeps its store")
    args = parser.parse_args(argv)
    cancel = threading.Event()
    threading.Thread(
        target=_watch_parent,
        args=(sys.stdin, cancel, args.scratch),
        name="nereus-audit-parent",
        daemon=True,
    ).start()
    return audit(args.store, args.scratch, cancel, _Out(sys.stdout))


if __name__ == "__main__":
    sys.exit(main())
