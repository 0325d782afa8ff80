"""`nereus schedule`, `reschedule`, `cancel`, `peek`, `list`: a small HTTP API client.

The bearer token comes from `--token` or the `NEREUS_TOKEN` environment variable (better: it
stays out of the shell history and the process list); a service without a config file
needs none.

Each prints the service's answer (`adapters.cli.output`: readable on a terminal, one JSON
object per line otherwise, `--json`/`--text` to choose) and exits with a status that says
whether it was ok: 0 ok, 1 refused by the service (HTTP error), 2 not reached or a usage
error, 3 answered not ok (`too_late`, `rejected`), 4 absent (`output.EXIT_CODES`).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from nereus.adapters.cli.output import (
    EXIT_CODES,
    EXIT_REFUSED,
    EXIT_USAGE,
    OUTPUT_HELP,
    add_output_flags,
    exit_code,
    print_doc,
    wants_json,
)

DEFAULT_URL = "http://127.0.0.1:6632"


def _parser(sub: Any, name: str, help_text: str) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = sub.add_parser(
        name,
        help=help_text,
        description=f"{help_text[0].upper()}{help_text[1:]}. {OUTPUT_HELP}.",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    return parser


def register(sub: Any) -> None:
    s = _parser(sub, "schedule", "schedule a timer over HTTP")
    s.add_argument("queue")
    s.add_argument("timer_key")
    s.add_argument("--delay-ms", type=int, default=0)
    s.add_argument("--payload", default="", help="payload text (UTF-8)")
    s.add_argument("--txn")
    s.add_argument("--partition")
    _common(s)
    s.set_defaults(handler=_schedule)

    r = _parser(sub, "reschedule", "move a pending timer to a new time over HTTP")
    r.add_argument("queue")
    r.add_argument("timer_key")
    r.add_argument(
        "--delay-ms",
        type=int,
        required=True,
        help="the new delay from now (the content stays; a new txn and generation)",
    )
    r.add_argument("--txn", help="the new generation's txn (default: minted by the service)")
    _common(r)
    r.set_defaults(handler=_reschedule)

    c = _parser(sub, "cancel", "cancel a timer over HTTP")
    c.add_argument("queue")
    c.add_argument("timer_key")
    c.add_argument("--txn")
    _common(c)
    c.set_defaults(handler=_cancel)

    p = _parser(sub, "peek", "show a timer over HTTP")
    p.add_argument("queue")
    p.add_argument("timer_key")
    _common(p)
    p.set_defaults(handler=_peek)

    ls = _parser(sub, "list", "list a queue's live timers over HTTP")
    ls.add_argument("queue")
    ls.add_argument("--after", help="exclusive cursor: the last key of the previous page")
    ls.add_argument("--limit", type=int)
    _common(ls)
    ls.set_defaults(handler=_list)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", default=DEFAULT_URL)
    parser.add_argument(
        "--token",
        default=os.environ.get("NEREUS_TOKEN"),
        help="bearer token (default: $NEREUS_TOKEN)",
    )
    add_output_flags(parser)


def _path(queue: str, key: str) -> str:
    return (
        f"/api/v1/timers/{urllib.parse.quote(queue, safe='')}/{urllib.parse.quote(key, safe='/')}"
    )


def _call(args: argparse.Namespace, method: str, path: str, body: Any = None) -> int:
    url = args.url
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url + path, data=data, method=method)
    request.add_header("Content-Type", "application/json")
    if args.token:
        request.add_header("Authorization", f"Bearer {args.token}")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            doc = json.loads(response.read())
    except urllib.error.HTTPError as exc:
        _refused(args, exc.code, exc.read().decode(errors="replace"))
        return EXIT_REFUSED
    except urllib.error.URLError as exc:
        print(f"nereus: cannot reach {url}: {exc.reason}", file=sys.stderr)
        return EXIT_USAGE
    print_doc(doc, args)
    return exit_code(doc)


def _refused(args: argparse.Namespace, status: int, body: str) -> None:
    """An HTTP error: its body as is for programs, its code and message for people."""
    if wants_json(args):
        print(body, file=sys.stderr)
        return
    try:
        error = json.loads(body)["error"]
        said = f"{error['code']}: {error.get('message', '')}".rstrip(": ")
    except (ValueError, KeyError, TypeError):
        said = body.strip() or "(no body)"
    print(f"nereus {args.command}: refused (HTTP {status}) {said}", file=sys.stderr)


def _schedule(args: argparse.Namespace) -> int:
    op: dict[str, Any] = {
        "op": "schedule",
        "queue": args.queue,
        "timerKey": args.timer_key,
        "delayMs": args.delay_ms,
        "payload": base64.b64encode(args.payload.encode()).decode(),
    }
    if args.txn:
        op["txn"] = args.txn
    if args.partition:
        op["partition"] = args.partition
    return _call(args, "POST", "/api/v1/timers", {"operations": [op]})


def _reschedule(args: argparse.Namespace) -> int:
    op: dict[str, Any] = {
        "op": "reschedule",
        "queue": args.queue,
        "timerKey": args.timer_key,
        "delayMs": args.delay_ms,
    }
    if args.txn:
        op["txn"] = args.txn
    return _call(args, "POST", "/api/v1/timers", {"operations": [op]})


def _cancel(args: argparse.Namespace) -> int:
    query = f"?txn={urllib.parse.quote(args.txn)}" if args.txn else ""
    return _call(args, "DELETE", _path(args.queue, args.timer_key) + query)


def _peek(args: argparse.Namespace) -> int:
    return _call(args, "GET", _path(args.queue, args.timer_key))


def _list(args: argparse.Namespace) -> int:
    query = {k: v for k, v in (("after", args.after), ("limit", args.limit)) if v is not None}
    suffix = f"?{urllib.parse.urlencode(query)}" if query else ""
    return _call(args, "GET", f"/api/v1/timers/{urllib.parse.quote(args.queue, safe='')}{suffix}")
