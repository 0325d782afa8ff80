"""`nereus demo`: the README's demo, from an installed package (no checkout needed).

It runs the main job on the embedded default, the steps `./scripts/demo` shows: start
`nereus serve` (a child process, on a free loopback port, with an assumed clock error of
5 ms so timers fire on a host that reports no clock synchronisation), schedule four timers
due in 0 to 3 s and one more, cancel that one, print the four deliveries with `nereus tail
--follow` as they arrive, cancel a delivered timer (it answers `too_late` with the
delivery's evidence: exit status 3, expected), stop the service and rebuild the state from
the shard log, checked against the store (`nereus replay --verify --obligations`). Each
step is the real command, so what it prints is what a user of that command sees. The data
directory is kept for a look afterwards (`--data` chooses it; by default a new one under
the temporary directory).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from typing import Any

from nereus.adapters.cli.output import EXIT_NOT_OK, add_output_flags, wants_json
from nereus.storage import files

SERVE_TIMEOUT_S = 30.0
DELIVERY_TIMEOUT_S = 20.0
QUEUE = "reminders"


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "demo",
        help="run the README's demo: serve, schedule, cancel, tail, a late cancel, replay",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--data", help="data directory to use (default: a new temporary one)")
    add_output_flags(p)
    p.set_defaults(handler=run)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _nereus(*argv: str) -> int:
    """One real `nereus` command, run in this process (a new interpreter per command costs
    seconds on a loaded machine, and the timers are due in seconds)."""
    from nereus.adapters.cli.main import main  # noqa: PLC0415 (main imports this module)

    sys.stdout.flush()
    return main(list(argv))


def _tail(*argv: str) -> int:
    """`nereus tail`, in a process of its own: it can be given up on after a timeout."""
    command = [sys.executable, "-m", "nereus", "tail", *argv]
    return subprocess.run(command, timeout=DELIVERY_TIMEOUT_S, check=False).returncode


def _wait_serving(url: str, server: subprocess.Popen[bytes], log: str) -> bool:
    deadline = time.monotonic() + SERVE_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.poll() is not None:
            break
        with contextlib.suppress(OSError), urllib.request.urlopen(f"{url}/healthz", timeout=1):
            return True
        time.sleep(0.1)
    print(f"nereus demo: the service did not start; its log: {log}", file=sys.stderr)
    return False


def run(args: argparse.Namespace) -> int:
    data = args.data or tempfile.mkdtemp(prefix="nereus-demo.")
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    form = "--json" if wants_json(args) else "--text"
    log = f"{data.rstrip(os.sep)}.log"
    with open(log, "ab", opener=files.opener) as log_file:
        serve = ["serve", "--data", data, "--http", f"127.0.0.1:{port}"]
        # Hosts that report no clock synchronisation (containers, most VMs) fire nothing
        # unless the operator states an error bound: the demo states 5 ms.
        serve += ["--assume-clock-error-ms", "5"]
        server = subprocess.Popen([sys.executable, "-m", "nereus", *serve], stderr=log_file)
    try:
        if not _wait_serving(url, server, log):
            return 1
        print(f"== serving {url}, data in {data} (service log: {log})", flush=True)
        print("== schedule four timers (0 to 3 s) and one to cancel", flush=True)
        for i in range(4):
            when = ["--delay-ms", str(i * 1000), "--payload", f"hello {i}", "--txn", f"demo-{i}"]
            _nereus("schedule", QUEUE, f"demo:{i}", *when, "--url", url, form)
        # Due long after the cancel, however slow the machine.
        when = ["--delay-ms", "10000", "--payload", "never"]
        _nereus("schedule", QUEUE, "demo:cancelled", *when, "--url", url, form)
        print("== cancel one before it fires", flush=True)
        _nereus("cancel", QUEUE, "demo:cancelled", "--url", url, form)
        print("== waiting for deliveries (nereus tail --follow --limit 4)", flush=True)
        tailed = _tail(QUEUE, "--data", data, "--follow", "--limit", "4", form)
        if tailed != 0:
            return tailed
        print("== a late cancel of a delivered timer answers too_late, with the evidence")
        late = _nereus("cancel", QUEUE, "demo:0", "--txn", "demo-0", "--url", url, form)
        print(f"   (exit status {late}: answered, not ok, as expected)", flush=True)
        if late != EXIT_NOT_OK:
            return late or 1
    except subprocess.TimeoutExpired:
        print(f"nereus demo: no deliveries in {DELIVERY_TIMEOUT_S:.0f} s; see {log}")
        return 1
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    print("== audit: rebuild the state from the shard log and compare with the store", flush=True)
    return _nereus("replay", "--data", data, "--verify", "--obligations")
