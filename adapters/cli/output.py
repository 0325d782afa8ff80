"""What the CLI prints and how it exits: readable text for people, JSON for programs.

Theory of operation: a command works out one document (the HTTP API's answer, a delivered
record) and hands it here. When stdout is a terminal the document is printed as `key:
value` lines (a list's rows as a small table, epoch-millisecond times with their UTC
reading, payloads as text when they are UTF-8); anywhere else it is printed as one JSON
object per line, exactly as before, so scripts and pipes keep what they read. `--json`
and `--text` choose either way regardless. The exit status says how the command ended,
from the document, never from the output form (`EXIT_CODES`).
"""

from __future__ import annotations

import argparse
import base64
import binascii
import json
import sys
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

EXIT_OK = 0
EXIT_REFUSED = 1  # the service answered with an HTTP error (4xx/5xx)
EXIT_USAGE = 2  # a usage error, an unreachable service, a store or queue refused locally
EXIT_NOT_OK = 3  # answered, and a result is not ok: too_late, rejected, ...
EXIT_ABSENT = 4  # answered: the timer is not there (absent, found: false), or the queue

EXIT_CODES = f"""exit status:
  {EXIT_OK}  done: every result ok (peek: the timer was found)
  {EXIT_REFUSED}  the service refused the request (HTTP 4xx/5xx; its answer on stderr)
  {EXIT_USAGE}  usage error; the service cannot be reached; a store, directory or name refused
  {EXIT_NOT_OK}  answered, not ok: a result's status is too_late, rejected, ... (not absent)
  {EXIT_ABSENT}  answered: absent (cancel/reschedule of a timer that is not pending, peek of
     one never scheduled) or, for tail, a queue nothing was ever delivered to"""

OUTPUT_HELP = (
    "output: readable key: value lines when stdout is a terminal, else one JSON object per "
    "line (--json / --text choose)"
)

# Fields holding epoch milliseconds: shown with their UTC reading.
_TIME_FIELDS = frozenset(
    {"deliverAt", "deliveredAt", "expireAt", "createdAt", "updatedAt", "timestamp"}
)
# Columns of `nereus list` in text form, in order.
_LIST_COLUMNS = ("timerKey", "status", "deliverAt", "attempts", "lastError")


def add_output_flags(parser: argparse.ArgumentParser) -> None:
    form = parser.add_mutually_exclusive_group()
    form.add_argument(
        "--json",
        dest="output",
        action="store_const",
        const="json",
        help="one JSON object per line (the default when stdout is not a terminal)",
    )
    form.add_argument(
        "--text",
        dest="output",
        action="store_const",
        const="text",
        help="readable key: value lines (the default on a terminal)",
    )


def wants_json(args: argparse.Namespace) -> bool:
    chosen = getattr(args, "output", None)
    if chosen is None:
        return not sys.stdout.isatty()
    return bool(chosen == "json")


def exit_code(doc: Mapping[str, Any]) -> int:
    """The status for an answer of the timer API: a batch's results, one result, a peek."""
    if "found" in doc:
        return EXIT_OK if doc["found"] else EXIT_ABSENT
    results = doc.get("results")
    answers = results if isinstance(results, list) else [doc] if "ok" in doc else []
    bad = [r for r in answers if isinstance(r, Mapping) and r.get("ok") is False]
    if not bad:
        return EXIT_OK
    if all(r.get("status") == "absent" for r in bad):
        return EXIT_ABSENT
    return EXIT_NOT_OK


def print_doc(doc: Mapping[str, Any], args: argparse.Namespace) -> None:
    if wants_json(args):
        print(json.dumps(doc), flush=True)
    else:
        print(text_of(doc), flush=True)


def text_of(doc: Mapping[str, Any]) -> str:
    """A document as people read it: a batch's results one block each, a listing as a
    table, anything else as `key: value` lines (nested objects as `key.field`)."""
    results = doc.get("results")
    if isinstance(results, list):
        return "\n\n".join(text_of(r) for r in results if isinstance(r, Mapping))
    rows = doc.get("rows")
    if isinstance(rows, list):
        return _table(rows, doc)
    return "\n".join(f"{key}: {value}" for key, value in _lines(doc, ""))


def record_line(doc: Mapping[str, Any]) -> str:
    """One delivered record on one line (`nereus tail` in text form): its offset, then
    `key=value` for every field but the headers."""
    parts = [f"#{doc.get('offset')}"]
    for key, value in doc.items():
        if key in ("offset", "headers"):
            continue
        parts.append(f"{key}={_value(key, value)}")
    return "  ".join(parts)


def _lines(doc: Mapping[str, Any], prefix: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for key, value in doc.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.extend(_lines(value, f"{name}."))
        else:
            out.append((name, _value(key, value)))
    return out


def _value(key: str, value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "true" if value else "false"
    if key in _TIME_FIELDS and isinstance(value, int) and not isinstance(value, bool):
        return f"{_utc(value)} ({value})"
    if key == "payload" and isinstance(value, str):
        return _payload(value)
    if isinstance(value, Mapping | Sequence) and not isinstance(value, str):
        return json.dumps(value)
    return str(value)


def _utc(epoch_ms: int) -> str:
    try:
        moment = datetime.fromtimestamp(epoch_ms / 1000, UTC)
    except (OverflowError, OSError, ValueError):
        return str(epoch_ms)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{epoch_ms % 1000:03d}Z"


def _payload(encoded: str) -> str:
    """Base64 as the API carries it: shown as text when it is printable UTF-8."""
    try:
        raw = base64.b64decode(encoded, validate=True)
        text = raw.decode()
    except (binascii.Error, UnicodeDecodeError):
        return f"(base64) {encoded}"
    if text.isprintable():
        return json.dumps(text, ensure_ascii=False)
    return f"(base64) {encoded}"


def _table(rows: list[Any], doc: Mapping[str, Any]) -> str:
    cells = [list(_LIST_COLUMNS)] + [
        [_cell(c, row.get(c)) for c in _LIST_COLUMNS] for row in rows if isinstance(row, Mapping)
    ]
    widths = [max(len(line[i]) for line in cells) for i in range(len(_LIST_COLUMNS))]
    lines = [
        "  ".join(v.ljust(w) for v, w in zip(line, widths, strict=True)).rstrip() for line in cells
    ]
    if not rows:
        lines.append("(no live timers)")
    if doc.get("truncated"):
        lines.append(f"more: --after {doc.get('nextAfter')}")
    return "\n".join(lines)


def _cell(key: str, value: Any) -> str:
    if key == "deliverAt" and isinstance(value, int):
        return _utc(value)
    return _value(key, value)
