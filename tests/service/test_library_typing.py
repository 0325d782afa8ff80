"""`mypy --strict` catches a misspelled or mistyped argument of the library's calls.

Two programs are type-checked the way an application would check itself, against the
installed package's annotations: one with a mistake on each line marked `# wrong`, which
must get an error on exactly those lines, and one using every call correctly (timedelta,
aware datetime, the async forms, the consumer, Kafka options), which must get none.
"""

from __future__ import annotations

import re
import subprocess
import sys
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

WRONG = """\
import asyncio
from datetime import date, datetime, timedelta
import nereus
from nereus import KafkaNereus, Nereus

def main(n: Nereus) -> None:
    n.schedule("q", "k", b"x", delay=5)  # wrong
    n.schedule("q", "k", b"x", delay_ms="soon")  # wrong
    n.schedule("q", "k", b"x", deliver_at_ms=date(2026, 12, 1))  # wrong
    n.schedule("q", "k", b"x", deliver_at_ms=timedelta(days=1))  # wrong
    n.schedule("q", "k", b"x", lifetime_ms=datetime(2027, 1, 1))  # wrong
    n.schedule("q", "k", "text")  # wrong
    n.schedule("q", "k", b"x", 1000)  # wrong
    n.schedule("q", "k", b"x", partition=7)  # wrong
    n.schedule("q", "k", b"x", headers=[("a", 1)])  # wrong
    n.reschedule("q", "k", dealy_ms=5)  # wrong
    n.cancel("q", "k", txn=5)  # wrong
    n.peek("q", 5)  # wrong
    n.list("q", limit="10")  # wrong
    status: int = n.schedule("q", "k", b"x").status  # wrong
    stored: str | None = n.peek("q", "k").payload  # wrong
    n.consumer("q", grup="g")  # wrong
    nereus.open_consumer("d", "q", "g")  # wrong
    nereus.open_async_consumer("d", "q", group="g", tenant=1)  # wrong
    KafkaNereus.connect("127.0.0.1:9092", comands_topic="c")  # wrong
    KafkaNereus.connect("127.0.0.1:9092", shards="4")  # wrong

async def amain(n: Nereus) -> None:
    await n.schedule_async("q", "k", b"x", lifetime_ms=1.5)  # wrong
    n.cancel_async("q", "k").ok  # wrong

asyncio.run(amain(Nereus.open("d")))
"""

RIGHT = """\
import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path
from nereus import KafkaNereus, Listing, LocalRecord, Nereus, NereusRefused, Peek, Result
from nereus import AsyncConsumer, open_async_consumer, open_consumer

def main(n: Nereus) -> None:
    r: Result = n.schedule("q", "k", b"x", delay_ms=timedelta(days=7), txn="t-1")
    try:
        code: str = n.cancel("q", "k").raise_for_status().code
    except NereusRefused as refused:
        print(refused.code, refused.message, refused.result.status)
    stored: bytes | None = n.peek("q", "k").payload
    n.schedule("q", "k2", bytearray(b"x"), delay_ms=5_000, partition="p", headers={"a": "b"})
    n.schedule("q", "k3", memoryview(b"x"), deliver_at_ms=datetime.now(UTC))
    n.schedule("q", "k4", b"x", deliver_at_ms=1_780_000_000_000, expire_at_ms=1_790_000_000_000)
    n.reschedule("q", "k", delay_ms=timedelta(hours=1), lifetime_ms=timedelta(days=1))
    n.cancel("q", "k", txn="t-1", expected_version=2)
    p: Peek = n.peek("q", "k")
    page: Listing = n.list("q", after="k", limit=10)
    print(r.ok, p.found, [row.timer_key for row in page.rows], page.next_after)
    with n.consumer("q", group="g") as consumer:
        for record in consumer.records(idle_timeout_s=1.0):
            got: LocalRecord = record
            print(got.payload, got.offset)
        consumer.commit()
    n.consumer("q", group="h", auto_commit=False).run(lambda rec: print(rec.txn))

async def amain(n: Nereus) -> None:
    r = await n.schedule_async("q", "k", b"x", delay_ms=timedelta(seconds=1))
    moved = await n.reschedule_async("q", "k", deliver_at_ms=datetime.now(UTC))
    gone = await n.cancel_async("q", "k")
    p = await n.peek_async("q", "k")
    page = await n.list_async("q", limit=5)
    print(r.status, moved.status, gone.status, p.found, page.truncated)
    async with n.async_consumer("q", group="a") as mine:
        async for mine_record in mine.records(limit=1):
            print(mine_record.offset)

def elsewhere() -> None:
    with open_consumer("d", "q", group="g", tenant="acme", max_batch=10) as consumer:
        print([record.payload for record in consumer.records(limit=2)])

async def elsewhere_async() -> None:
    c: AsyncConsumer
    async with open_async_consumer(Path("d"), "q", group="g", auto_commit=False) as c:
        async for record in c:
            got: LocalRecord = record
            await c.commit(got)
        print(await c.poll(timeout_s=1.0), c.committed)

def kafka() -> None:
    with KafkaNereus.connect(
        "127.0.0.1:9092",
        commands_topic="c",
        shards=4,
        destination_topics={"q": "t"},
        client_config={"security.protocol": "SASL_PLAINTEXT"},
    ) as k:
        k.schedule("q", "k", b"x", delay_ms=timedelta(seconds=1))

asyncio.run(amain(Nereus.open("d")))
"""


def _mypy(tmp_path: Path) -> tuple[str, str, str]:
    # Module names of their own: the shared cache (which keeps the package's analysis warm)
    # must not take these files for an earlier run's.
    tag = uuid.uuid4().hex[:8]
    wrong, right = f"wrong_{tag}", f"right_{tag}"
    (tmp_path / f"{wrong}.py").write_text(WRONG)
    (tmp_path / f"{right}.py").write_text(RIGHT)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--config-file",
            str(ROOT / "pyproject.toml"),
            "--cache-dir",
            str(ROOT / ".mypy_cache"),
            "--no-error-summary",
            "--show-error-codes",
            str(tmp_path / f"{wrong}.py"),
            str(tmp_path / f"{right}.py"),
        ],
        cwd=ROOT,
        check=False,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode in (0, 1), done.stderr
    return done.stdout, wrong, right


def test_mypy_strict_catches_each_mistake_and_accepts_the_correct_program(
    tmp_path: Path,
) -> None:
    out, wrong, right = _mypy(tmp_path)
    errors: dict[str, set[int]] = {wrong: set(), right: set()}
    for line in out.splitlines():
        match = re.match(rf".*?({wrong}|{right})\.py:(\d+): error:", line)
        if match:
            errors[match.group(1)].add(int(match.group(2)))
    assert errors[right] == set(), out
    marked = {i for i, text in enumerate(WRONG.splitlines(), start=1) if text.endswith("# wrong")}
    assert errors[wrong] == marked, out
