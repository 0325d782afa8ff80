"""Snapshots, the Recovery Floor, and the JSON Lines export.

The property: for any generated log and any snapshot point, the snapshot plus the fold of
the rest of the log equals the replay of the whole log. Compaction must refuse to cut the
log without a covering snapshot or below an open obligation's Admission, and a compacted
store must still reopen and verify. An exported log must round-trip exactly, import into an
equal store, and be refused (naming the line) when a line is missing or garbled.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nereus import kernel as k
from nereus.adapters.cli.main import main as nereus
from nereus.kernel.codes import POSITION_CODES
from nereus.replay.disk import replay_on_disk
from nereus.replay.fold import replay
from nereus.storage.codec import frame
from nereus.storage.errors import StoreError
from nereus.storage.jsonl import JsonlLog, export_log, import_log
from nereus.storage.snapshot import (
    _read_frames,
    _write_frame,
    compact_log,
    load_snapshot,
    read_snapshot,
    write_snapshot,
)
from nereus.storage.store import ShardStore
from tests.support import strategies
from tests.support.builders import (
    OTHER_DIGEST,
    T0_MS,
    interval_at,
    mid,
    published,
    schedule,
    unknown,
)

PAYLOAD = b"payload"
OTHER_PAYLOAD = b"other payload"


def live_digest(store: ShardStore) -> str:
    with store.state_view() as state:
        return k.state_digest(state)


def full_replay_digest(store: ShardStore) -> str:
    _, result = replay(store.iter_log(1, store.meta.position), store.config)
    return result.digest


def admit(store: ShardStore, key: str, now_ms: int, seq: int) -> str:
    with store.read() as base:
        message = base.get(k.Table.MESSAGES, mid(key).encode())
    assert isinstance(message, k.Message)
    attempt_id = f"{k.attempt_prefix(message.message_id, message.generation)}{seq}"
    record = k.PublishAdmission(
        message_id=message.message_id,
        generation=message.generation,
        version=message.version,
        attempt_id=attempt_id,
        claim_id=f"claim-{seq}",
        owner="node-a",
        descriptor_hash="d" * 16,
        capability=message.capability,
        interval=interval_at(now_ms),
        capacity=k.Capacity(True),
    )
    _, results = store.commit([(record, None)], now_ms)
    first = results[-1][1][0]
    assert isinstance(first, k.EntryOutcome) and first.code is k.Code.ADMITTED, first
    return attempt_id


def outcome(
    store: ShardStore, key: str, attempt_id: str, result: k.Published | k.Unknown, now_ms: int
) -> None:
    record = k.PublishOutcome(attempt_id, mid(key), 1, result)
    store.commit([(record, None)], now_ms)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[ShardStore]:
    with ShardStore.open(str(tmp_path / "shard")) as opened:
        yield opened


def fill(store: ShardStore, count: int, now_ms: int = T0_MS, prefix: str = "k") -> None:
    store.append([(schedule(f"{prefix}{i}"), PAYLOAD) for i in range(count)], now_ms)
    while store.apply_pending():
        pass


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = nereus(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# The snapshot property ---------------------------------------------------------------------


@given(
    actions=strategies.action_lists(),
    cuts=st.lists(st.floats(0, 1), min_size=1, max_size=3),
)
@settings(
    max_examples=strategies.max_examples(25),
    deadline=None,
    suppress_health_check=(HealthCheck.too_slow, HealthCheck.data_too_large),
)
def test_snapshot_plus_the_rest_of_the_log_equals_the_whole_replay(
    tmp_path_factory: pytest.TempPathFactory, actions: list[strategies.Action], cuts: list[float]
) -> None:
    driver = strategies.drive(actions, check_invariants=False)
    entries = [s.entry for s in driver.steps if s.outcome.code not in POSITION_CODES]
    points = sorted({round(c * len(entries)) for c in cuts})
    config = strategies.CONFIG
    with ShardStore.open(str(tmp_path_factory.mktemp("snap") / "shard"), config=config) as store:
        snapshots: list[tuple[int, str]] = []
        done = 0
        for point in points:
            store.apply(entries[done:point])
            done = point
            path, header = write_snapshot(store)
            assert header.position == point
            snapshots.append((point, path))
        store.apply(entries[done:])
        whole = full_replay_digest(store)
        assert whole == live_digest(store)
        for point, path in snapshots:
            header, memory = read_snapshot(path, config)
            assert header.position == point
            assert k.state_digest(memory.state) == k.state_digest(
                k.fold(k.State.initial(config), entries[:point])[0]
            )
            _, result = replay(store.iter_log(point + 1), config, start=memory)
            assert result.position == len(entries)
            assert result.digest == whole, f"snapshot at {point} of {len(entries)}"
            # The same restored into LMDB in bounded memory, and the rest folded on disk.
            scratch = str(tmp_path_factory.mktemp("disk") / "scratch")
            on_disk, result = replay_on_disk(
                store.iter_log(point + 1), config, scratch, snapshot=path, batch_entries=7
            )
            on_disk.close()
            assert (result.position, result.digest) == (len(entries), whole)


def test_a_damaged_snapshot_is_refused(store: ShardStore) -> None:
    fill(store, 5)
    path, _ = write_snapshot(store)
    blob = bytearray(Path(path).read_bytes())
    blob[len(blob) // 2] ^= 0x20
    Path(path).write_bytes(bytes(blob))
    with pytest.raises(StoreError) as caught:
        read_snapshot(path, store.config)
    assert str(caught.value).startswith(f"{path}: ")
    assert "frame" in str(caught.value)


def test_a_snapshot_whose_rows_do_not_match_its_digest_is_refused(
    store: ShardStore, tmp_path: Path
) -> None:
    """Every frame intact, one row changed: only the digest over what was restored can tell,
    in memory and on disk alike."""
    fill(store, 5)
    path, _ = write_snapshot(store)
    with open(path, "rb") as f:
        frames = list(_read_frames(f, path))
    table, key, value = msgspec.msgpack.decode(frames[-1])
    field = next(name for name, v in value.items() if isinstance(v, int) and v > 0)
    value[field] += 1  # a valid row, another state
    changed = msgspec.msgpack.encode((table, key, value))
    with open(path, "wb") as f:
        for body in [*frames[:-1], changed]:
            _write_frame(f, body)
    with pytest.raises(StoreError, match="does not match its recorded digest"):
        read_snapshot(path, store.config)
    with (
        ShardStore.open(str(tmp_path / "restored")) as restored,
        pytest.raises(StoreError, match="does not match its recorded digest"),
    ):
        load_snapshot(path, restored)


def test_rows_load_only_into_an_empty_store(store: ShardStore) -> None:
    fill(store, 1)
    with pytest.raises(ValueError, match="empty store"):
        store.load_rows(store.meta, [])


def test_a_snapshot_under_another_configuration_is_refused(store: ShardStore) -> None:
    fill(store, 2)
    path, _ = write_snapshot(store)
    with pytest.raises(StoreError, match="another kernel configuration"):
        read_snapshot(path, k.KernelConfig(max_attempts=2))


def test_a_snapshot_is_synced_before_its_rename_and_its_folder_after(
    store: ShardStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Replacing a file atomically and durably takes three steps in this order: fsync the
    new file's bytes, rename it to its name, fsync the folder holding the name. A rename
    before the bytes are synced may leave the name on an empty or partial file after a
    power loss; without the folder's fsync the name may not survive at all (the power-loss
    test of the same rule is tests/storage/test_snapshot_durability.py)."""
    fill(store, 300)
    events: list[tuple[str, int, int]] = []  # (what, inode, size) in the order they happened
    real = {name: getattr(os, name) for name in ("fsync", "fdatasync", "replace", "rename")}

    def synced(fd: int) -> None:
        info = os.fstat(fd)
        events.append(("dir sync" if stat.S_ISDIR(info.st_mode) else "file sync", *_id(info)))

    def fsync(fd: int) -> None:
        real["fsync"](fd)
        synced(fd)

    def fdatasync(fd: int) -> None:
        real["fdatasync"](fd)
        synced(fd)

    def renamer(name: str) -> Callable[[str, str], None]:
        def rename(source: str, target: str) -> None:
            moved = os.stat(source)
            real[name](source, target)
            events.append(("rename", *_id(moved)))

        return rename

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "fdatasync", fdatasync)
    monkeypatch.setattr(os, "replace", renamer("replace"))
    monkeypatch.setattr(os, "rename", renamer("rename"))
    path, _ = write_snapshot(store)
    monkeypatch.undo()
    snapshot = _id(os.stat(path))
    folder = _id(os.stat(os.path.dirname(path)))
    assert snapshot[1] > 10_000, "the snapshot is too small to take more than one write"
    assert events == [
        ("file sync", *snapshot),  # every byte it will ever have, synced
        ("rename", *snapshot),  # then given its name
        ("dir sync", *folder),  # then the name made durable
    ], events


def _id(info: os.stat_result) -> tuple[int, int]:
    return info.st_ino, info.st_size


# Compaction: the Recovery Floor ------------------------------------------------------------


def test_compaction_refuses_without_a_covering_snapshot(store: ShardStore) -> None:
    fill(store, 10)
    with pytest.raises(StoreError, match="no snapshot at or above position 4") as caught:
        compact_log(store, 5)
    assert caught.value.path == store.env.data_file
    fill(store, 1, prefix="late")  # position 11
    write_snapshot(store)  # at 11
    fill(store, 4, prefix="later")  # up to 15
    with pytest.raises(StoreError, match="no snapshot at or above position 12"):
        compact_log(store, 13)
    with pytest.raises(StoreError, match="above the applied position"):
        compact_log(store, 17)
    assert [e.position for e in store.iter_log()] == list(range(1, 16))
    assert compact_log(store, 12) == 11
    assert store.log_info.floor == 12
    assert next(e.position for e in store.iter_log()) == 12


def test_compaction_refuses_a_floor_above_an_open_obligation(store: ShardStore) -> None:
    fill(store, 1, prefix="a")  # position 1: schedule a0 (delay 1 s)
    now_ms = T0_MS + 2_000
    publishing = admit(store, "a0", now_ms, 1)  # position 2
    store.commit([(schedule("b0", delay_ms=0), PAYLOAD)], now_ms)  # position 3
    uncertain = admit(store, "b0", now_ms + 10, 2)  # position 4
    outcome(store, "b0", uncertain, unknown(), now_ms + 20)  # position 5: still an obligation
    fill(store, 3, now_ms, prefix="c")  # positions 6..8
    write_snapshot(store)
    with pytest.raises(StoreError, match="open obligation admitted at position 2"):
        compact_log(store, 3)
    assert compact_log(store, 2) == 1, "the Admission itself must stay"
    outcome(store, "a0", publishing, published(), now_ms + 30)  # position 9
    write_snapshot(store)
    with pytest.raises(StoreError, match="open obligation admitted at position 4"):
        compact_log(store, 6)
    assert compact_log(store, 4) == 2
    with store.read() as base:
        obligations = [v for _, v in base.items(k.Table.OBLIGATIONS)]
    assert len(obligations) == 1 and isinstance(obligations[0], k.Obligation)
    assert obligations[0].admitted_position == 4


def test_a_compacted_store_reopens_replays_and_verifies(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = str(tmp_path / "shard")
    with ShardStore.open(path) as store:
        fill(store, 12)
        store.commit([(k.Cancel("acme", "reminders", "k3"), None)], T0_MS + 10)
        _, header = write_snapshot(store)
        assert compact_log(store, header.position + 1) == header.position
        fill(store, 3, T0_MS + 20, prefix="after")
        expected = live_digest(store)
    with ShardStore.open(path) as store:
        assert store.log_info.floor == header.position + 1
        assert live_digest(store) == expected
        fill(store, 2, T0_MS + 30, prefix="reopened")
        assert [e.position for e in store.iter_log()] == list(range(14, 19))
        expected = live_digest(store)
    for fold in ("memory", "disk"):  # from the snapshot, then the rest of the log
        argv = ("replay", "--data", path, "--verify", "--json", "--fold", fold)
        code, out, err = run_cli(capsys, *argv)
        assert code == 0, err
        doc = json.loads(out)
        assert doc["verify"] == {"ok": True, "first_difference": None}
        assert doc["digest"] == expected
        assert doc["position"] == 18
    code, out, err = run_cli(capsys, "replay", "--data", path, "--to", "5")
    assert code == 2
    assert err.startswith("nereus replay: refused: ") and "compacted" in err


# JSON Lines export and import ------------------------------------------------------------


@pytest.fixture
def exported(store: ShardStore, tmp_path: Path) -> Path:
    fill(store, 6)
    now_ms = T0_MS + 2_000
    attempt = admit(store, "k1", now_ms, 1)
    outcome(store, "k1", attempt, published(7, now_ms), now_ms + 5)
    store.commit(
        [
            (k.Cancel("acme", "reminders", "k2", txn="c-1"), None),
            (schedule("k9", digest=OTHER_DIGEST, size=13, headers=(("h", "ü✓"),)), OTHER_PAYLOAD),
            (k.LaneGate("acme", "reminders", "CLOSED", reason="audit"), None),
        ],
        now_ms + 6,
    )
    store.append([(schedule("pending"), PAYLOAD)], now_ms + 7)  # appended, never applied
    out = tmp_path / "log.jsonl"
    with out.open("w", encoding="utf-8") as f:
        assert export_log(store, f) == store.log_last_position == 12
    return out


def test_an_exported_log_round_trips(store: ShardStore, exported: Path) -> None:
    source = JsonlLog(str(exported))
    assert source.header.store_id == store.header.store_id
    assert source.header.shard_id == store.header.shard_id
    assert source.header.config_fingerprint == store.config.fingerprint()
    assert (source.header.first_position, source.header.last_position) == (1, 12)
    assert list(source.entries()) == list(store.iter_log())
    assert list(source.entries(3, 5)) == list(store.iter_log(3, 5))


def test_an_imported_log_folds_to_the_same_state(
    store: ShardStore, exported: Path, tmp_path: Path
) -> None:
    with import_log(str(exported), str(tmp_path / "imported")) as imported:
        assert imported.header.store_id != store.header.store_id
        assert imported.header.shard_id == store.header.shard_id
        assert list(imported.iter_log()) == list(store.iter_log())
        assert imported.meta.position == 12, "the import folds the whole log"
        while store.apply_pending():
            pass
        assert live_digest(imported) == live_digest(store)
    with pytest.raises(StoreError, match="already holds a log"):
        import_log(str(exported), str(tmp_path / "imported"))


def _rewrite(path: Path, edit: dict[int, str | None]) -> None:
    """Replace (or with None, drop) lines by their 1-based number."""
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    kept = []
    for number, line in enumerate(lines, start=1):
        if number in edit:
            replacement = edit[number]
            if replacement is not None:
                kept.append(replacement)
        else:
            kept.append(line)
    path.write_text("".join(kept), encoding="utf-8")


@pytest.mark.parametrize(
    ("edit", "problem"),
    [
        ({6: None}, "line 6: position 6 where 5 was expected"),
        ({6: '{"position": 5, "persisted_at_ms": \n'}, "line 6"),
        ({6: "not json at all\n"}, "line 6"),
        ({6: '{"position": 5, "persisted_at_ms": 1, "record": {"type": "NOPE_V1"}}\n'}, "line 6"),
        ({13: None}, "log ends at position 11, header says 12"),
        ({1: "garbage header\n"}, "line 1"),
    ],
    ids=["gap", "truncated_line", "garbled_line", "unknown_record", "missing_tail", "bad_header"],
)
def test_a_damaged_export_is_refused_naming_the_line(
    exported: Path, edit: dict[int, str | None], problem: str
) -> None:
    _rewrite(exported, edit)
    with pytest.raises(StoreError) as caught:
        list(JsonlLog(str(exported)).entries())
    text = str(caught.value)
    assert text.startswith(f"{exported}: "), text
    for part in problem.split(": "):
        assert part in text, text


def test_a_damaged_export_is_refused_by_import(exported: Path, tmp_path: Path) -> None:
    _rewrite(exported, {8: "{}\n"})
    with pytest.raises(StoreError, match="line 8"):
        import_log(str(exported), str(tmp_path / "imported"))


def test_replay_of_the_export_prints_the_digest_of_the_store(
    store: ShardStore, exported: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store.close()
    code, from_log, err = run_cli(capsys, "replay", "--log", str(exported), "--json")
    assert code == 0, err
    code, from_data, err = run_cli(capsys, "replay", "--data", store.path, "--json")
    assert code == 0, err
    log_doc, data_doc = json.loads(from_log), json.loads(from_data)
    assert log_doc["digest"] == data_doc["digest"]
    assert log_doc == data_doc
    assert log_doc["position"] == 12
    _, result = replay(JsonlLog(str(exported)).entries(), export_config(exported))
    assert log_doc["digest"] == result.digest


def export_config(path: Path) -> k.KernelConfig:
    """The configuration an export carries in its header."""
    first = path.read_text(encoding="utf-8").splitlines()[0]
    return msgspec.convert(json.loads(first)["config"], k.KernelConfig)


def test_an_export_and_a_snapshot_of_the_previous_versions_still_read(
    store: ShardStore, exported: Path
) -> None:
    """Log export v1 and snapshot v3 came before Admissions carried a fence id: their
    records and rows lack the field, and read with its default."""
    lines = exported.read_text(encoding="utf-8").splitlines()
    header = json.loads(lines[0])
    assert header["version"] == 3
    header["version"] = 1
    old = [json.loads(line) for line in lines[1:]]
    for entry in old:
        entry["record"].pop("fence_id", None)
    exported.write_text("\n".join(json.dumps(x) for x in [header, *old]) + "\n", encoding="utf-8")
    assert list(JsonlLog(str(exported)).entries()) == list(store.iter_log())
    path, written = write_snapshot(store)
    assert written.version == 5
    blob, out = Path(path).read_bytes(), bytearray()
    first = True
    while blob:
        length = int.from_bytes(blob[:4], "big")
        body = msgspec.msgpack.decode(blob[8 : 4 + length])
        blob = blob[4 + length :]
        if first:
            body["version"], first = 3, False
        elif body[0] == "attempts":
            del body[2]["fence_id"]
        framed = frame(msgspec.msgpack.encode(body))
        out += len(framed).to_bytes(4, "big") + framed
    Path(path).write_bytes(bytes(out))
    header, memory = read_snapshot(path, store.config)
    assert header.version == 3
    attempts = list(memory.tables[k.Table.ATTEMPTS].values())
    assert attempts and all(isinstance(a, k.Attempt) and a.fence_id is None for a in attempts)
    assert k.state_digest(memory.state) == header.digest
