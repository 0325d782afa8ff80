"""A Kafka broker of a test's own: for tests that stop, pause or restart a broker.

`scripts/kafka` on two free loopback ports with its state in a temporary directory, never
the shared broker the other Kafka tests use, and always stopped at the end; with `sasl`, a
third port where clients must authenticate (SASL_PLAINTEXT, PLAIN, one user `SASL_USER`
with `SASL_PASSWORD`); with `proxy_port`, a listener advertised at that port instead of its
own, for a TCP proxy in front of it (`tests.support.tcp_proxy`: clients that connect through the
proxy stay behind it, so the test can cut them off while others reach the broker directly).
`Broker` can stop it keeping its data and start it again from the same command line
(`scripts/kafka start` would reformat its storage), and pause and resume it (SIGSTOP /
SIGCONT: a broker that stops answering without closing a connection).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "kafka"
SASL_USER = "nereus"
SASL_PASSWORD = "broker-secret"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


@dataclass
class Broker:
    bootstrap: str
    state: Path
    env: dict[str, str]
    sasl_bootstrap: str | None = None  # the SASL_PLAINTEXT listener, if asked for
    proxied_port: int | None = None  # the listener advertised at a proxy's port, if asked for

    @property
    def pidfile(self) -> Path:
        return self.state / "kafka.pid"

    def script(self, command: str) -> None:
        subprocess.run([str(SCRIPT), command], env=self.env, check=True, timeout=180)

    def pid(self) -> int:
        return int(self.pidfile.read_text().strip())

    def pause(self) -> None:
        os.kill(self.pid(), signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.pid(), signal.SIGCONT)

    def stop_keeping_data(self, timeout_s: float = 30.0) -> list[str]:
        """SIGTERM the broker and wait until it is gone; returns its command line."""
        pid = self.pid()
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().rstrip("\0").split("\0")
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        if Path(f"/proc/{pid}").exists():
            os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 30
            while Path(f"/proc/{pid}").exists():
                assert time.monotonic() < deadline, f"broker pid {pid} outlived SIGKILL by 30 s"
                time.sleep(0.05)
        assert (self.state / "data").is_dir(), "the broker's data did not survive its stop"
        return argv

    def restart(self, argv: list[str], timeout_s: float = 60.0) -> None:
        """Run the broker again from the same command line and data, as scripts/kafka would
        without reformatting, and wait until it serves metadata."""
        # Detached like scripts/kafka does it (setsid, pid file written by the wrapper), so
        # the broker is not this process's child: a child would linger as a zombie after
        # `scripts/kafka stop` kills it, and the script would wait for it forever.
        self.pidfile.unlink()
        with open(self.state / "stdout-restart.log", "wb") as out:
            subprocess.run(
                [
                    "setsid",
                    "-f",
                    "bash",
                    "-c",
                    'echo $$ >"$0"; exec "$@"',
                    str(self.pidfile),
                    *argv,
                ],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                check=True,
                timeout=10,
            )
        deadline = time.monotonic() + 5
        while not self.pidfile.exists() or not self.pidfile.read_text().strip():
            assert time.monotonic() < deadline, "the restarted broker wrote no pid"
            time.sleep(0.05)
        pid = self.pid()
        admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 0})
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert Path(f"/proc/{pid}").exists(), f"the restarted broker exited ({self.state})"
            try:
                md = admin.list_topics(timeout=2)
                if md.brokers and md.controller_id is not None and md.controller_id >= 0:
                    return
            except KafkaException:
                pass
            time.sleep(0.2)
        raise AssertionError(f"the restarted broker did not serve within {timeout_s} s")


def own_broker_fixture(name: str, *, sasl: bool = False) -> object:
    """A module-scoped fixture running a broker of the module's own."""

    @pytest.fixture(scope="module")
    def fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
        yield from _run_broker(tmp_path_factory, name, sasl)

    return fixture


def new_broker(state: Path, *, sasl: bool = False, proxy_port: int | None = None) -> Broker:
    """A broker (not started) on free loopback ports, its state under `state`; with
    `proxy_port`, one more listener (`Broker.proxied_port`) that tells its clients to connect
    to 127.0.0.1:`proxy_port`."""
    port, controller = free_port(), free_port()
    env = dict(os.environ)
    env.update(
        NEREUS_KAFKA_PORT=str(port),
        NEREUS_KAFKA_CONTROLLER_PORT=str(controller),
        NEREUS_KAFKA_DIR=str(state),
        NEREUS_KAFKA_STOP_TIMEOUT="10",
    )
    sasl_bootstrap = None
    if sasl:
        sasl_port = free_port()
        env.update(
            NEREUS_KAFKA_SASL_PORT=str(sasl_port),
            NEREUS_KAFKA_SASL_USER=SASL_USER,
            NEREUS_KAFKA_SASL_PASSWORD=SASL_PASSWORD,
        )
        sasl_bootstrap = f"127.0.0.1:{sasl_port}"
    proxied_port = None
    if proxy_port is not None:
        proxied_port = free_port()
        env.update(
            NEREUS_KAFKA_PROXIED_PORT=str(proxied_port),
            NEREUS_KAFKA_PROXIED_ADVERTISED=f"127.0.0.1:{proxy_port}",
        )
    return Broker(f"127.0.0.1:{port}", state, env, sasl_bootstrap, proxied_port)


def _run_broker(
    tmp_path_factory: pytest.TempPathFactory, name: str, sasl: bool = False
) -> Iterator[Broker]:
    with running(new_broker(tmp_path_factory.mktemp(name) / "broker", sasl=sasl)) as broker:
        yield broker


@contextlib.contextmanager
def running(broker: Broker) -> Iterator[Broker]:
    """Start `broker`; stop it (and remove its data) however the block ends."""
    try:
        broker.script("start")
        yield broker
    finally:
        if broker.pidfile.exists():
            with contextlib.suppress(ProcessLookupError, ValueError):
                broker.resume()  # a paused broker cannot hear the stop
        broker.script("stop")
