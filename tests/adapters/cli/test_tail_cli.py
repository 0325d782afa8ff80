"""`nereus tail` prints every record of a queue from `--from`, however many there are.

The local destination reads a topic a page (1,000 records) at a time; `tail` without
`--follow` must read page after page to the end, and `--limit` means exactly that many.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from nereus.adapters.cli.main import main as nereus
from nereus.adapters.local.destination import LocalDestination
from nereus.runtime.destination import PreparedPublish, Send

RECORDS = 2_500


def _fill(data: Path, queue: str, count: int) -> None:
    dest = LocalDestination(str(data / "destination"))
    try:
        sends = []
        for i in range(count):
            prepared = PreparedPublish(
                "local", queue, None, f"v{i}".encode(), (), f"m{i}", 1, f"t{i}", 0, None, False
            )
            sends.append(Send(f"m{i}.1.{uuid.uuid4().hex[:4]}", prepared))
        dest.submit(sends, 1_000)
        assert len(dest.poll(0)) == count
    finally:
        dest.close()


@pytest.fixture
def data(tmp_path: Path) -> Path:
    _fill(tmp_path, "reminders", RECORDS)
    _fill(tmp_path, "other", 3)
    return tmp_path


def _tail(capsys: pytest.CaptureFixture[str], *args: str) -> list[int]:
    assert nereus(["tail", *args]) == 0
    return [json.loads(line)["offset"] for line in capsys.readouterr().out.splitlines()]


def test_tail_prints_every_record(data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _tail(capsys, "reminders", "--data", str(data)) == list(range(RECORDS))


def test_tail_from_an_offset_and_with_a_limit(
    data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _tail(capsys, "reminders", "--data", str(data), "--from", "2400") == list(
        range(2400, RECORDS)
    )
    assert _tail(capsys, "reminders", "--data", str(data), "--limit", "1500") == list(range(1500))
    assert _tail(capsys, "reminders", "--data", str(data), "--limit", "5000") == list(
        range(RECORDS)
    )
    assert _tail(capsys, "other", "--data", str(data)) == [0, 1, 2]
