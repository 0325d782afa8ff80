"""The reducer's overlay must behave exactly like an immutable map, branches included."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from nereus.kernel.model import Table, TenantUsage
from nereus.kernel.overlay import Overlay
from nereus.kernel.state import DELETED, MappingBase, OverlayValue, State

# Each step: pick an existing version (by index) and write key=value to it, producing a new
# version. Picking an old version is a branch.
steps = st.lists(
    st.tuples(st.integers(0, 1000), st.integers(0, 7), st.integers(0, 99)), max_size=60
)


@settings(max_examples=300, deadline=None)
@given(steps)
def test_overlay_matches_a_dict_model_across_branches(ops: list[tuple[int, int, int]]) -> None:
    versions: list[Overlay[int, int]] = [Overlay()]
    models: list[dict[int, int]] = [{}]
    for pick, key, value in ops:
        i = pick % len(versions)
        versions.append(versions[i].set(key, value))
        models.append({**models[i], key: value})
        # Every version, old or new, still reads exactly its own content.
        for overlay, model in zip(versions, models, strict=True):
            assert dict(overlay.items()) == model
            assert len(overlay) == len(model)
            for k in range(8):
                assert overlay.get(k) == model.get(k)


def test_an_old_version_is_unchanged_by_later_writes() -> None:
    a = Overlay[str, int]()
    b = a.set("x", 1)
    c = b.set("x", 2)
    d = b.set("y", 3)  # a branch from b
    assert (a.get("x"), b.get("x"), c.get("x"), d.get("x")) == (None, 1, 2, 1)
    assert d.get("y") == 3 and c.get("y") is None


KEYS = st.binary(min_size=1, max_size=2)


@given(
    base=st.dictionaries(KEYS, st.integers(0, 9), max_size=12),
    changes=st.dictionaries(KEYS, st.integers(-1, 9), max_size=12),
)
def test_state_items_merge_the_overlay_into_the_base_in_key_order(
    base: dict[bytes, int], changes: dict[bytes, int]
) -> None:
    """What `State.items` yields is the base with the batch's changes applied (-1: deleted),
    in key order, although it streams the base rather than holding it."""
    rows = {key: TenantUsage(n, n) for key, n in base.items()}
    state = State.initial().rebase(MappingBase({Table.USAGE: rows}))
    writes: dict[tuple[Table, bytes], OverlayValue] = {
        (Table.USAGE, key): DELETED if n < 0 else TenantUsage(n, n) for key, n in changes.items()
    }
    state = state.with_changes(state.meta, state.overlay.set_many(writes))
    expected = dict(rows)
    for key, n in changes.items():
        if n < 0:
            expected.pop(key, None)
        else:
            expected[key] = TenantUsage(n, n)
    assert list(state.items(Table.USAGE)) == sorted(expected.items())
