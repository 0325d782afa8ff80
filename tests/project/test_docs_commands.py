"""The shell commands the README and the tutorial show a new user, run against a real
`nereus serve`: the `serve` line with its own flags, each `curl` as the HTTP request it makes
(so the test needs no curl), each `nereus` command as the program, and a `sleep` as a wait.

Theory of operation: a block is split into commands the way a shell would (a quoted body may
span lines; `#` starts a comment), the data directory and the port are put in for the
documented ones, and every answer is recorded; each test then states what a user must see,
in order. A `--follow` is dropped (the test cannot stop a reader that never ends), and a
`sleep` waits until the timer it waits for is delivered, up to a deadline: a loaded test
machine may take longer than the documented pause, which the user's does not."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.support import serve_process

ROOT = Path(__file__).resolve().parents[2]
DOC_PORT = "6632"
DELIVERY_DEADLINE_S = 30.0


def _sh_blocks(path: Path, heading: str) -> list[str]:
    """The ```sh blocks of the section under `heading`, up to the next heading of any level
    (a `#` inside a fenced block is a comment, not a heading)."""
    lines = path.read_text().splitlines()
    start = lines.index(heading)
    blocks: list[str] = []
    fence: list[str] | None = None
    for line in lines[start + 1 :]:
        if fence is not None:
            if line.startswith("```"):
                blocks.append("\n".join(fence) + "\n")
                fence = None
            else:
                fence.append(line)
        elif line.startswith("```sh"):
            fence = []
        elif line.startswith("#"):
            break
    return blocks


def _commands(block: str) -> list[list[str]]:
    out: list[list[str]] = []
    pending = ""
    for line in block.splitlines():
        pending = f"{pending}\n{line}" if pending else line
        try:
            words = shlex.split(pending, comments=True)
        except ValueError:  # a quote still open: the command goes on on the next line
            continue
        if words:
            out.append(words)
        pending = ""
    assert pending == "", f"an unterminated command: {pending!r}"
    return out


class Session:
    """One service and the answers to the commands run against it."""

    def __init__(self, data: Path, documented_data: str, serve_words: list[str]) -> None:
        self.data = data
        self.documented_data = documented_data
        self.port = serve_process.free_port()
        args = [self._put_in(w) for w in serve_words]
        assert args[:2] == ["nereus", "serve"], serve_words
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "nereus", *args[1:]],
            cwd=ROOT,
            stderr=subprocess.PIPE,
            text=True,
        )
        serve_process.wait_serving(self.proc)
        self.answers: list[Any] = []

    def _put_in(self, word: str) -> str:
        word = word.replace(self.documented_data, str(self.data))
        return word.replace(f"127.0.0.1:{DOC_PORT}", f"127.0.0.1:{self.port}")

    def run(self, words: list[str]) -> None:
        if words[0] == "curl":
            self.answers.append(self._curl(words[1:]))
        elif words[0] == "nereus":
            self.answers.append(self._nereus(words))
        elif words[0] == "sleep":
            self._wait_for_delivery(float(words[1]))
        else:
            raise AssertionError(f"a command this test cannot run: {words}")

    def _curl(self, args: list[str]) -> tuple[int, Any]:
        method, body, headers, url = "GET", None, {}, ""
        it = iter(args)
        for word in it:
            if word == "-s":
                continue
            if word == "-X":
                method = next(it)
            elif word == "-H":
                name, _, value = next(it).partition(":")
                headers[name.strip()] = value.strip()
            elif word == "-d":
                body = next(it).encode()
                method = "POST" if method == "GET" else method
            else:
                assert not word.startswith("-"), f"a curl option this test does not know: {word}"
                url = word
        url = url.replace(f"localhost:{DOC_PORT}", f"127.0.0.1:{self.port}")
        request = urllib.request.Request(f"http://{url}", body, headers, method=method)
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read())

    def _nereus(self, words: list[str]) -> subprocess.CompletedProcess[str]:
        args = [self._put_in(w) for w in words[1:] if w != "--follow"]
        return subprocess.run(
            [sys.executable, "-m", "nereus", *args],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    def _wait_for_delivery(self, documented_s: float) -> None:
        time.sleep(documented_s)
        deadline = time.monotonic() + DELIVERY_DEADLINE_S
        url = f"http://127.0.0.1:{self.port}/api/v1/timers/reminders/invoice:42"
        while True:
            with urllib.request.urlopen(url, timeout=30) as response:
                if json.loads(response.read()).get("status") == "DELIVERED":
                    return
            assert time.monotonic() < deadline, "the documented timer was never delivered"
            time.sleep(0.2)

    def stop(self) -> None:
        serve_process.stop(self.proc)


def _run_documented(data: Path, documented_data: str, serve: str, block: str) -> Session:
    (serve_words,) = _commands(serve)
    session = Session(data, documented_data, serve_words)
    try:
        for words in _commands(block):
            session.run(words)
    finally:
        session.stop()
    return session


def _ok(answer: Any) -> Any:
    status, body = answer
    assert status == 200, answer
    return body


@pytest.mark.timeout(240)
def test_the_readme_service_commands_work_as_shown(tmp_path: Path) -> None:
    serve, block = _sh_blocks(ROOT / "README.md", "## The service")[:2]
    session = _run_documented(tmp_path / "data", "DIR", serve, block)
    posted, scheduled, listed, tail, delivered, cancel, replay = session.answers
    (result,) = _ok(posted)["results"]
    assert (result["ok"], result["status"], result["timerKey"]) == (True, "scheduled", "invoice:42")
    assert _ok(scheduled)["status"] == "SCHEDULED"
    assert [row["timerKey"] for row in _ok(listed)["rows"]] == ["invoice:42"]
    assert tail.returncode == 0, tail.stderr
    (line,) = tail.stdout.splitlines()
    assert json.loads(line)["txn"] == "invoice-42-v1"
    peek = _ok(delivered)
    assert peek["status"] == "DELIVERED" and peek["evidence"] is not None
    late = cancel[1]
    assert (late["ok"], late["status"], late["evidence"]) == (False, "too_late", peek["evidence"])
    assert replay.returncode == 0, replay.stderr
    assert "verify       ok" in replay.stdout


@pytest.mark.timeout(240)
def test_the_tutorial_service_commands_work_as_shown(tmp_path: Path) -> None:
    tutorial = ROOT / "docs" / "tutorial.md"
    serve, block = _sh_blocks(tutorial, "## 5. The same through the service")
    (audit,) = _sh_blocks(tutorial, "## 6. Audit")
    session = _run_documented(tmp_path / "data", "/tmp/nereus-tutorial", serve, block)
    posted, scheduled, delivered, tail, cancel = session.answers
    assert _ok(posted)["results"][0]["status"] == "scheduled"
    assert _ok(scheduled)["status"] == "SCHEDULED"
    assert _ok(delivered)["status"] == "DELIVERED"
    assert tail.returncode == 0 and '"invoice-42-v1"' in tail.stdout, tail
    assert cancel[1]["status"] == "too_late"
    # The audit runs once the service is stopped, as the tutorial says.
    (replay_words,) = _commands(audit)
    replay = session._nereus(replay_words)
    assert replay.returncode == 0, replay.stderr
    assert "verify       ok" in replay.stdout and "0 open" in replay.stdout


@pytest.mark.timeout(240)
def test_the_serve_guide_commands_work_as_shown(tmp_path: Path) -> None:
    (serve, *_) = _sh_blocks(ROOT / "README.md", "## The service")
    http, cli = _sh_blocks(ROOT / "docs" / "how-to" / "serve.md", "## Use it")
    session = _run_documented(tmp_path / "data", "DIR", serve, http + cli)
    answers = session.answers
    posted, peeked, listed, deleted, scheduled, peek, moved, listing, cancel, tail = answers
    statuses = [r["status"] for r in _ok(posted)["results"]]
    assert statuses == ["scheduled", "absent"]  # a cancel of a key never scheduled
    assert _ok(peeked)["status"] == "SCHEDULED"
    assert [row["timerKey"] for row in _ok(listed)["rows"]] == ["invoice:42"]
    assert _ok(deleted)["status"] == "canceled"
    for command in (scheduled, peek, moved, listing, cancel):
        assert command.returncode == 0, (command.args, command.stdout, command.stderr)
    assert '"scheduled"' in scheduled.stdout and '"canceled"' in cancel.stdout
    assert json.loads(moved.stdout)["results"][0]["status"] == "rescheduled"
    # The guide's tail follows; without --follow (dropped here) a queue nothing was
    # delivered to is said, with exit status 4, as the guide's exit-status list says.
    assert tail.returncode == 4 and "nothing was ever delivered" in tail.stderr, tail
