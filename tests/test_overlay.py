"""The reducer's overlay must behave exactly like an immutable map, branches included."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from nereus.kernel.overlay import Overlay

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
