"""`nereus serve --kafka ... --processes N`: N service processes on one machine, supervised.

Theory of operation: one Python process runs its shards under one interpreter lock, so a
machine's other cores stay idle however many shards it owns. The supervisor runs N ordinary
Kafka-mode service processes instead, which share the shards through the consumer group as
processes on different machines do. It binds the HTTP socket once and every process inherits
it (`--http-fd`), so each connection is accepted by one of them and clients see one address.
Reads of a shard another process owns go to that process over a private loopback port
(`adapters.kafka.siblings`), registered in DATA/siblings with a token made fresh at each start;
a scrape of /metrics gathers every process's metrics over the same ports and merges them, and
the console's fire-lag chart sums every process's lag windows (`adapters.http.console.lag_merge`);
the console's audits are started and shown over them too (`adapters.kafka.sibling_audits`).
The console's sessions are signed with a key derived from that token, so a page's form is
accepted by whichever process the next connection reaches.

The supervisor owns DATA (`storage.lock`) while it runs, and each process its own data
directory, DATA/process-<i>, which it keeps across restarts, so a restarted process rejoins
the group under the same static member id and reopens its stores. A process that exits is
started again after `RESTART_BACKOFF_S` (its shards are taken over by the others meanwhile,
or handed back to it when it rejoins within the session timeout). SIGTERM or SIGINT stops
every process (each within its own `--stop-timeout-s`), then the supervisor, which exits 0
when every process stopped cleanly. A supervisor that dies without stopping them (SIGKILL, the
OOM killer) takes them with it: each process holds the read end of a pipe whose write end only
the supervisor holds (`--supervisor-fd`), sees its end-of-file when the kernel closes the
supervisor's descriptors, and stops as on SIGTERM; the parent-death signal is a second link
(`adapters.compose.lifeline`).
"""

from __future__ import annotations

import argparse
import functools
import hmac
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from nereus.adapters.compose.lifeline import die_with_parent, lifeline_pipe
from nereus.adapters.http.console.session import Sessions
from nereus.adapters.http.server import bind_socket
from nereus.adapters.kafka.sibling_audits import MachineAudits
from nereus.adapters.kafka.siblings import (
    TOKEN_ENV,
    SiblingDirectory,
    SiblingReader,
    Siblings,
)
from nereus.runtime.log import Logger
from nereus.storage import files
from nereus.storage.errors import StoreError
from nereus.storage.lock import lock_directory

if TYPE_CHECKING:
    from nereus.adapters.http.api import TimerApi
    from nereus.adapters.kafka.service import KafkaService

RESTART_BACKOFF_S = 1.0
# Options of the supervisor's own command line that its processes get in another form.
_OWN_OPTIONS = ("--processes", "--data", "--http")


def child_argv(
    argv: list[str], data_dir: str, fd: int, siblings: str, name: str, *, lifeline_fd: int
) -> list[str]:
    """The `nereus serve` command line of one process: the supervisor's, without
    `--processes`, with its own data directory, the inherited socket and lifeline."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        option = arg.split("=", 1)[0]
        if option in _OWN_OPTIONS:
            skip = "=" not in arg
            continue
        out.append(arg)
    return [
        *out,
        "--data",
        data_dir,
        "--http-fd",
        str(fd),
        "--sibling-dir",
        siblings,
        "--process-name",
        name,
        "--supervisor-fd",
        str(lifeline_fd),
    ]


class Child:
    def __init__(
        self, index: int, argv: list[str], fd: int, lifeline_fd: int, env: dict[str, str]
    ) -> None:
        self.index = index
        self.name = f"process-{index}"
        self.argv = argv
        self.fd = fd
        self.lifeline_fd = lifeline_fd
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None
        self.restarts = 0

    def start(self) -> None:
        # Output goes where the supervisor's goes: one stream of JSON lines, each naming
        # its process.
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "nereus", *self.argv],
            # Every other descriptor is closed in the child (close_fds), the lifeline's
            # write end above all: a process holding it would keep the pipe open.
            pass_fds=(self.fd, self.lifeline_fd),
            env=self.env,
            # The supervisor runs no threads: nothing can hold a lock across the fork.
            preexec_fn=die_with_parent(os.getpid()),  # noqa: PLW1509
        )


def supervise(
    args: argparse.Namespace, argv: list[str], log: Logger, address: tuple[str, int], backlog: int
) -> int:
    """Run `args.processes` Kafka-mode processes behind one listening socket, owning the
    data directory meanwhile (a second supervisor would reset the first one's siblings and
    start processes on its processes' directories)."""
    data = os.path.abspath(args.data)
    files.make_dirs(data)
    try:
        lock = lock_directory(data)
    except StoreError as exc:
        log.error("refused", detail=str(exc))
        return 2
    with lock:
        return _supervise(args, argv, log, address, backlog, data=data)


def _supervise(
    args: argparse.Namespace,
    argv: list[str],
    log: Logger,
    address: tuple[str, int],
    backlog: int,
    *,
    data: str,
) -> int:
    host, port = address
    try:
        sock = bind_socket(host, port)
        # Listening already: connections made while the processes start wait in the backlog.
        sock.listen(backlog)
    except OSError as exc:
        log.error("refused", detail=f"cannot listen on {host}:{port}: {exc}")
        return 2
    sock.set_inheritable(True)
    siblings = os.path.join(data, "siblings")
    shutil.rmtree(siblings, ignore_errors=True)  # addresses of an earlier run's processes
    files.make_dirs(siblings)
    env = {**os.environ, TOKEN_ENV: secrets.token_hex(16)}
    # Open here until every process has stopped, and never written to: its end tells each
    # process that its supervisor is gone, however it went.
    lifeline_fd, lifeline_write_fd = lifeline_pipe()
    children = []
    for i in range(args.processes):
        name = f"process-{i}"
        own = os.path.join(data, name)
        command = child_argv(argv, own, sock.fileno(), siblings, name, lifeline_fd=lifeline_fd)
        children.append(Child(i, command, sock.fileno(), lifeline_fd, env))
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    for child in children:
        child.start()
    bound = sock.getsockname()[1]
    log.info(
        "supervising",
        url=f"http://{host}:{bound}",
        processes=args.processes,
        data=data,
        pids=[c.proc.pid for c in children if c.proc is not None],
    )
    while not stop.wait(0.2):
        for child in children:
            assert child.proc is not None
            code = child.proc.poll()
            if code is None:
                continue
            child.restarts += 1
            log.warning("process_exited", process=child.name, code=code, restarts=child.restarts)
            if stop.wait(RESTART_BACKOFF_S):
                break
            child.start()
    code = _stop_all(children, args.stop_timeout_s, log)
    os.close(lifeline_write_fd)
    return code


def _stop_all(children: list[Child], timeout_s: float, log: Logger) -> int:
    """SIGTERM every process, wait for each (a little past its own stop timeout), kill the
    ones that are still running. 0 when every process stopped with 0."""
    for child in children:
        if child.proc is not None and child.proc.poll() is None:
            child.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout_s + 5
    code = 0
    for child in children:
        if child.proc is None:
            continue
        try:
            rc = child.proc.wait(max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            child.proc.kill()
            rc = child.proc.wait()
            log.error("process_killed", process=child.name)
        if rc != 0:
            code = 1
    log.info("stopped", processes=len(children), code=code)
    return code


def inherited_socket(fd: int) -> socket.socket:
    """The listening socket the supervisor bound, in one of its processes."""
    sock = socket.socket(fileno=fd)
    sock.setblocking(False)
    return sock


def join_siblings(
    service: KafkaService, api: TimerApi, directory: str, name: str | None
) -> Callable[[], None]:
    """Serve this process's reads, metrics and lag windows to its siblings and ask them for
    theirs (a read of a shard owned elsewhere, every scrape of /metrics, every overview);
    returns the step that leaves
    (first in the stopping order: the siblings stop asking before the shards go)."""
    token = os.environ.get(TOKEN_ENV, "")
    if not token:
        raise SystemExit(f"--sibling-dir needs {TOKEN_ENV} (set by the supervisor)")
    console = api.console
    inspect = functools.partial(service.inspect_here, audits=console.local_audits)
    reader = SiblingReader(
        token,
        service.peek_here,
        service.part_here,
        api.own_metrics,
        inspect=inspect,
        lag=console.lag_answer,
    )
    registry = SiblingDirectory(directory, name or f"pid-{os.getpid()}")
    reader.start()
    registry.register(reader.address)
    siblings = Siblings(registry, token)
    service.siblings = siblings
    api.machine_metrics = siblings.metrics
    console.sibling_lag = siblings.lag
    console.audits = MachineAudits(console.local_audits, siblings)
    # One session key for the machine (derived from the supervisor's token): a console form
    # read from one process may be posted to whichever process accepts the next connection.
    console.sessions = Sessions(hmac.digest(token.encode(), b"nereus console sessions", "sha256"))

    def leave() -> None:
        registry.unregister()
        reader.stop()

    return leave
