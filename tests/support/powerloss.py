"""Power loss for a child process's LMDB files: build the shim, run under it, cut the power.

Theory of operation: a process death (SIGKILL) loses nothing the OS already holds, so it
cannot tell a store that syncs from one that does not. `tests/support/powerloss_shim.c`, preloaded
into a child, keeps beside each tracked file (by default every `data.mdb` the child opens
for writing) a shadow holding only what was made durable: written bytes reach the shadow at
fsync/fdatasync, through an O_DSYNC descriptor or at msync, never otherwise. After the child
is killed, `cut_power` puts each shadow in place of its file and removes LMDB's lock file,
as a machine that lost power and booted again would find them. A rename reaches the disk
only when its directory is synced (the shim then renames the shadow); `cut_power_folder`
gives a folder whose files are all tracked its power-loss image: each file under its durable
name with its durable bytes, and no file whose name never became durable. `script_under_shim`
runs a small Python script under the shim, for the tests of the shim itself.

The shim is compiled by the first test that needs it, with the machine's C compiler, into
a directory of the session; where there is no compiler the test is skipped with that reason,
except under CI (`CI` set), where the compiler is part of the machine and its absence fails.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.support.worker_process import read_line, wait_ready

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "tests" / "support" / "powerloss_shim.c"
ACK_TIMEOUT_S = 60.0
SHADOWS_ENV = "NEREUS_POWERLOSS_SHADOWS"
NAMES_ENV = "NEREUS_POWERLOSS_NAMES"
_built: dict[str, Path] = {}


def shim() -> Path:
    """The compiled shim (built once per session)."""
    if "path" in _built:
        return _built["path"]
    compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if compiler is None:
        reason = (
            "no C compiler (cc/gcc) to build the power-loss shim tests/support/powerloss_shim.c"
        )
        if os.environ.get("CI"):
            pytest.fail(reason + " on CI, whose machine has one")
        pytest.skip(reason)
    out = Path(tempfile.mkdtemp(prefix="nereus-powerloss-")) / "powerloss_shim.so"
    done = subprocess.run(
        [compiler, "-shared", "-fPIC", "-O2", "-o", str(out), str(SOURCE), "-ldl", "-lpthread"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, f"building the power-loss shim failed:\n{done.stderr}"
    _built["path"] = out
    return out


def child_env(shadows: Path, names: tuple[str, ...] = ("data.mdb",)) -> dict[str, str]:
    """The environment of a child whose tracked files lose what they did not sync."""
    shadows.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    preload = env.get("LD_PRELOAD", "")
    env["LD_PRELOAD"] = f"{shim()}:{preload}" if preload else str(shim())
    env[SHADOWS_ENV] = str(shadows)
    env[NAMES_ENV] = ":".join(names)
    return env


def shadow_of(shadows: Path, real: Path) -> Path:
    return shadows / str(real.resolve()).replace("/", "%")


def cut_power(shadows: Path, *files: Path) -> None:
    """Replace each file by what a power loss would have left of it (its shadow), and drop
    the LMDB lock file beside it. The writer must be dead."""
    for real in files:
        shadow = shadow_of(shadows, real)
        if shadow.exists():
            shutil.copyfile(shadow, real)
        else:
            # Never opened for writing under the shim: nothing of it was made durable here,
            # and it was there before, so it stays.
            assert real.exists(), f"{real} was never written and does not exist"
        lock = real.parent / "lock.mdb"
        if lock.exists():
            lock.unlink()


def cut_power_folder(shadows: Path, folder: Path) -> None:
    """Make `folder`, every file of which the dead writer tracked (a name pattern of its
    `child_env`), what a power loss would have left: each file whose name became durable
    holds its durable bytes, and a file whose name never became durable is gone."""
    real = folder.resolve()
    named = {Path(shadow.name.replace("%", "/")): shadow for shadow in shadows.iterdir()}
    durable = {path: shadow for path, shadow in named.items() if path.parent == real}
    for path in real.iterdir():
        if path not in durable:
            path.unlink()
    for path, shadow in durable.items():
        shutil.copyfile(shadow, path)


@contextmanager
def script_under_shim(
    script: str, argument: Path, shadows: Path, names: tuple[str, ...], where: str
) -> Iterator[None]:
    """Run the Python `script` (its one argument: `argument`) under the shim, tracking the
    files `names` match, until it prints `ready`; the body sees what the running process
    wrote, and the process is killed on leaving it (the caller then cuts the power)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", script, str(argument)],
        env=child_env(shadows, names),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        wait_ready(proc, where, 30)
        yield
    finally:
        proc.kill()
        proc.wait()


def _read_acks(proc: subprocess.Popen[bytes], count: int, where: str) -> list[str]:
    """The child's next `count` ack lines (it keeps writing meanwhile)."""
    assert proc.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + ACK_TIMEOUT_S
    while len(lines) < count:
        raw = read_line(proc, max(deadline - time.monotonic(), 0))
        assert raw is not None, f"{where}: only {len(lines)} of {count} acks in time"
        line = raw.decode().strip()
        assert line, f"{where}: the worker stopped: {proc.communicate()[1].decode()[-2000:]}"
        if line.startswith("ack"):
            lines.append(line)
    return lines


def acks_then_power_loss(
    command: list[str],
    shadows: Path,
    acks: int,
    where: str,
    *files: Path,
    names: tuple[str, ...] = ("data.mdb",),
) -> list[str]:
    """Run `command` under the power-loss shim (tracking the files `names` match), SIGKILL
    it after its `acks`-th ack line, and cut the power on `files`; returns the ack lines it
    printed."""
    proc = subprocess.Popen(
        command,
        cwd=ROOT,
        env=child_env(shadows, names),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        wait_ready(proc, where, 30)
        told = _read_acks(proc, acks, where)
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    cut_power(shadows, *files)
    return told
