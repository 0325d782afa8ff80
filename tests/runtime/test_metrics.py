"""The Prometheus histogram: buckets are cumulative and `observe_many` counts like `observe`
called once per value (the runtime records a commit's fire lags in one call)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from nereus.runtime.metrics import LAG_BUCKETS_S, Metrics


def _buckets(text: str, name: str) -> list[tuple[str, float]]:
    rows = []
    for line in text.splitlines():
        if line.startswith(f"{name}_bucket"):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            rows.append((le, float(line.rsplit(" ", 1)[1])))
    return rows


def test_buckets_are_cumulative_with_inf_equal_to_the_count() -> None:
    m = Metrics()
    m.observe_many("lag_seconds", [0.0005, 0.001, 0.003, 0.2, 100.0])
    rows = dict(_buckets(m.render(), "lag_seconds"))
    assert rows["0.001"] == 2  # a value on a bound counts in that bucket
    assert rows["0.005"] == 3
    assert rows["0.25"] == 4
    assert rows["60"] == 4  # 100 s is above every bound
    assert rows["+Inf"] == 5
    assert "lag_seconds_count 5" in m.render()


@given(st.lists(st.floats(min_value=0, max_value=120, allow_nan=False), max_size=40))
def test_observe_many_renders_as_observe_one_at_a_time(values: list[float]) -> None:
    one, many = Metrics(), Metrics()
    for value in values:
        one.observe("h_seconds", value)
    many.observe_many("h_seconds", values)
    assert one.render() == many.render()
    counts = [count for _le, count in _buckets(many.render(), "h_seconds")]
    assert counts == sorted(counts)  # never decreasing: cumulative
    assert len(counts) == len(LAG_BUCKETS_S) + 1 or not values
