"""One `/metrics` answer for the processes of one machine (`nereus serve --processes N`).

Theory of operation: each process renders its own registry (`runtime.metrics`); the process
that takes a scrape parses its own text and each sibling's (`parse`), merges them family by
family (`merge`) and renders the result (`render`). The merge rule is decided by a family's
type, then by its labels, so a family added later needs no entry here:

* **Summed**: counters, histograms (every `_bucket`, `_sum` and `_count` alike) and untyped
  families named `*_total` (counters by Prometheus's naming rule; some are not described).
  Series with the same label set are added: the machine's requests, fired timers, CPU
  seconds. A process that restarts starts its counters at 0, so the sum drops once, which
  `rate()` reads as a counter reset.
* **Per shard**: any other series with a `shard` or `partition` label is taken as it is: a
  shard is owned by one process, so the series are disjoint. While a shard moves, two
  processes may both answer for it; the first answer (the scraped process's own) is kept.
* **Per process**: any other series (a gauge with no shard: resident memory, open
  descriptors, start time, build info) gets `process="<name>"`; adding them up would mix a
  start time with another, and `sum()` in a query still gives a total where one is meant.

The parser reads exactly what the registry writes, strictly: `# HELP`, `# TYPE`, samples
without timestamps, label values escaped as `\\\\`, `\\"` and `\\n`. Anything else raises
ValueError, and the caller leaves that process's text out rather than guess.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

Labels = tuple[tuple[str, str], ...]
SampleKey = tuple[str, Labels]  # (sample name, label set)

PROCESS_LABEL = "process"
SHARD_LABELS = frozenset({"shard", "partition"})
SUMMED_KINDS = frozenset({"counter", "histogram"})
KINDS = frozenset({"counter", "gauge", "histogram", "summary", "untyped"})
_SUFFIXES = {"histogram": ("_bucket", "_sum", "_count"), "summary": ("", "_sum", "_count")}
# Written after a series' other labels, as the registry does.
_LAST_LABELS = frozenset({"le", "quantile"})

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_SAMPLE = re.compile(rf"({_NAME})(?:\{{(.*)\}})? (\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"(?:,|$)')
_ESCAPE = re.compile(r"\\(.)")
_UNESCAPED = {"\\": "\\", '"': '"', "n": "\n"}


@dataclass
class Family:
    """One metric family: its type, its help text (as written), and its samples in the order
    first seen."""

    name: str
    kind: str
    help: str | None = None
    samples: dict[SampleKey, float] = field(default_factory=dict)

    def owns(self, sample: str) -> bool:
        suffixes = _SUFFIXES.get(self.kind, ("",))
        return any(sample == self.name + s for s in suffixes)


# Parsing --------------------------------------------------------------------------------


def parse(text: str) -> dict[str, Family]:
    """The families of one exposition, by name. Raises ValueError on anything the registry
    would not write: a family given twice, a sample twice, a timestamp, a bad escape."""
    families: dict[str, Family] = {}
    helps: dict[str, str] = {}
    current: Family | None = None
    for number, line in enumerate(text.split("\n"), 1):
        try:
            current = _parse_line(line, families, helps, current)
        except ValueError as exc:
            raise ValueError(f"line {number}: {exc}: {line[:200]!r}") from None
    for name, help_text in helps.items():
        if name in families:
            families[name].help = help_text
    return families


def _parse_line(
    line: str, families: dict[str, Family], helps: dict[str, str], current: Family | None
) -> Family | None:
    """Reads one line into `families`; returns the family later samples belong to."""
    if not line:
        return current
    if line.startswith("# HELP "):
        name, _, text = line[7:].partition(" ")
        helps[name] = text
        return current
    if line.startswith("# TYPE "):
        name, _, kind = line[7:].partition(" ")
        if kind not in KINDS:
            raise ValueError(f"unknown type {kind!r}")
        return _new_family(families, name, kind)
    if line.startswith("#"):
        return current  # a comment
    found = _SAMPLE.fullmatch(line)
    if found is None:
        raise ValueError("not a sample")
    sample, labels, value = found.group(1), parse_labels(found.group(2) or ""), found.group(3)
    if current is None or not current.owns(sample):
        # A sample with no TYPE line before it is a family of its own, untyped.
        current = _new_family(families, sample, "untyped")
    key = (sample, labels)
    if key in current.samples:
        raise ValueError("sample given twice")
    current.samples[key] = float(value)
    return current


def _new_family(families: dict[str, Family], name: str, kind: str) -> Family:
    if name in families:
        raise ValueError(f"family {name} given twice")
    family = families[name] = Family(name, kind)
    return family


def parse_labels(text: str) -> Labels:
    """`a="1",b="x\\"y"` as a label set in the registry's order (names sorted, `le` and
    `quantile` last), values unescaped."""
    pairs: dict[str, str] = {}
    pos = 0
    while pos < len(text):
        found = _LABEL.match(text, pos)
        if found is None:
            raise ValueError(f"bad label at {pos}")
        name, raw = found.group(1), found.group(2)
        if name in pairs:
            raise ValueError(f"label {name} given twice")
        pairs[name] = _ESCAPE.sub(_unescape, raw)
        pos = found.end()
    return _ordered(pairs.items())


def _unescape(found: re.Match[str]) -> str:
    char = found.group(1)
    if char not in _UNESCAPED:
        raise ValueError(f"bad escape \\{char}")
    return _UNESCAPED[char]


def _ordered(pairs: Iterable[tuple[str, str]]) -> Labels:
    return tuple(sorted(pairs, key=lambda kv: (kv[0] in _LAST_LABELS, kv[0])))


# Merging --------------------------------------------------------------------------------


def merge(parts: Sequence[tuple[str, dict[str, Family]]]) -> dict[str, Family]:
    """The families of every process (name, parsed exposition), merged by the rules above.
    HELP and TYPE are the first process's; a family another process types differently (two
    builds, mid-upgrade) is left out of that process's part rather than mixed."""
    merged: dict[str, Family] = {}
    for process, families in parts:
        for family in families.values():
            into = merged.setdefault(family.name, Family(family.name, family.kind, family.help))
            if into.kind == family.kind:
                _merge_family(into, family, process)
    return merged


def _merge_family(into: Family, family: Family, process: str) -> None:
    summed = family.kind in SUMMED_KINDS or (
        family.kind == "untyped" and family.name.endswith("_total")
    )
    for (sample, labels), value in family.samples.items():
        if summed:
            key = (sample, labels)
            into.samples[key] = into.samples.get(key, 0.0) + value
        elif any(name in SHARD_LABELS for name, _ in labels):
            into.samples.setdefault((sample, labels), value)
        else:
            into.samples[(sample, with_process(labels, process))] = value


def with_process(labels: Labels, process: str) -> Labels:
    """The label set with `process` set (the merge owns that label: any earlier value is
    replaced)."""
    kept = [(k, v) for k, v in labels if k != PROCESS_LABEL]
    return _ordered([*kept, (PROCESS_LABEL, process)])


def gauge(name: str, text: str, value: float) -> Family:
    """A gauge of one unlabelled sample: what the merging process says about the merge."""
    return Family(name, "gauge", text, {(name, ()): value})


# Rendering ------------------------------------------------------------------------------


def render(families: dict[str, Family]) -> str:
    """The text exposition: families in name order, each series' samples together (a
    histogram's buckets in their order, then its count and sum, as first seen)."""
    lines: list[str] = []
    for name in sorted(families):
        family = families[name]
        if family.help is not None:
            lines.append(f"# HELP {name} {family.help}")
        lines.append(f"# TYPE {name} {family.kind}")
        for (sample, labels), value in sorted(family.samples.items(), key=_series):
            lines.append(f"{sample}{format_labels(labels)} {format_value(value)}")
    return "\n".join(lines) + "\n"


def _series(item: tuple[SampleKey, float]) -> Labels:
    """The label set a sample's series is known by (a bucket's `le` aside). Sorting is
    stable, so samples of one series keep the order they were first seen in."""
    return tuple(kv for kv in item[0][1] if kv[0] not in _LAST_LABELS)


def format_labels(labels: Labels) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in labels) + "}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def format_value(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == int(value):
        return str(int(value))
    return repr(value)
