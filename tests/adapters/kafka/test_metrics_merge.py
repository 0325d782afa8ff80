"""The merge of several processes' /metrics into one answer (`adapters.kafka.exposition`):
no broker, no process; the texts are what `runtime.metrics` writes."""

from __future__ import annotations

import pytest

from nereus.adapters.kafka.exposition import merge, parse, parse_labels, render
from nereus.runtime.metrics import Metrics


def _merged(*texts: tuple[str, str]) -> str:
    return render(merge([(name, parse(text)) for name, text in texts]))


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if not line.startswith("# HELP")]


def test_the_registrys_own_text_comes_back_unchanged() -> None:
    m = Metrics()
    m.describe("nereus_entries_total", "counter", "Entries.")
    m.describe("lag_seconds", "histogram", "Lags.")
    m.inc("nereus_entries_total", 3, {"shard": "0", "code": "scheduled"})
    m.observe_many("lag_seconds", [0.002, 0.5, 99.0], {"shard": "1"})
    m.set("nereus_applied_position", 7, {"shard": "0"})
    m.inc("nereus_shard_log_undecodable_total")
    text = m.render()
    assert render(parse(text)) == text


def test_counters_are_summed_for_the_same_labels_and_help_and_type_are_kept_once() -> None:
    a = "\n".join(
        [
            "# HELP req_total Requests.",
            "# TYPE req_total counter",
            'req_total{route="GET /x",status="200"} 2',
            'req_total{route="GET /y",status="200"} 1',
        ]
    )
    b = "\n".join(
        [
            "# HELP req_total Requests.",
            "# TYPE req_total counter",
            'req_total{route="GET /x",status="200"} 5',
            'req_total{route="GET /x",status="503"} 1.5',
        ]
    )
    out = _merged(("process-0", a), ("process-1", b))
    assert out.splitlines() == [
        "# HELP req_total Requests.",
        "# TYPE req_total counter",
        'req_total{route="GET /x",status="200"} 7',
        'req_total{route="GET /x",status="503"} 1.5',
        'req_total{route="GET /y",status="200"} 1',
    ]


def test_histograms_are_summed_bucket_by_bucket() -> None:
    one, two = Metrics(), Metrics()
    for m in (one, two):
        m.describe("lag_seconds", "histogram", "Lags.")
    # Binary fractions: the sums come out the same whichever order they are added in.
    one.observe_many("lag_seconds", [0.0078125, 0.25], buckets=(0.01, 1.0))
    two.observe_many("lag_seconds", [0.5, 0.75, 32.0], buckets=(0.01, 1.0))
    both = Metrics()
    both.describe("lag_seconds", "histogram", "Lags.")
    both.observe_many("lag_seconds", [0.0078125, 0.25, 0.5, 0.75, 32.0], buckets=(0.01, 1.0))
    out = _merged(("process-0", one.render()), ("process-1", two.render()))
    assert out == both.render()
    assert 'lag_seconds_bucket{le="0.01"} 1' in out.splitlines()
    assert 'lag_seconds_bucket{le="1"} 4' in out.splitlines()
    assert 'lag_seconds_bucket{le="+Inf"} 5' in out.splitlines()


def test_shard_gauges_are_unioned_and_a_shard_answered_twice_keeps_the_first() -> None:
    a = '# TYPE pos gauge\npos{shard="0"} 10\npos{shard="1"} 11\n'
    b = '# TYPE pos gauge\npos{shard="2"} 12\npos{shard="1"} 99\n'
    out = _merged(("process-0", a), ("process-1", b))
    assert _lines(out) == [
        "# TYPE pos gauge",
        'pos{shard="0"} 10',
        'pos{shard="1"} 11',
        'pos{shard="2"} 12',
    ]


def test_gauges_of_a_process_get_its_name_and_are_not_added_up() -> None:
    info = '# TYPE build_info gauge\nbuild_info{version="1"} 1\n'
    a = "# TYPE rss_bytes gauge\nrss_bytes 100\n" + info
    b = "# TYPE rss_bytes gauge\nrss_bytes 300\n" + info
    out = _merged(("process-0", a), ("process-1", b))
    assert _lines(out) == [
        "# TYPE build_info gauge",
        'build_info{process="process-0",version="1"} 1',
        'build_info{process="process-1",version="1"} 1',
        "# TYPE rss_bytes gauge",
        'rss_bytes{process="process-0"} 100',
        'rss_bytes{process="process-1"} 300',
    ]


def test_untyped_families_are_summed_only_when_named_as_counters() -> None:
    a = '# TYPE txns_total untyped\ntxns_total{result="ok"} 2\n# TYPE odd untyped\nodd 4\n'
    b = '# TYPE txns_total untyped\ntxns_total{result="ok"} 3\n# TYPE odd untyped\nodd 5\n'
    out = _merged(("process-0", a), ("process-1", b))
    assert 'txns_total{result="ok"} 5' in out.splitlines()
    assert {'odd{process="process-0"} 4', 'odd{process="process-1"} 5'} <= set(out.splitlines())


def test_label_values_with_escapes_are_one_label_set_and_written_back_escaped() -> None:
    assert parse_labels(r'a="say \"hi\", \\ then\nbye",b="}"') == (
        ("a", 'say "hi", \\ then\nbye'),
        ("b", "}"),
    )
    a = '# TYPE c_total counter\nc_total{q="x\\"y",z="1"} 1\n'
    b = '# TYPE c_total counter\nc_total{z="1",q="x\\"y"} 2\n'  # other order, same set
    out = _merged(("process-0", a), ("process-1", b))
    assert 'c_total{q="x\\"y",z="1"} 3' in out.splitlines()


def test_a_family_typed_differently_by_another_process_is_left_out_of_its_part() -> None:
    a = "# TYPE x counter\nx 1\n"
    b = "# TYPE x gauge\nx 7\n"
    assert _lines(_merged(("process-0", a), ("process-1", b))) == ["# TYPE x counter", "x 1"]


@pytest.mark.parametrize(
    "text",
    [
        "# TYPE x counter\nx 1 1700000000\n",  # a timestamp: the registry writes none
        "# TYPE x counter\nx 1\nx 2\n",  # the same sample twice
        "# TYPE x counter\nx 1\n# TYPE x counter\n",  # a family twice
        '# TYPE x counter\nx{a="\\t"} 1\n',  # an escape the format does not have
        '# TYPE x counter\nx{a="1"b="2"} 1\n',  # labels without their comma
        '# TYPE x counter\nx{a="1",a="2"} 1\n',
        "# TYPE x counter\nx one\n",
        "# TYPE x meter\n",
        "x{a=1} 1\n",
    ],
)
def test_anything_the_registry_would_not_write_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse(text)


def test_special_values_survive() -> None:
    text = '# TYPE g gauge\ng{shard="0"} +Inf\ng{shard="1"} -Inf\ng{shard="2"} NaN\n'
    assert render(parse(text)) == text
