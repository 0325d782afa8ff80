"""`nereus replay`: what the auditor sees, against real stores.

The replayer must rebuild exactly the store's state, list the open obligations with their
Admission evidence, show the state as of any position, and with `--verify` say where a
store first differs from the replay of its own log.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from nereus import kernel as k
from nereus.adapters.cli.main import main as nereus
from nereus.kernel.model import ShardMeta
from nereus.replay import audit as replay_audit
from nereus.replay.fold import replay
from nereus.storage.codec import encode_row, encode_value
from nereus.storage.schema import SHARD_META_KEY
from nereus.storage.store import ShardStore
from tests.support.builders import T0_MS, interval_at, mid, published, schedule, unknown

PAYLOAD = b"payload"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = nereus(["replay", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    code, out, err = run(capsys, *argv, "--json")
    assert code == 0, err
    doc: dict[str, Any] = json.loads(out)
    return doc


def admission(store: ShardStore, key: str, now_ms: int, seq: int) -> k.PublishAdmission:
    with store.read() as base:
        message = base.get(k.Table.MESSAGES, mid(key).encode())
    assert isinstance(message, k.Message)
    return k.PublishAdmission(
        message_id=message.message_id,
        generation=message.generation,
        version=message.version,
        attempt_id=f"{k.attempt_prefix(message.message_id, message.generation)}{seq}",
        claim_id=f"claim-{seq}",
        owner="node-a",
        descriptor_hash="d" * 16,
        capability=message.capability,
        interval=interval_at(now_ms),
        capacity=k.Capacity(True),
    )


@pytest.fixture
def shard(tmp_path: Path) -> Iterator[tuple[Path, dict[str, k.PublishAdmission]]]:
    """A store with one delivered, one PUBLISHING and one UNKNOWN attempt (positions 1-8)."""
    path = tmp_path / "shard"
    admitted: dict[str, k.PublishAdmission] = {}
    with ShardStore.open(str(path)) as store:
        store.commit([(schedule(key, delay_ms=0), PAYLOAD) for key in ("a", "b", "c")], T0_MS)
        now_ms = T0_MS + 100
        for seq, key in enumerate(("a", "b", "c"), start=1):
            admitted[key] = admission(store, key, now_ms, seq)
            store.commit([(admitted[key], None)], now_ms)  # positions 4, 5, 6
        store.commit(
            [
                (k.PublishOutcome(admitted["a"].attempt_id, mid("a"), 1, published()), None),
                (k.PublishOutcome(admitted["c"].attempt_id, mid("c"), 1, unknown()), None),
            ],
            now_ms + 50,
        )
    yield path, admitted


def test_replay_reports_the_state_and_the_open_obligations(
    shard: tuple[Path, dict[str, k.PublishAdmission]], capsys: pytest.CaptureFixture[str]
) -> None:
    path, admitted = shard
    doc = run_json(capsys, "--data", str(path), "--obligations")
    with ShardStore.open(str(path)) as store, store.state_view() as state:
        assert doc["digest"] == k.state_digest(state)
    assert doc["position"] == doc["entries_folded"] == 8
    assert sum(doc["outcome_counts"].values()) == 8
    assert doc["outcome_counts"]["admitted"] == 3
    assert doc["counters"]["delivered"] == 1
    assert [(o["attempt_id"], o["status"], o["admitted_position"]) for o in doc["obligations"]] == [
        (admitted["b"].attempt_id, "PUBLISHING", 5),
        (admitted["c"].attempt_id, "UNKNOWN", 6),
    ]
    assert all(o["admitted_at_ms"] == T0_MS + 100 for o in doc["obligations"])
    assert doc["obligations"][0]["message_id"] == mid("b")
    assert doc["obligations"][0]["destination"] == "default"
    code, out, _ = run(capsys, "--data", str(path), "--obligations")
    assert code == 0
    assert "obligations  2 open" in out
    assert admitted["b"].attempt_id in out and admitted["c"].attempt_id in out


def test_replay_to_a_position_is_the_state_as_of_that_position(
    shard: tuple[Path, dict[str, k.PublishAdmission]], capsys: pytest.CaptureFixture[str]
) -> None:
    path, _ = shard
    with ShardStore.open(str(path)) as store:
        entries = list(store.iter_log())
    for to in (1, 4, 6):
        doc = run_json(capsys, "--data", str(path), "--to", str(to), "--obligations")
        _, expected = replay(entries[:to], k.KernelConfig())
        assert doc["position"] == to
        assert doc["digest"] == expected.digest
        assert len(doc["obligations"]) == {1: 0, 4: 1, 6: 3}[to]
    code, _, err = run(capsys, "--data", str(path), "--to", "99")
    assert code == 2
    assert err.startswith("nereus replay: refused: ") and "before position 99" in err


def test_replay_to_position_zero_is_the_empty_state(
    shard: tuple[Path, dict[str, k.PublishAdmission]], capsys: pytest.CaptureFixture[str]
) -> None:
    path, _ = shard
    doc = run_json(capsys, "--data", str(path), "--to", "0")
    assert doc["position"] == 0
    assert doc["digest"] == k.state_digest(k.State.initial())


def test_verify_passes_on_an_intact_store(
    shard: tuple[Path, dict[str, k.PublishAdmission]], capsys: pytest.CaptureFixture[str]
) -> None:
    path, _ = shard
    with ShardStore.open(str(path)) as store:
        store.append([(schedule("later"), PAYLOAD)], T0_MS + 500)  # not applied yet
    code, out, err = run(capsys, "--data", str(path), "--verify")
    assert (code, err) == (0, "")
    assert "verify       ok" in out
    assert "position     8 " in out, "verify compares at the applied position"


def test_verify_names_the_first_row_that_differs(
    shard: tuple[Path, dict[str, k.PublishAdmission]], capsys: pytest.CaptureFixture[str]
) -> None:
    path, _ = shard
    with ShardStore.open(str(path)) as store:
        with store.read() as base:
            row = base.get(k.Table.MESSAGES, mid("b").encode())
        assert isinstance(row, k.Message)
        tampered = msgspec.structs.replace(row, txn="tampered")
        with store.env.env.begin(write=True) as txn:
            txn.put(
                mid("b").encode(),
                encode_row(k.Table.MESSAGES, tampered),
                db=store.env.tables[k.Table.MESSAGES],
            )
    code, out, _ = run(capsys, "--data", str(path), "--verify", "--json")
    assert code == 1
    verdict = json.loads(out)["verify"]
    assert verdict["ok"] is False
    assert verdict["first_difference"].startswith(f"table messages, key {mid('b').encode().hex()}")
    assert "tampered" in verdict["first_difference"]
    code, out, _ = run(capsys, "--data", str(path), "--verify")
    assert code == 1
    assert "verify       MISMATCH: table messages" in out


@pytest.mark.parametrize("fold", ["memory", "disk"])
def test_verify_names_a_differing_shard_meta(
    shard: tuple[Path, dict[str, k.PublishAdmission]],
    capsys: pytest.CaptureFixture[str],
    fold: str,
) -> None:
    path, _ = shard
    with ShardStore.open(str(path)) as store:
        meta = msgspec.structs.replace(store.meta, shard_status="PAUSED")
        assert isinstance(meta, ShardMeta)
        with store.env.env.begin(write=True) as txn:
            txn.put(SHARD_META_KEY, encode_value(meta), db=store.env.meta)
    code, out, _ = run(capsys, "--data", str(path), "--verify", "--json", "--fold", fold)
    assert code == 1
    assert json.loads(out)["verify"]["first_difference"].startswith("shard meta differs")


@pytest.mark.parametrize(
    "argv",
    [["--verify", "--to", "3"], ["--verify", "--log", "x.jsonl"]],
    ids=["verify_with_to", "verify_without_a_store"],
)
def test_verify_refuses_what_it_cannot_compare(
    shard: tuple[Path, dict[str, k.PublishAdmission]],
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
) -> None:
    path, _ = shard
    data = [] if "--log" in argv else ["--data", str(path)]
    code, out, err = run(capsys, *data, *argv)
    assert code == 2
    assert out == ""
    assert err.startswith("nereus replay: ")


def test_a_progress_bar_goes_to_stderr_only(
    shard: tuple[Path, dict[str, k.PublishAdmission]], capsys: pytest.CaptureFixture[str]
) -> None:
    path, _ = shard
    code, out, err = run(capsys, "--data", str(path), "--json", "--progress")
    assert code == 0
    assert json.loads(out)["position"] == 8
    assert "replay [" in err and err.endswith("\n")


def test_replay_audits_a_store_of_any_shard(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "shard-7"
    with ShardStore.open(str(path), shard_id="7") as store:
        store.commit([(schedule("a"), PAYLOAD)], T0_MS)
    code, out, err = run(capsys, "--data", str(path), "--verify")
    assert code == 0, err
    assert "verify       ok" in out


# The disk-backed fold ----------------------------------------------------------------------


def test_the_disk_fold_reports_what_the_memory_fold_reports(
    shard: tuple[Path, dict[str, k.PublishAdmission]],
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    path, _ = shard
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    for extra in ((), ("--to", "6"), ("--verify",)):
        memory = run_json(capsys, "--data", str(path), "--obligations", "--fold", "memory", *extra)
        disk = run_json(
            capsys, "--data", str(path), "--obligations", "--fold", "disk",
            "--scratch", str(scratch), *extra,
        )  # fmt: skip
        assert disk == memory
        assert list(scratch.iterdir()) == [], "the scratch store is removed afterwards"
    assert memory["verify"] == {"ok": True, "first_difference": None}


def test_auto_folds_on_disk_past_its_threshold(
    shard: tuple[Path, dict[str, k.PublishAdmission]],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """`--fold auto` (the default) takes the disk once the state covers more positions than
    its threshold: seen here through the scratch directory it makes."""
    path, _ = shard
    made: list[str] = []
    real_mkdtemp = tempfile.mkdtemp

    def mkdtemp(*args: Any, **kwargs: Any) -> str:
        made.append(real_mkdtemp(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(tempfile, "mkdtemp", mkdtemp)
    expected = run_json(capsys, "--data", str(path))
    assert made == []
    monkeypatch.setattr(replay_audit, "AUTO_DISK_POSITIONS", 5)
    assert run_json(capsys, "--data", str(path)) == expected
    assert len(made) == 1 and not Path(made[0]).exists()
