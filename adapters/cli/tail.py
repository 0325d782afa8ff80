"""`nereus tail`: print what the embedded service delivered to a queue.

    nereus tail QUEUE --data DIR [--tenant T] [--from OFFSET] [--limit N] [--follow]
    nereus tail QUEUE --data DIR [--tenant T] --group GROUP [--limit N] [--follow]

It reads one tenant's queue (`--tenant`, default the default tenant): that tenant's topic of
the local destination, which holds its records and no other tenant's. Each line names the
record's tenant, queue and timer key (`timerKey`, the key itself however its
`nereus-timer-key` header had to encode it; null on a record written before records carried
it).

With `--group` it reads as that consumer group (`adapters.local.consumer`): from the group's
committed position, committing each page after it is printed, so the library's
`Nereus.consumer(queue, group=...)` and `tail` share positions. Without it, it only reads.

Output (`adapters.cli.output`): one JSON object per record and line when stdout is not a
terminal (as always), one readable line per record on a terminal; `--json`/`--text` choose.
A queue nothing was ever delivered to is said on stderr, naming the tenant's queues that
have deliveries: without `--follow` that ends the command with status 4 (a misspelt queue
would otherwise print nothing and succeed); with `--follow` it waits for the first record.

The local destination's files are opened through the composition root
(`adapters.compose.stores`): the CLI imports no other edge.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
from typing import Any

from nereus.adapters.cli.modes import add_file_mode
from nereus.adapters.cli.output import (
    EXIT_ABSENT,
    EXIT_CODES,
    EXIT_OK,
    EXIT_USAGE,
    OUTPUT_HELP,
    add_output_flags,
    record_line,
    wants_json,
)
from nereus.adapters.compose.stores import (
    ConsumerBusy,
    LocalConsumer,
    LocalDestination,
    LocalRecord,
    local_destination_dir,
    open_local_destination,
)
from nereus.adapters.tenant_topics import name_ok, split_local_topic
from nereus.kernel.keys import DEFAULT_TENANT
from nereus.storage.errors import StoreError


def register(sub: Any) -> None:
    t: argparse.ArgumentParser = sub.add_parser(
        "tail",
        help="print delivered records of a queue (optionally as a consumer group)",
        description=f"Print the records the embedded service delivered to a queue. {OUTPUT_HELP}.",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    t.add_argument("queue")
    t.add_argument("--data", required=True, help="data directory of `nereus serve`")
    t.add_argument(
        "--tenant",
        default=DEFAULT_TENANT,
        help=f"whose queue to read (default: {DEFAULT_TENANT!r}, the tenant of a service "
        "without --config and of the library)",
    )
    t.add_argument("--from", dest="from_offset", type=int, default=None, metavar="OFFSET")
    t.add_argument(
        "--group",
        help="read as this consumer group: start at its committed position and commit what "
        "was printed (the same positions as the library's Nereus.consumer)",
    )
    t.add_argument("--follow", action="store_true", help="keep printing new records")
    t.add_argument("--limit", type=int, default=None, help="stop after this many records")
    add_file_mode(t)  # a group's position and lock files
    add_output_flags(t)
    t.set_defaults(handler=tail)


def record_json(r: LocalRecord) -> dict[str, Any]:
    return {
        "tenant": r.tenant,
        "queue": r.queue,
        "timerKey": r.timer_key,
        "offset": r.offset,
        "partition": r.partition,
        "messageId": r.message_id,
        "attemptId": r.attempt_id,
        "txn": r.txn,
        "deliverAt": r.deliver_at_ms,
        "deliveredAt": r.delivered_at_ms,
        "headers": dict(r.headers),
        "payload": base64.b64encode(r.payload).decode(),
    }


def tail(args: argparse.Namespace) -> int:
    if not os.path.isdir(local_destination_dir(args.data)):
        print(f"nereus tail: no local destination under {args.data}", file=sys.stderr)
        return EXIT_USAGE
    if args.group is not None and args.from_offset is not None:
        print(
            "nereus tail: --group starts at the group's committed position; drop --from",
            file=sys.stderr,
        )
        return 2
    # A queue with '/' could spell another tenant's topic ("acme/orders").
    if not name_ok(args.tenant) or not args.queue or {"/", "\x00"} & set(args.queue):
        print("nereus tail: tenant and queue are names without '/' or NUL", file=sys.stderr)
        return 2
    try:
        dest = open_local_destination(args.data)
    except StoreError as exc:
        print(f"nereus tail: refused: {exc}", file=sys.stderr)
        return 2
    try:
        if args.group is None:
            return _tail_from(dest, args)
        return _tail_group(dest, args)
    except KeyboardInterrupt:
        return EXIT_OK
    finally:
        dest.close()


def _unknown(dest: LocalDestination, topic: str, args: argparse.Namespace) -> bool:
    """A queue with no record: say so, with the tenant's queues that have some; True when
    that ends the command (without --follow)."""
    if dest.end_offset(topic) > 0:
        return False
    queues = sorted(
        queue for tenant, queue in map(split_local_topic, dest.topics()) if tenant == args.tenant
    )
    known = ", ".join(queues[:20]) + (f" and {len(queues) - 20} more" if len(queues) > 20 else "")
    then = "; waiting for its first record" if args.follow else ""
    print(
        f"nereus tail: nothing was ever delivered to queue {args.queue!r} of tenant "
        f"{args.tenant!r} under {args.data} (its queues with deliveries: {known or 'none'})"
        f"{then}",
        file=sys.stderr,
        flush=True,
    )
    return not args.follow


def _emit(record: LocalRecord, as_json: bool) -> None:
    doc = record_json(record)
    print(json.dumps(doc) if as_json else record_line(doc), flush=True)


def _left(args: argparse.Namespace, printed: int) -> int:
    """How many more records a page may hold (--limit counts exactly)."""
    return 1000 if args.limit is None else min(1000, args.limit - printed)


def _tail_from(dest: LocalDestination, args: argparse.Namespace) -> int:
    topic = dest.topic_for(args.queue, tenant=args.tenant)
    if _unknown(dest, topic, args):
        return EXIT_ABSENT
    offset = args.from_offset or 0
    printed = 0
    as_json = wants_json(args)
    while args.limit is None or printed < args.limit:
        batch = dest.read(topic, offset, _left(args, printed))
        for record in batch:
            _emit(record, as_json)
        printed += len(batch)
        if batch:
            offset = batch[-1].offset + 1
            continue  # a read returns a page: read on until the topic's end
        if not args.follow:
            break
        dest.wait_for(topic, offset, None, lambda: False)
    return 0


def _tail_group(dest: LocalDestination, args: argparse.Namespace) -> int:
    try:
        consumer = LocalConsumer(
            dest, args.queue, group=args.group, tenant=args.tenant, auto_commit=False
        )
    except (ConsumerBusy, ValueError) as exc:
        print(f"nereus tail: {exc}", file=sys.stderr)
        return 2
    printed = 0
    as_json = wants_json(args)
    with consumer:
        if _unknown(dest, consumer.topic, args):
            return EXIT_ABSENT
        while args.limit is None or printed < args.limit:
            batch = consumer.poll(None if args.follow else 0.0, _left(args, printed))
            if not batch:
                break
            for record in batch:
                _emit(record, as_json)
            # Printed (and flushed) first: a crash in between prints them again.
            consumer.commit()
            printed += len(batch)
    return 0
