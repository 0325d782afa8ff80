"""Golden logs: every committed shard log of an earlier build still decodes, replays and
verifies to what it was recorded to give.

Each set under `tests/support/golden/` (made once by `python -m tests.support.golden.make`, see the
README
there) holds a real shard log as a JSON Lines export and as the LMDB store that wrote it,
and `expected.json`: the state digest, the open obligations, the counters, every entry's
outcome code and every message's status. A change to the record format, the codecs, the
store schema or the kernel that makes any of these differ for an old log fails here: old
logs must keep their meaning. And a build whose records include a version no golden set
holds fails too, until a set made with that version is added.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import msgspec
import pytest

from nereus.kernel import native
from nereus.kernel.digest import state_digest
from nereus.kernel.effects import EntryOutcome
from nereus.kernel.model import Message, Table
from nereus.replay.fold import obligations
from nereus.replay.verify import first_difference
from nereus.storage import compiled_rows
from nereus.storage.jsonl import JsonlLog
from nereus.storage.memory import MemoryStore
from nereus.storage.schema import StoreOptions
from nereus.storage.store import ShardStore
from tests.support.golden.make import RESULT_KINDS, kinds_in, record_tags

GOLDEN = Path(__file__).resolve().parents[1] / "support" / "golden"
SETS = sorted(p.parent.name for p in GOLDEN.glob("*/expected.json"))


def _expected(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((GOLDEN / name / "expected.json").read_text())
    return loaded


def _messages(state: Any) -> dict[str, list[Any]]:
    return {
        m.message_id: [str(m.status), m.generation, m.version]
        for _key, m in state.items(Table.MESSAGES)
        if isinstance(m, Message)
    }


def test_there_is_a_golden_set() -> None:
    assert SETS, "no golden sets under tests/support/golden/"


@pytest.mark.parametrize("name", SETS)
def test_the_export_decodes_and_replays_to_its_record(name: str) -> None:
    expected = _expected(name)
    log = JsonlLog(str(GOLDEN / name / "log.jsonl"))
    log.check_config(log.header.config)
    assert log.header.config_fingerprint == expected["config_fingerprint"]
    entries = list(log.entries())
    assert [e.position for e in entries] == list(range(1, expected["last_position"] + 1))
    codes: list[str] = []

    def keep(_entry: Any, effects: tuple[Any, ...]) -> None:
        # One outcome per record, or per item of a batch record.
        codes.extend(str(e.code) for e in effects if isinstance(e, EntryOutcome))

    memory = MemoryStore(log.header.config)
    memory.feed(entries, keep)
    state = memory.state
    assert codes == expected["codes"], "an old entry now gets another verdict"
    assert _messages(state) == expected["messages"]
    assert [msgspec.to_builtins(o) for o in obligations(state)] == expected["obligations"]
    assert msgspec.to_builtins(state.meta.counters) == expected["counters"]
    assert state_digest(state) == expected["digest"]
    found = kinds_in(entries)
    assert {t: found[t] for t in expected["made_with"]["record_tags"]} == expected["made_with"][
        "record_tags"
    ]


@pytest.mark.parametrize("compiled", [False, True], ids=["reducer", "compiled folds"])
@pytest.mark.parametrize("name", SETS)
def test_the_log_folds_into_a_new_store_to_its_record(
    name: str, compiled: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the store's own fold, with the compiled folds of the fire's records
    (`storage.admitted`, `storage.published`) on and off: the same verdicts, messages and
    digest as recorded. With them on, they must have taken some of the log's records."""
    if compiled and native.fold_admitted is None:
        pytest.skip("the source build has no compiled folds")
    expected = _expected(name)
    log = JsonlLog(str(GOLDEN / name / "log.jsonl"))
    taken: list[str] = []
    for fold in ("fold_admitted", "fold_published"):
        inner = getattr(native, fold)
        if inner is None:
            continue

        def spy(*args: Any, _inner: Any = inner, _name: str = fold) -> Any:
            answer = _inner(*args)
            if answer is not None:
                taken.append(_name)
            return answer

        monkeypatch.setattr(native, fold, spy)
    before = compiled_rows.set_enabled(compiled)
    try:
        options = StoreOptions(max_batch_entries=64)
        path = str(tmp_path / "store")
        with ShardStore.open(path, config=log.header.config, options=options) as store:
            applied = store.apply(list(log.entries()))
            with store.state_view() as live:
                digest = state_digest(live)
                messages = _messages(live)
    finally:
        compiled_rows.set_enabled(before)
    codes = [str(e.code) for _, fx in applied for e in fx if isinstance(e, EntryOutcome)]
    assert codes == expected["codes"]
    assert messages == expected["messages"]
    assert digest == expected["digest"]
    assert bool(taken) == compiled


@pytest.mark.parametrize("name", SETS)
def test_the_store_opens_and_verifies_against_its_log(name: str, tmp_path: Path) -> None:
    """The LMDB store as the older build left it: opened (and migrated, if its schema is
    older) by this build, its materialized state equals the replay of its own log, and both
    equal the recorded digest; its log is the export's, entry for entry."""
    expected = _expected(name)
    copy = tmp_path / "store"
    shutil.copytree(GOLDEN / name / "store", copy)
    exported = list(JsonlLog(str(GOLDEN / name / "log.jsonl")).entries())
    with ShardStore.open(str(copy), create=False) as store:
        assert store.header.shard_id == expected["shard_id"]
        entries = list(store.iter_log())
        assert entries == exported
        memory = MemoryStore(store.config)
        memory.feed(entries, lambda _e, _fx: None)
        with store.state_view() as live:
            assert first_difference(live, memory.state) is None
            assert state_digest(live) == expected["digest"]
            assert _messages(live) == expected["messages"]
            assert [msgspec.to_builtins(o) for o in obligations(live)] == expected["obligations"]


def test_every_record_version_of_this_build_is_in_a_golden_set() -> None:
    """A new record version (or outcome kind) needs a golden set made with it, so that
    every later build is held to logs that contain it: `python -m tests.support.golden.make NAME`
    (tests/support/golden/README.md)."""
    covered: set[str] = set()
    for name in SETS:
        made = _expected(name)["made_with"]
        covered |= {tag for tag, n in made["record_tags"].items() if n}
        covered |= {kind for kind, n in made["outcome_kinds"].items() if n}
    missing = sorted((set(record_tags()) | set(RESULT_KINDS)) - covered)
    assert missing == [], f"no golden set holds {missing}: add one (tests/support/golden/README.md)"
