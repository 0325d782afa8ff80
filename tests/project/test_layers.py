"""The import rules between the layers and between the edges, checked on every product module.

The layers live in top-level folders (kernel/, storage/, ...) that `nereus/` reaches only
through symlinks, so a tool that follows imports from `nereus/` sees none of them. This test
reads the real folders instead, names each file as it is imported (`adapters/http/api.py` is
`nereus.adapters.http.api`; a bare `import storage` is `nereus.storage`), parses it, and
judges every import of a `nereus` module, wherever it is written (top level, a function
body, `if TYPE_CHECKING:`), by the table `ALLOWED` (specs/layers.md says why):

* a layer imports only the layers below it (`kernel` none);
* an edge package (`EDGES`) imports the layers, `service` and the shared adapter modules
  (`SHARED`), never another edge; the CLI also calls the composition root;
* the composition root (`COMPOSITION`) is the one package that imports several edges;
* the public facades (`nereus/__init__.py`, `adapters/__init__.py`) import the library
  facades (`LIBRARY_FACADES`) besides.

A module in adapters/ that is neither an edge's, the composition root's nor listed in
`SHARED` fails `test_every_adapter_module_is_classified`: a new shared module is a decision
to write down, not a default.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import NamedTuple

import pytest
from hypothesis import given
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[2]
# The product's top-level folders, each linked into nereus/ as nereus.<folder>.
FOLDERS = ("kernel", "storage", "runtime", "service", "replay", "sim", "adapters")
# Below the adapters, in order; each may import only the ones `ALLOWED` lists.
LAYERS = ("kernel", "storage", "runtime", "service", "replay", "sim")
# The edge packages: each talks to the world one way (adapters/<edge>/).
EDGES = ("http", "cli", "kafka", "pulsar", "local")
# The composition root: the one package that joins edges into a running service.
COMPOSITION = "compose"
# The adapter modules every edge may use: they import no edge themselves.
SHARED = frozenset(
    {
        "clock",  # the host clock and its error bound
        "config_file",  # the configuration file's schema, the [server] (HTTP) limits
        "crypto",  # encrypted queues
        "metering",  # per-tenant metering, blocks and rate limits
        "routed",  # a destination made of several, chosen by queue
        "search",  # evidence searches of a destination
        "specdoc",  # specs rendered from the adapters' tables
        "tenancy",  # tenants, credentials, limits
        "tenant_topics",  # a tenant's queue as a destination topic
    }
)
# What the public facades may import besides the layers and the shared modules: the library
# entry points they re-export.
LIBRARY_FACADES = frozenset(
    {
        "nereus.adapters.local.embedded",
        "nereus.adapters.local.consumer",
        "nereus.adapters.local.async_consumer",
        "nereus.adapters.local.destination",
        "nereus.adapters.kafka.library",
    }
)

_BELOW_ADAPTERS = frozenset({"kernel", "storage", "runtime", "service", "replay"})
_EDGE_MAY = _BELOW_ADAPTERS | {"shared"}
# unit -> the units it may import (its own always). A unit is a layer, an edge, "shared",
# "compose", a facade ("adapters", "nereus") or "main" (nereus/__main__.py).
ALLOWED: Mapping[str, frozenset[str]] = {
    # "native" is the Rust module (`nereus._rust`, native/): only kernel.native binds it.
    "kernel": frozenset({"native"}),
    "storage": frozenset({"kernel"}),
    "runtime": frozenset({"kernel", "storage"}),
    "service": frozenset({"kernel", "storage", "runtime"}),
    "replay": frozenset({"kernel", "storage"}),
    "sim": frozenset({"kernel", "storage", "runtime", "replay"}),
    "shared": _EDGE_MAY,
    "http": _EDGE_MAY,
    # The CLI parses; what it runs is composed by the composition root. It reads the
    # package's version from the root package.
    "cli": _EDGE_MAY | {COMPOSITION, "nereus"},
    "kafka": _EDGE_MAY,
    "pulsar": _EDGE_MAY,
    "local": _EDGE_MAY,
    COMPOSITION: _EDGE_MAY | {"http", "kafka", "pulsar", "local"},
    "adapters": _EDGE_MAY,
    "nereus": _EDGE_MAY | {"adapters"},
    "main": frozenset({"cli", "runtime"}),
}
FACADES = frozenset({"adapters", "nereus"})
NATIVE = "nereus._rust"  # a compiled module: no source of ours to scan


class Crossing(NamedTuple):
    """One import the table forbids: who, what, and the line."""

    importer: str
    imported: str
    line: int


def module_name(path: Path) -> str:
    """The name a product file is imported by: `adapters/http/api.py` is
    `nereus.adapters.http.api`, a package's `__init__.py` the package."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    if parts[0] != "nereus":
        parts.insert(0, "nereus")
    return ".".join(parts)


def product_files() -> list[Path]:
    """Every product module: the layer folders themselves (not their links) and nereus/'s
    own files."""
    files = [p for folder in FOLDERS for p in sorted((ROOT / folder).rglob("*.py"))]
    files += [p for p in sorted((ROOT / "nereus").glob("*.py")) if not p.is_symlink()]
    return files


def product_sources() -> dict[str, str]:
    return {module_name(p): p.read_text() for p in product_files()}


def unit_of(module: str) -> str | None:
    """The unit of the table a `nereus` module belongs to; None for an adapters module that
    is no edge's, not the composition root's and not listed as shared."""
    parts = module.split(".")
    if parts == ["nereus"]:
        return "nereus"
    if parts[1] == "__main__":
        return "main"
    if parts[1] == "_rust":
        return "native"
    if parts[1] in LAYERS:
        return parts[1]
    if parts[1] != "adapters":
        return None
    if len(parts) == 2:
        return "adapters"
    if parts[2] in EDGES or parts[2] == COMPOSITION:
        return parts[2]
    return "shared" if parts[2] in SHARED else None


def _absolute(name: str) -> str:
    """`storage.x` (a layer folder imported bare) is `nereus.storage.x`."""
    return f"nereus.{name}" if name.split(".", maxsplit=1)[0] in FOLDERS else name


def crossings(sources: Mapping[str, str], packages: Iterable[str] = ()) -> list[Crossing]:
    """Every import in `sources` (module name -> text) that the table forbids. `packages`:
    module names that are packages (their `__init__`), for relative imports."""
    known = set(sources) | _packages_of(sources)
    package_set = set(packages) | _packages_of(sources)
    bad: list[Crossing] = []
    for module, source in sources.items():
        importer = unit_of(module)
        if importer is None:
            continue  # refused by test_every_adapter_module_is_classified
        package = module if module in package_set else module.rpartition(".")[0]
        for imported, line in _imports(source, package, known):
            crossing = Crossing(module, imported, line)
            if not _allowed(importer, imported) and crossing not in bad:
                bad.append(crossing)
    return bad


def _packages_of(sources: Mapping[str, str]) -> set[str]:
    """Every package that holds one of the modules (nereus.adapters.http for
    nereus.adapters.http.api, ...)."""
    out: set[str] = set()
    for module in sources:
        parts = module.split(".")
        out.update(".".join(parts[:i]) for i in range(1, len(parts)))
    return out


def _imports(source: str, package: str, known: set[str]) -> list[tuple[str, int]]:
    found: list[tuple[str, int]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(_absolute(alias.name), node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                origin = ".".join(base + ([node.module] if node.module else []))
            else:
                origin = _absolute(node.module or "")
            for alias in node.names:
                sub = f"{origin}.{alias.name}"
                found.append((sub if sub in known or sub == NATIVE else origin, node.lineno))
    return [(name, line) for name, line in found if name.split(".")[0] == "nereus"]


def _allowed(importer: str, imported: str) -> bool:
    target = unit_of(imported)
    if target is None:
        return False
    if target == importer:
        return True
    if importer in FACADES and imported in LIBRARY_FACADES:
        return True
    return target in ALLOWED[importer]


# The product as it is ------------------------------------------------------------------------


def _product_crossings() -> list[Crossing]:
    sources = product_sources()
    packages = {module_name(p) for p in product_files() if p.name == "__init__.py"}
    return crossings(sources, packages)


def test_no_module_imports_across_the_rules() -> None:
    bad = _product_crossings()
    assert bad == [], "\n".join(
        f"{c.importer} (line {c.line}) imports {c.imported}: not allowed by specs/layers.md"
        for c in bad
    )


def test_every_adapter_module_is_classified() -> None:
    unclassified = sorted(m for m in product_sources() if unit_of(m) is None)
    assert unclassified == [], f"list these in SHARED, or move them into a package: {unclassified}"


def test_the_scan_reads_every_layer_and_edge() -> None:
    """A scan that read nothing would pass: every folder, edge and the composition root has
    modules in it."""
    units = {unit_of(m) for m in product_sources()}
    assert set(LAYERS) | set(EDGES) | {COMPOSITION, "shared", "adapters", "nereus"} <= units


def test_only_the_composition_root_imports_several_edges() -> None:
    """Which units import more than one edge package: the composition root, and the public
    facades through the library entry points; nothing else."""
    reached: dict[str, set[str]] = {}
    sources = product_sources()
    known = set(sources) | _packages_of(sources)
    for module, source in sources.items():
        unit = unit_of(module)
        package = module if module in _packages_of(sources) else module.rpartition(".")[0]
        for imported, _ in _imports(source, package, known):
            target = unit_of(imported)
            if target in EDGES:
                reached.setdefault(str(unit), set()).add(str(target))
    several = {unit for unit, edges in reached.items() if len(edges - {unit}) > 1}
    assert several <= {COMPOSITION, "adapters", "nereus"}, several
    assert COMPOSITION in several


# The checker itself catches a bad import ----------------------------------------------------


def _judge(module: str, source: str) -> list[tuple[str, str]]:
    """Crossings of one made-up module beside two real-looking packages."""
    sources = {
        "nereus.adapters.kafka.service": "",
        "nereus.adapters.local.destination": "",
        "nereus.adapters.http.api": "",
        "nereus.storage.store": "",
        "nereus.adapters.tenancy": "",
        module: source,
    }
    return [(c.importer, c.imported) for c in crossings(sources) if c.importer == module]


@pytest.mark.parametrize(
    ("module", "source", "expected"),
    [
        # An edge importing another edge, however it is spelt.
        (
            "nereus.adapters.http.api2",
            "from nereus.adapters.kafka.service import KafkaService\n",
            [("nereus.adapters.http.api2", "nereus.adapters.kafka.service")],
        ),
        (
            "nereus.adapters.http.api2",
            "def f():\n    import nereus.adapters.local.destination as d\n",
            [("nereus.adapters.http.api2", "nereus.adapters.local.destination")],
        ),
        (
            "nereus.adapters.http.api2",
            "from ..kafka import service\n",
            [("nereus.adapters.http.api2", "nereus.adapters.kafka.service")],
        ),
        (
            "nereus.adapters.pulsar.build",
            "from nereus.adapters import local\n",
            [("nereus.adapters.pulsar.build", "nereus.adapters.local")],
        ),
        # A shared module importing an edge (the tenancy importing the HTTP contract).
        (
            "nereus.adapters.tenancy",
            "if TYPE_CHECKING:\n    from nereus.adapters.http.api import TimerApi\n",
            [("nereus.adapters.tenancy", "nereus.adapters.http.api")],
        ),
        # Upward imports of the layers.
        (
            "nereus.replay.cli2",
            "from nereus.adapters.kafka.service import x\n",
            [("nereus.replay.cli2", "nereus.adapters.kafka.service")],
        ),
        (
            "nereus.kernel.rules2",
            "import storage.store\n",
            [("nereus.kernel.rules2", "nereus.storage.store")],
        ),
        # Allowed: an edge using storage and a shared module; its own package; the root.
        (
            "nereus.adapters.http.api2",
            "from nereus.storage.store import ShardStore\nfrom nereus.adapters.tenancy import T\n"
            "from nereus.adapters.http.api import TimerApi\n",
            [],
        ),
        (
            "nereus.adapters.compose.x",
            "from nereus.adapters.kafka.service import S\n"
            "from nereus.adapters.local.destination import D\n",
            [],
        ),
    ],
)
def test_the_checker_refuses_what_the_rules_forbid(
    module: str, source: str, expected: list[tuple[str, str]]
) -> None:
    assert _judge(module, source) == expected


def test_an_unlisted_adapter_module_is_unclassified() -> None:
    assert unit_of("nereus.adapters.newthing") is None
    assert unit_of("nereus.adapters.tenancy") == "shared"
    assert unit_of("nereus.adapters.compose.serve") == COMPOSITION


_SPELLINGS = (
    "from nereus.adapters.{edge}.service import x\n",
    "import nereus.adapters.{edge}.service\n",
    "import nereus.adapters.{edge}.service as alias\n",
    "from nereus.adapters.{edge} import service\n",
    "from ..{edge}.service import x\n",
    "from ..{edge} import service\n",
    "from ... import adapters\nfrom nereus.adapters.{edge}.service import x\n",
    "def f():\n    from nereus.adapters.{edge}.service import x\n",
    "if TYPE_CHECKING:\n    import nereus.adapters.{edge}.service\n",
    "try:\n    from nereus.adapters.{edge}.service import x\nexcept ImportError:\n    pass\n",
)


@given(
    importer=st.sampled_from(EDGES),
    target=st.sampled_from(EDGES),
    spelling=st.sampled_from(_SPELLINGS),
)
def test_no_spelling_of_an_import_between_two_edges_gets_past(
    importer: str, target: str, spelling: str
) -> None:
    """An edge never imports another edge: whichever way the import is written, the checker
    sees it; the same import within one edge is fine."""
    module = f"nereus.adapters.{importer}.mod"
    sources = {module: spelling.format(edge=target), f"nereus.adapters.{target}.service": ""}
    found = {
        c.imported for c in crossings(sources) if c.importer == module and "service" in c.imported
    }
    if importer == target:
        assert found == set()
    else:
        assert found == {f"nereus.adapters.{target}.service"}
