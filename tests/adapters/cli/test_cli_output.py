"""The CLI for people and for programs: output forms, exit statuses, `reschedule`, `tail` of
an unknown queue, `export`'s progress, and `nereus demo`.

Statuses, from the rule written in `adapters/cli/output.py` (and each command's --help):
0 every result ok (peek: found), 1 refused by the service (an HTTP error), 2 usage or
unreachable, 3 answered not ok (too_late, rejected), 4 absent (a timer that is not there,
or for tail a queue nothing was delivered to). The output is one JSON object per line when
stdout is not a terminal (as before this change: scripts keep working), readable `key:
value` lines on a terminal (checked on a real pseudo-terminal), and `--json`/`--text`
choose either way.
"""

from __future__ import annotations

import base64
import json
import os
import pty
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nereus.adapters.cli.main import main as nereus
from nereus.adapters.cli.output import exit_code, text_of
from tests.adapters.local.test_async_consumer import fill
from tests.support.http_harness import QUEUE, Service, config, schedule, start_service

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize(
    ("doc", "status"),
    [
        ({"results": [{"ok": True, "status": "scheduled"}]}, 0),
        ({"results": [{"ok": True, "status": "unchanged"}]}, 0),
        ({"results": [{"ok": False, "status": "too_late"}]}, 3),
        ({"results": [{"ok": False, "status": "rejected", "code": "txn_reused"}]}, 3),
        ({"results": [{"ok": False, "status": "absent"}]}, 4),
        (
            {"results": [{"ok": False, "status": "absent"}, {"ok": False, "status": "too_late"}]},
            3,
        ),
        ({"results": [{"ok": True, "status": "canceled"}, {"ok": False, "status": "absent"}]}, 4),
        ({"ok": True, "status": "canceled"}, 0),
        ({"ok": False, "status": "absent"}, 4),
        ({"ok": False, "status": "too_late"}, 3),
        ({"found": False}, 4),
        ({"found": True, "status": "SCHEDULED"}, 0),
        ({"rows": [], "truncated": False, "nextAfter": None}, 0),
    ],
)
def test_the_exit_status_follows_the_answer(doc: dict[str, object], status: int) -> None:
    assert exit_code(doc) == status


def test_the_text_form_reads_as_key_value_lines_and_a_table() -> None:
    one = {
        "ok": False,
        "status": "too_late",
        "deliverAt": 1_796_307_536_209,
        "payload": base64.b64encode(b"hello 0").decode(),
        "evidence": {"destination": "reminders", "offset": 41},
        "lastError": None,
    }
    assert text_of(one).splitlines() == [
        "ok: false",
        "status: too_late",
        "deliverAt: 2026-12-03T14:18:56.209Z (1796307536209)",
        'payload: "hello 0"',
        "evidence.destination: reminders",
        "evidence.offset: 41",
        "lastError: -",
    ]
    binary = text_of({"payload": base64.b64encode(b"\xff\x00").decode()})
    assert binary == "payload: (base64) /wA="
    listing = {
        "rows": [
            {"timerKey": "a", "status": "SCHEDULED", "deliverAt": 0, "attempts": 0},
            {"timerKey": "longer-key", "status": "UNCERTAIN", "deliverAt": 1000, "attempts": 2},
        ],
        "truncated": True,
        "nextAfter": "longer-key",
    }
    assert text_of(listing).splitlines() == [
        "timerKey    status     deliverAt                 attempts  lastError",
        "a           SCHEDULED  1970-01-01T00:00:00.000Z  0         -",
        "longer-key  UNCERTAIN  1970-01-01T00:00:01.000Z  2         -",
        "more: --after longer-key",
    ]


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = nereus(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _wait_delivered(svc: Service, count: int) -> None:
    deadline = time.monotonic() + 30
    while len(svc.delivered()) < count:
        assert time.monotonic() < deadline, "the timer was not delivered"
        time.sleep(0.02)


def test_each_command_exits_by_its_answer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with start_service(tmp_path / "data") as svc:
        url = ("--url", svc.url)
        gone_url = svc.url
        code, out, _ = _cli(capsys, "schedule", QUEUE, "k", "--delay-ms", "60000", *url)
        assert code == 0 and json.loads(out)["results"][0]["status"] == "scheduled"
        code, out, _ = _cli(capsys, "reschedule", QUEUE, "k", "--delay-ms", "120000", *url)
        assert code == 0 and json.loads(out)["results"][0]["status"] == "rescheduled"
        code, out, _ = _cli(capsys, "peek", QUEUE, "k", *url)
        assert code == 0 and json.loads(out)["status"] == "SCHEDULED"
        code, out, _ = _cli(capsys, "cancel", QUEUE, "k", *url)
        assert code == 0 and json.loads(out)["status"] == "canceled"
        # The timer is no longer pending: absent, status 4, for each command that names it.
        code, out, _ = _cli(capsys, "cancel", QUEUE, "k", *url)
        assert code == 4 and json.loads(out)["status"] == "absent"
        code, out, _ = _cli(capsys, "reschedule", QUEUE, "never", "--delay-ms", "5", *url)
        assert code == 4 and json.loads(out)["results"][0]["status"] == "absent"
        code, out, _ = _cli(capsys, "peek", QUEUE, "never", *url)
        assert code == 4 and json.loads(out) == {"found": False}
        # A delivered timer: a cancel is too late (answered, not ok): status 3.
        assert _cli(capsys, "schedule", QUEUE, "now", "--payload", "hi", *url)[0] == 0
        _wait_delivered(svc, 1)
        code, out, _ = _cli(capsys, "cancel", QUEUE, "now", *url)
        assert code == 3 and json.loads(out)["status"] == "too_late"
        code, out, _ = _cli(capsys, "reschedule", QUEUE, "now", "--delay-ms", "5", *url)
        assert code == 3 and json.loads(out)["results"][0]["status"] == "too_late"
        code, out, _ = _cli(capsys, "list", QUEUE, *url)
        assert code == 0 and json.loads(out)["rows"] == []
        # The same answers in the readable form.
        code, out, _ = _cli(capsys, "cancel", QUEUE, "now", *url, "--text")
        assert code == 3
        assert {"ok: false", "status: too_late", "evidence.offset: 0"} <= set(out.splitlines())
        code, out, _ = _cli(capsys, "list", QUEUE, *url, "--text")
        assert out.splitlines()[-1] == "(no live timers)"
    # Nobody listens any more: not reached, status 2.
    code, _, err = _cli(capsys, "peek", QUEUE, "k", "--url", gone_url)
    assert code == 2 and "cannot reach" in err


def test_a_refusal_exits_1_with_the_answer_or_its_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with start_service(tmp_path / "data", config()) as svc:
        code, out, err = _cli(capsys, "peek", QUEUE, "k", "--url", svc.url, "--token", "bad")
        assert (code, out) == (1, "")
        assert json.loads(err)["error"]["code"] == "unauthorized"
        code, out, err = _cli(capsys, "peek", QUEUE, "k", "--url", svc.url, "--text")
        assert (code, out) == (1, "")
        assert err.startswith("nereus peek: refused (HTTP 401) unauthorized")


def _on_a_terminal(*argv: str) -> tuple[int, str]:
    """Run `nereus ARGV` with stdout on a pseudo-terminal; its status and what it showed."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "nereus", *argv],
        cwd=ROOT,
        stdout=follower,
        stderr=subprocess.PIPE,
    )
    os.close(follower)
    shown = b""
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # EIO: the terminal's last writer closed it
            break
        if not chunk:
            break
        shown += chunk
    os.close(leader)
    return proc.wait(60), shown.decode().replace("\r\n", "\n")


def test_a_terminal_gets_the_readable_form_unless_json_is_asked_for(tmp_path: Path) -> None:
    with start_service(tmp_path / "data") as svc:
        code, shown = _on_a_terminal(
            "schedule", QUEUE, "k", "--delay-ms", "60000", "--txn", "t-1", "--url", svc.url
        )
        assert code == 0
        assert {"ok: true", "status: scheduled", "txn: t-1"} <= set(shown.splitlines())
        code, shown = _on_a_terminal("peek", QUEUE, "k", "--url", svc.url, "--json")
        assert code == 0 and json.loads(shown)["txn"] == "t-1"


def test_tail_says_a_queue_nothing_was_delivered_to(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fill(tmp_path, "reminders", 2)
    code, out, err = _cli(capsys, "tail", "remiders", "--data", str(tmp_path))
    assert (code, out) == (4, "")
    assert "nothing was ever delivered to queue 'remiders'" in err
    assert "reminders" in err.split("queues with deliveries:")[1]
    code, out, err = _cli(capsys, "tail", "remiders", "--data", str(tmp_path), "--group", "g")
    assert (code, out) == (4, "") and "nothing was ever delivered" in err
    code, out, _ = _cli(capsys, "tail", "reminders", "--data", str(tmp_path))
    assert code == 0 and [json.loads(x)["offset"] for x in out.splitlines()] == [0, 1]
    code, out, _ = _cli(capsys, "tail", "reminders", "--data", str(tmp_path), "--text")
    assert code == 0
    lines = out.splitlines()
    assert [x.split()[0] for x in lines] == ["#0", "#1"]
    assert 'payload="p0"' in lines[0] and "queue=reminders" in lines[0]


def test_export_draws_a_progress_line_as_replay_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with start_service(tmp_path / "data") as svc:
        for i in range(3):  # a batch is one entry: three requests, three entries at least
            assert [r["status"] for r in svc.post(schedule(f"k{i}"), token=None)] == ["scheduled"]
    out = str(tmp_path / "log.jsonl")
    code, _, err = _cli(capsys, "export", "--data", str(tmp_path / "data"), "--out", out)
    assert code == 0 and "export [" not in err  # stderr is not a terminal: no bar
    code, _, err = _cli(
        capsys, "export", "--data", str(tmp_path / "data"), "--out", out, "--progress"
    )
    entries = len(Path(out).read_text().splitlines()) - 1  # after the header line
    assert code == 0 and entries >= 3
    assert f"export [{'#' * 30}] {entries}/{entries} 100.0%" in err
    assert f"exported {entries} entries to {out}" in err


def test_demo_runs_the_readmes_demo(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "nereus", "demo", "--json", "--data", str(tmp_path / "demo")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    docs = [json.loads(x) for x in done.stdout.splitlines() if x.startswith("{")]
    delivered = [d for d in docs if "offset" in d and "payload" in d]
    assert [base64.b64decode(d["payload"]) for d in delivered] == [
        f"hello {i}".encode() for i in range(4)
    ]
    assert {"status": "canceled", "timerKey": "demo:cancelled"}.items() <= docs[5].items()
    late = docs[-1]
    assert (late["status"], late["timerKey"], late["evidence"]["offset"]) == (
        "too_late",
        "demo:0",
        0,
    )
    assert "verify       ok" in done.stdout
