"""`nereus schedule`, `nereus cancel`, `nereus peek`, `nereus list`: a small HTTP API client.

The bearer token comes from `--token` or the `NEREUS_TOKEN` environment variable (better: it
stays out of the shell history and the process list); a service without a config file
needs none.
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

DEFAULT_URL = "http://127.0.0.1:6632"


def register(sub: Any) -> None:
    s: argparse.ArgumentParser = sub.add_parser("schedule", help="schedule a timer over HTTP")
    s.add_argument("queue")
    s.add_argument("timer_key")
    s.add_argument("--delay-ms", type=int, default=0)
    s.add_argument("--payload", default="", help="payload text (UTF-8)")
    s.add_argument("--txn")
    s.add_argument("--partition")
    _common(s)
    s.set_defaults(handler=_schedule)

    c: argparse.ArgumentParser = sub.add_parser("cancel", help="cancel a timer over HTTP")
    c.add_argument("queue")
    c.add_argument("timer_key")
    c.add_argument("--txn")
    _common(c)
    c.set_defaults(handler=_cancel)

    p: argparse.ArgumentParser = sub.add_parser("peek", help="show a timer over HTTP")
    p.add_argument("queue")
    p.add_argument("timer_key")
    _common(p)
    p.set_defaults(handler=_peek)

    ls: argparse.ArgumentParser = sub.add_parser("list", help="list a queue's timers over HTTP")
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
            print(response.read().decode())
            return 0
    except urllib.error.HTTPError as exc:
        print(exc.read().decode(), file=sys.stderr)
        return 1
    except urllib.error.URLError as exc:
        print(f"nereus: cannot reach {url}: {exc.reason}", file=sys.stderr)
        return 2


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


def _cancel(args: argparse.Namespace) -> int:
    query = f"?txn={urllib.parse.quote(args.txn)}" if args.txn else ""
    return _call(args, "DELETE", _path(args.queue, args.timer_key) + query)


def _peek(args: argparse.Namespace) -> int:
    return _call(args, "GET", _path(args.queue, args.timer_key))


def _list(args: argparse.Namespace) -> int:
    query = {k: v for k, v in (("after", args.after), ("limit", args.limit)) if v is not None}
    suffix = f"?{urllib.parse.urlencode(query)}" if query else ""
    return _call(args, "GET", f"/api/v1/timers/{urllib.parse.quote(args.queue, safe='')}{suffix}")
