"""Reads across the processes of one machine that `nereus serve --processes N` supervises.

Theory of operation: the processes share the HTTP port (one listening socket, inherited), so
a peek or a listing reaches whichever process accepted the connection, while the shards are
spread over the processes by the consumer group. Each process therefore also answers reads
of the shards it owns on a private loopback port (`SiblingReader`), and registers that port
in the supervisor's directory (`SiblingDirectory`). A process asked for a timer whose shard
it does not own asks its siblings (`Siblings.peek`); a listing, which reads every shard,
gathers each sibling's part (`Siblings.parts`); a scrape of `/metrics` gathers each sibling's
own metrics and merges them (`Siblings.metrics`, `adapters.kafka.exposition`), and the
console's fire-lag chart gathers each sibling's lag windows (`Siblings.lag`, opaque bytes
here: `adapters.http.console.lag_merge` decodes and sums them), so one address answers for
the machine. The private port accepts only requests carrying the
supervisor's token (`NEREUS_SIBLING_TOKEN`, made fresh at each start), so
another local user cannot read timers through it without the service's credentials. A
sibling's answer is as fresh as a local read (its shard's latest commit); a shard that no
process owns right now (a rebalance) is `ShardNotLocal`, as it is for a single process. A
sibling that does not answer a scrape in `METRICS_TIMEOUT_S` (restarting, stuck) is left out
of it and counted in `nereus_metrics_siblings_missing`: the scrape itself never fails for it;
the lag chart leaves such a sibling out in the same way, and says so.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import secrets
import threading
import urllib.parse
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import msgspec

from nereus.adapters.kafka import exposition
from nereus.kernel.model import Message
from nereus.service.errors import ShardNotLocal
from nereus.service.results import Peek
from nereus.storage import files

TOKEN_ENV = "NEREUS_SIBLING_TOKEN"
TOKEN_HEADER = "X-Nereus-Sibling"
TIMEOUT_S = 10.0
# A scrape waits this long for its siblings, all asked at once: a live process renders its
# metrics in milliseconds, and Prometheus gives a whole scrape 10 s by default.
METRICS_TIMEOUT_S = 2.0
# The overview waits as long for its siblings' lag windows (each is a copy of a few lists).
LAG_TIMEOUT_S = 2.0
MERGED = "nereus_metrics_processes"
MISSING = "nereus_metrics_siblings_missing"


class Part(msgspec.Struct, frozen=True):
    """One process's part of a listing: the shards it read, their rows, and whether more
    rows follow in any of them."""

    shards: list[int]
    rows: list[Message]
    more: bool


class PeekAnswer(msgspec.Struct, frozen=True):
    peek: Peek | None  # None: the shard is not readable by that process


class SiblingDirectory:
    """The supervisor's directory of its processes' private read addresses: one file per
    process, written atomically, removed when the process stops."""

    def __init__(self, path: str, name: str) -> None:
        self.path = path
        self.name = name
        files.make_dirs(path)

    def _file(self, name: str) -> str:
        return os.path.join(self.path, f"{name}.json")

    def register(self, address: str) -> None:
        # Not mkstemp: its files are 0600 whatever the configured mode says.
        tmp = os.path.join(self.path, f".tmp-{self.name}-{os.getpid()}-{secrets.token_hex(4)}")
        fd = files.create_file(tmp, os.O_WRONLY | os.O_EXCL)
        with os.fdopen(fd, "w") as out:
            json.dump({"process": self.name, "read": address, "pid": os.getpid()}, out)
        os.replace(tmp, self._file(self.name))

    def unregister(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._file(self.name))

    def others(self) -> list[str]:
        """The read addresses of the other processes, in name order."""
        return [address for _, address in self.entries()]

    def entries(self) -> list[tuple[str, str]]:
        """(name, read address) of each other process, in name order."""
        found: list[tuple[str, str]] = []
        for entry in sorted(os.listdir(self.path)):
            if not entry.endswith(".json") or entry == f"{self.name}.json":
                continue
            try:
                with open(os.path.join(self.path, entry)) as f:
                    doc = json.load(f)
                found.append((str(doc["process"]), str(doc["read"])))
            except (OSError, ValueError, KeyError):
                continue  # being replaced, or left by a process that died mid-write
        return found


class SiblingReader:
    """This process's private read port: peeks and listing parts of the shards it owns, its
    own metrics (`metrics`: the exposition text, unmerged), the console's reads (`inspect`)
    and its console's lag windows (`lag`: encoded by the console, which starts its sampler
    when first asked)."""

    def __init__(
        self,
        token: str,
        peek: Callable[[str, str, str], Peek],
        part: Callable[[str, str, str | None, int], Part],
        metrics: Callable[[], str],
        *,
        inspect: Callable[[str, list[Any]], Any] | None = None,
        lag: Callable[[], bytes] | None = None,
    ) -> None:
        reader = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                reader._handle(self)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # the private port is not a public API: no access log

        self.token = token
        self._peek = peek
        self._part = part
        self._metrics = metrics
        self._inspect = inspect
        self._lag = lag
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.address = f"127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(
            target=self.server.serve_forever, name="nereus-sibling-reads", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _handle(self, req: BaseHTTPRequestHandler) -> None:
        if req.headers.get(TOKEN_HEADER) != self.token:
            return _reply(req, 403, b"")
        url = urllib.parse.urlsplit(req.path)
        q = {k: v[0] for k, v in urllib.parse.parse_qs(url.query).items()}
        try:
            if url.path == "/peek":
                try:
                    answer = PeekAnswer(self._peek(q["tenant"], q["queue"], q["key"]))
                except ShardNotLocal:
                    answer = PeekAnswer(None)
                return _reply(req, 200, msgspec.msgpack.encode(answer))
            if url.path == "/part":
                limit = int(q["limit"])
                part = self._part(q["tenant"], q["queue"], q.get("after"), limit)
                return _reply(req, 200, msgspec.msgpack.encode(part))
            if url.path == "/metrics":
                return _reply(req, 200, self._metrics().encode(), "text/plain; version=0.0.4")
            if url.path == "/lag" and self._lag is not None:
                return _reply(req, 200, self._lag())
            if url.path == "/inspect" and self._inspect is not None:
                args = msgspec.json.decode(q["args"].encode(), type=list[Any])
                answer = self._inspect(q["call"], args)
                return _reply(req, 200, msgspec.msgpack.encode(answer))
        except (KeyError, ValueError, TypeError, msgspec.DecodeError) as exc:
            return _reply(req, 400, str(exc).encode())
        return _reply(req, 404, b"")


def _reply(
    req: BaseHTTPRequestHandler,
    status: int,
    body: bytes,
    content_type: str = "application/msgpack",
) -> None:
    req.send_response(status)
    req.send_header("Content-Type", content_type)
    req.send_header("Content-Length", str(len(body)))
    req.end_headers()
    req.wfile.write(body)


class Siblings:
    """Asks the other processes of this machine for what this one cannot read."""

    def __init__(self, directory: SiblingDirectory, token: str) -> None:
        self.directory = directory
        self.token = token

    def _get(
        self, address: str, path: str, query: dict[str, str], timeout_s: float = TIMEOUT_S
    ) -> bytes | None:
        """The body of a 200 answer, or None when the sibling cannot be asked (stopped,
        restarting): a missing answer is treated as a shard owned by nobody here."""
        host, _, port = address.rpartition(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=timeout_s)
        try:
            conn.request(
                "GET", f"{path}?{urllib.parse.urlencode(query)}", headers={TOKEN_HEADER: self.token}
            )
            resp = conn.getresponse()
            body = resp.read()
            return body if resp.status == 200 else None
        except (OSError, http.client.HTTPException):
            return None
        finally:
            conn.close()

    def peek(self, tenant: str, queue: str, timer_key: str) -> Peek:
        for address in self.directory.others():
            body = self._get(address, "/peek", {"tenant": tenant, "queue": queue, "key": timer_key})
            if body is None:
                continue
            answer = msgspec.msgpack.decode(body, type=PeekAnswer)
            if answer.peek is not None:
                return answer.peek
        raise ShardNotLocal("no process of this machine can read the timer's shard right now")

    def parts(self, tenant: str, queue: str, after: str | None, limit: int) -> list[Part]:
        query = {"tenant": tenant, "queue": queue, "limit": str(limit)}
        if after is not None:
            query["after"] = after
        found: list[Part] = []
        for address in self.directory.others():
            body = self._get(address, "/part", query)
            if body is not None:
                found.append(msgspec.msgpack.decode(body, type=Part))
        return found

    def inspect(self, call: str, args: list[Any], kind: Any) -> list[Any]:
        """Each sibling's answer to one console read (`adapters.kafka.inspect`), decoded as
        `kind`; a sibling that does not answer is left out, as a shard owned by nobody."""
        query = {"call": call, "args": msgspec.json.encode(args).decode()}
        found: list[Any] = []
        for address in self.directory.others():
            body = self._get(address, "/inspect", query)
            if body is not None:
                found.append(msgspec.msgpack.decode(body, type=kind))
        return found

    def first(self, call: str, args: list[Any], kind: Any) -> Any:
        """The first sibling's answer to `call` that is not None, asked in name order (an
        audit started by the one holding its shard); None when none gives one."""
        query = {"call": call, "args": msgspec.json.encode(args).decode()}
        for address in self.directory.others():
            body = self._get(address, "/inspect", query)
            if body is not None:
                answer = msgspec.msgpack.decode(body, type=kind)
                if answer is not None:
                    return answer
        return None

    def metrics(self, own: str) -> str:
        """This process's metrics (`own`, its exposition text) merged with every sibling's
        that answers in time, plus how many processes are in the answer and how many
        registered siblings are not."""
        parts = [(self.directory.name, exposition.parse(own))]
        missing = 0
        for name, body in self._gather("/metrics", METRICS_TIMEOUT_S):
            families = _parsed(body)
            if families is None:
                missing += 1
            else:
                parts.append((name, families))
        merged = exposition.merge(parts)
        for family in _scrape_gauges(len(parts), missing):
            merged[family.name] = family
        return exposition.render(merged)

    def lag(self) -> list[bytes | None]:
        """Each registered sibling's console lag windows (encoded), asked all at once; None
        for one that did not answer within `LAG_TIMEOUT_S`."""
        return [body for _, body in self._gather("/lag", LAG_TIMEOUT_S)]

    def _gather(self, path: str, timeout_s: float) -> list[tuple[str, bytes | None]]:
        """Each sibling's answer to `path`, asked all at once; None for one that did not
        answer within `timeout_s`."""
        entries = self.directory.entries()
        if not entries:
            return []
        pool = ThreadPoolExecutor(len(entries), thread_name_prefix="nereus-sibling-gather")
        asked: list[tuple[str, Future[bytes | None]]] = [
            (name, pool.submit(self._get, address, path, {}, timeout_s))
            for name, address in entries
        ]
        wait([f for _, f in asked], timeout=timeout_s)
        # A sibling still trickling its answer is not waited for: its thread ends with its
        # socket's timeout.
        pool.shutdown(wait=False, cancel_futures=True)
        return [(name, f.result() if f.done() else None) for name, f in asked]


def merge_parts(parts: list[Part], shards: int, limit: int) -> tuple[list[Message], bool]:
    """One listing from the parts of every shard: each shard read once (a shard two parts
    claim, mid-rebalance, is taken from the first), sorted by the key's bytes, cut at
    `limit`. Raises ShardNotLocal when a shard is in no part."""
    seen: set[int] = set()
    rows: list[Message] = []
    more = False
    for part in parts:
        fresh = [s for s in part.shards if s not in seen]
        if len(fresh) != len(part.shards):
            # Rows cannot be told apart by shard here: take a part only whole.
            if fresh:
                raise ShardNotLocal("the shards are moving between processes: retry")
            continue
        seen.update(part.shards)
        rows.extend(part.rows)
        more = more or part.more
    missing = sorted(set(range(shards)) - seen)
    if missing:
        raise ShardNotLocal(f"shards {missing} are not readable by any process right now")
    rows.sort(key=lambda m: m.timer_key.encode())
    return rows[:limit], more or len(rows) > limit


def _parsed(body: bytes | None) -> dict[str, exposition.Family] | None:
    """A sibling's answer, or None when there is none or it does not parse (its text is
    left out rather than guessed at)."""
    if body is None:
        return None
    try:
        return exposition.parse(body.decode())
    except ValueError:  # UnicodeDecodeError included
        return None


def _scrape_gauges(merged: int, missing: int) -> list[exposition.Family]:
    return [
        exposition.gauge(
            MERGED, "Processes of this machine whose metrics this answer sums.", merged
        ),
        exposition.gauge(
            MISSING,
            "Sibling processes registered on this machine that did not answer this scrape in "
            "time (left out of it).",
            missing,
        ),
    ]
