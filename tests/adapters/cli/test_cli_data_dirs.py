"""`nereus replay`, `export` and `snapshot` take the `--data DIR` that `nereus serve` took.

The embedded default keeps its shard in DIR/shard, Kafka mode one store per shard in
DIR/shard-N; a shard store's own directory (the old form) still works. With several shards
every one is read in turn (one section, or one JSON document `{"shards": {...}}`), or the
one `--shard N` names; a directory holding no store is refused saying what was looked for,
and one damaged shard is reported without hiding the others. What `export`, `import`,
`snapshot` and `tail --group` create is private (files 0600, directories 0700) unless
`--file-mode` widens it (`0640`: directories `0750`); a mode with other bits is refused.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from nereus.adapters.cli.main import main as nereus
from nereus.storage import files
from nereus.storage.store import ShardStore
from tests.support.builders import T0_MS, schedule
from tests.support.file_modes import wrong_modes

PAYLOAD = b"payload"


def _store(path: Path, keys: list[str], shard_id: str | None = None) -> None:
    with ShardStore.open(str(path), shard_id=shard_id) as store:
        store.commit([(schedule(key, txn=f"t-{key}"), PAYLOAD) for key in keys], T0_MS)


@pytest.fixture
def embedded(tmp_path: Path) -> Path:
    """The data directory of `nereus serve --data DIR`: DIR/shard (and DIR/destination)."""
    _store(tmp_path / "shard", ["a", "b"])
    (tmp_path / "destination").mkdir()
    return tmp_path


@pytest.fixture
def kafka(tmp_path: Path) -> Path:
    """The data directory of `nereus serve --kafka`: DIR/shard-N for the shards it owned."""
    for n, keys in ((0, ["a"]), (1, ["b", "c"]), (3, ["d", "e", "f"])):
        _store(tmp_path / f"shard-{n}", keys, shard_id=f"kafka:nereus.commands:{n}")
    (tmp_path / "group-instance-id").write_text("nereus-x")
    return tmp_path


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = nereus(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_replay_takes_the_serve_directory_and_the_shard_store_alike(
    embedded: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for data in (embedded, embedded / "shard"):
        code, out, err = _run(capsys, "replay", "--data", str(data), "--verify", "--json")
        assert code == 0, err
        doc = json.loads(out)
        assert doc["position"] == 2 and doc["verify"]["ok"] is True


def test_replay_reads_every_kafka_shard_or_the_one_named(
    kafka: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _run(capsys, "replay", "--data", str(kafka), "--verify", "--json")
    assert code == 0, err
    shards = json.loads(out)["shards"]
    assert {name: doc["position"] for name, doc in shards.items()} == {
        "shard-0": 1,
        "shard-1": 2,
        "shard-3": 3,
    }
    assert all(doc["verify"]["ok"] for doc in shards.values())
    code, out, _ = _run(capsys, "replay", "--data", str(kafka))
    assert code == 0
    assert [line for line in out.splitlines() if line.startswith("== ")] == [
        f"== shard-{n} ({kafka / f'shard-{n}'})" for n in (0, 1, 3)
    ]
    code, out, _ = _run(capsys, "replay", "--data", str(kafka), "--shard", "3", "--json")
    assert code == 0 and json.loads(out)["position"] == 3
    code, _, err = _run(capsys, "replay", "--data", str(kafka), "--shard", "2")
    assert code == 2 and "no store of shard 2" in err and "0, 1, 3" in err


def test_a_damaged_shard_is_reported_and_the_others_still_read(
    kafka: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    damaged = kafka / "shard-1" / "data.mdb"
    damaged.write_bytes(b"\x00" * 8192)
    code, out, err = _run(capsys, "replay", "--data", str(kafka), "--json")
    assert code == 2
    shards = json.loads(out)["shards"]
    assert shards["shard-0"]["position"] == 1 and shards["shard-3"]["position"] == 3
    assert "refused" in shards["shard-1"] and str(damaged) in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["replay", "--shard", "0"], "one shard store"),
        (["replay"], "no shard store here"),
        (["export"], "no shard store here"),
        (["snapshot"], "no shard store here"),
    ],
)
def test_what_is_not_a_data_directory_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    if "--shard" in argv:
        _store(tmp_path / "one", ["a"])
        data = tmp_path / "one"
    else:
        data = tmp_path / "empty"
        data.mkdir()
    code, out, err = _run(capsys, *argv, "--data", str(data))
    assert (code, out) == (2, "")
    assert message in err and "refused" in err


def test_export_writes_one_file_per_shard_and_each_imports(
    kafka: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = _run(capsys, "export", "--data", str(kafka))
    assert code == 2 and "--out DIRECTORY" in err
    out_dir = tmp_path / "exports"
    code, _, err = _run(capsys, "export", "--data", str(kafka), "--out", str(out_dir))
    assert code == 0, err
    assert sorted(p.name for p in out_dir.iterdir()) == [
        "shard-0.jsonl",
        "shard-1.jsonl",
        "shard-3.jsonl",
    ]
    code, _, err = _run(
        capsys, "import", "--log", str(out_dir / "shard-3.jsonl"), "--data", str(tmp_path / "new")
    )
    assert code == 0, err
    with ShardStore.open(str(tmp_path / "new"), create=False) as store:
        assert store.meta.position == 3
    code, out, _ = _run(capsys, "export", "--data", str(kafka), "--shard", "1")
    assert code == 0 and len(out.splitlines()) == 3  # the header and two entries


def test_export_and_snapshot_of_the_serve_directory(
    embedded: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "log.jsonl"
    code, _, err = _run(capsys, "export", "--data", str(embedded), "--out", str(log))
    assert code == 0 and "exported 2 entries" in err
    code, out, err = _run(capsys, "snapshot", "--data", str(embedded))
    assert code == 0, err
    assert out.startswith("snapshot at position 2: ") and str(embedded / "shard") in out


def test_snapshot_of_every_kafka_shard(kafka: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(capsys, "snapshot", "--data", str(kafka), "--compact")
    assert code == 0, err
    assert [line.split(":")[0] for line in out.splitlines() if "snapshot at" in line] == [
        "shard-0",
        "shard-1",
        "shard-3",
    ]
    assert out.count("compacted") == 3
    code, out, _ = _run(capsys, "snapshot", "--data", str(kafka), "--shard", "0")
    assert code == 0 and out.startswith("snapshot at position 1")


# What the commands create: private unless --file-mode says otherwise ------------------------


@pytest.fixture
def file_mode_reset() -> Iterator[None]:
    """`--file-mode` sets the process's mode (a command is one process); these tests run
    several commands in this one, so it is put back after each."""
    yield
    files.set_file_mode(files.DEFAULT_FILE_MODE)


@pytest.mark.usefixtures("file_mode_reset")
def test_what_the_commands_create_is_private_unless_given_a_mode(
    kafka: Path, embedded: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Default first: once a command here is given --file-mode, this process keeps it.
    exports, store = tmp_path / "private" / "exports", tmp_path / "private" / "store"
    assert _run(capsys, "export", "--data", str(kafka), "--out", str(exports))[0] == 0
    log = str(exports / "shard-3.jsonl")
    assert _run(capsys, "import", "--log", log, "--data", str(store))[0] == 0
    assert _run(capsys, "snapshot", "--data", str(store))[0] == 0
    # Nothing was delivered to the queue: said, status 4, the group's files made all the same.
    assert _run(capsys, "tail", "reminders", "--data", str(embedded), "--group", "g")[0] == 4
    assert {"shard-0.jsonl", "LOCK", "data.mdb", "lock.mdb", "snapshots"} <= {
        p.name for p in (tmp_path / "private").rglob("*")
    }
    assert wrong_modes(tmp_path / "private", file_mode=0o600, directory_mode=0o700) == []
    # The fixture made `destination` itself; what tail's group made inside it is Nereus's.
    made = sorted((embedded / "destination").iterdir())
    assert {p.name for p in made} >= {"data.mdb", "lock.mdb", "consumers"}
    for inside in made:
        assert wrong_modes(inside, file_mode=0o600, directory_mode=0o700) == []

    wide, mode = tmp_path / "wide", ("--file-mode", "0640")
    assert _run(capsys, "export", "--data", str(kafka), "--out", str(wide / "x"), *mode)[0] == 0
    log = str(wide / "x" / "shard-1.jsonl")
    assert _run(capsys, "import", "--log", log, "--data", str(wide / "s"), *mode)[0] == 0
    assert _run(capsys, "snapshot", "--data", str(wide / "s"), *mode)[0] == 0
    assert wrong_modes(wide, file_mode=0o640, directory_mode=0o750) == []


def test_a_file_mode_that_is_not_read_and_write_bits_is_refused(
    embedded: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for bad in ("0755", "0400", "rw", "01600"):
        with pytest.raises(SystemExit) as info:
            nereus(["snapshot", "--data", str(embedded), "--file-mode", bad])
        assert info.value.code == 2
        assert "file mode" in capsys.readouterr().err
    assert files.file_mode() == files.DEFAULT_FILE_MODE
