"""The `nereus schedule|cancel|peek|list` client against a configured service.

The token comes from `--token` or `NEREUS_TOKEN`; without one a configured service answers
401 and the client exits 1 with the error body on stderr.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.support.http_harness import QUEUE, config, start_service

ROOT = Path(__file__).resolve().parents[3]


def _nereus(*args: str, token: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "NEREUS_TOKEN"}
    if token is not None:
        env["NEREUS_TOKEN"] = token
    return subprocess.run(
        [sys.executable, "-m", "nereus", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_client_sends_its_token(tmp_path: Path) -> None:
    with start_service(tmp_path / "data", config()) as svc:
        url = ("--url", svc.url)
        denied = _nereus("schedule", QUEUE, "k1", "--delay-ms", "60000", *url)
        assert denied.returncode == 1
        assert json.loads(denied.stderr)["error"]["code"] == "unauthorized"
        made = _nereus("schedule", QUEUE, "k1", "--delay-ms", "60000", *url, token="acme-all")
        assert made.returncode == 0, made.stderr
        assert json.loads(made.stdout)["results"][0]["status"] == "scheduled"
        listed = _nereus("list", QUEUE, "--limit", "5", *url, "--token", "acme-all")
        assert [r["timerKey"] for r in json.loads(listed.stdout)["rows"]] == ["k1"]
        peeked = _nereus("peek", QUEUE, "k1", *url, token="acme-reader")
        assert json.loads(peeked.stdout)["producerSub"] == "acme-ops"
        # DELETE needs only a valid credential of the tenant: no grant at all will do.
        gone = _nereus("cancel", QUEUE, "k1", *url, token="acme-nothing")
        assert json.loads(gone.stdout)["status"] == "canceled"
