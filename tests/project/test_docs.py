"""The documentation: the site builds with `--strict` and without the network, its reference
pages cover the code they are rendered from, its tutorial runs as written, and the README's
first commands are the documented ones, the demo among them installing only the embedded
default."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


class NetworkUsed(AssertionError):
    pass


def _refuse(*_: Any, **__: Any) -> NoReturn:
    raise NetworkUsed("the docs build tried to reach the network")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The site, built once for this module, in-process so that any attempt to open a
    connection or resolve a name fails the build."""
    from mkdocs.commands.build import build  # noqa: PLC0415
    from mkdocs.config import load_config  # noqa: PLC0415

    out = tmp_path_factory.mktemp("site")
    patch = pytest.MonkeyPatch()
    patch.setattr(socket.socket, "connect", _refuse)
    patch.setattr(socket.socket, "connect_ex", _refuse)
    patch.setattr(socket, "getaddrinfo", _refuse)
    patch.syspath_prepend(str(ROOT / "docs"))
    try:
        config = load_config(config_file=str(ROOT / "mkdocs.yml"), site_dir=str(out))
        assert config["strict"] is True, "mkdocs.yml must build strictly"
        # Strict: any warning (a broken link, a page missing from the files) aborts.
        build(config)
    finally:
        patch.undo()
    yield out


def _text(site: Path, page: str) -> str:
    html = (site / page / "index.html").read_text()
    return re.sub(r"<[^>]+>", "", html)


def test_the_site_has_every_part_the_issue_asks_for(site: Path) -> None:
    for page in (
        "tutorial",
        "how-to/embed",
        "how-to/serve",
        "how-to/kafka",
        "how-to/pulsar",
        "how-to/operate",
        "how-to/upgrade",
        "reference/cli",
        "reference/http",
        "reference/library",
        "design",
        "design/specs",
        "design/kafka",
        "design/reliability",
        "design/benchmarks",
    ):
        assert (site / page / "index.html").is_file(), page
    assert not (site / "hooks.py").exists(), "the build hook was published as a page"


def test_no_page_loads_anything_from_outside_the_site(site: Path) -> None:
    external = re.compile(r"<(script|link|img|iframe)\b[^>]*(src|href)=\"(https?:)?//", re.I)
    for html in site.rglob("*.html"):
        found = external.search(html.read_text())
        assert found is None, f"{html.relative_to(site)} loads {found.group(0)!r}"


def test_the_cli_reference_has_every_command_and_option(site: Path) -> None:
    import argparse  # noqa: PLC0415

    from nereus.adapters.cli.main import build_parser  # noqa: PLC0415

    text = _text(site, "reference/cli")
    # The commands a user of this build has (written here, not read from the parser).
    for command in ("serve", "tail", "schedule", "cancel", "peek", "list", "replay", "export"):
        assert f"nereus {command}" in text, command
    parser = build_parser()
    (sub,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, command_parser in sub.choices.items():
        assert f"## nereus {name}" in _cli_source(), name
        for action in command_parser._actions:
            if action.help == argparse.SUPPRESS:
                continue  # internal (a supervisor's flags to its processes)
            for option in action.option_strings:
                assert option in text, f"nereus {name} {option}"


def _cli_source() -> str:
    sys.path.insert(0, str(ROOT / "docs"))
    try:
        import hooks  # noqa: PLC0415
    finally:
        sys.path.remove(str(ROOT / "docs"))
    rendered: str = hooks.render_cli()
    return rendered


def test_the_cli_reference_does_not_depend_on_the_terminal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COLUMNS", "40")
    narrow = _cli_source()
    monkeypatch.setenv("COLUMNS", "250")
    assert _cli_source() == narrow
    assert os.environ["COLUMNS"] == "250", "rendering must leave $COLUMNS as it found it"


def test_the_http_reference_has_every_route_and_error_code(site: Path) -> None:
    from nereus.adapters.http.contract import ERROR_CODES, ROUTES  # noqa: PLC0415

    text = _text(site, "reference/http")
    # Routes a client of this API relies on (written here), then every route of the contract.
    for name in ("POST /api/v1/timers", "GET /healthz", "GET /openapi.json"):
        assert name in text, name
    for route in ROUTES:
        assert f"{route.method} {route.path}" in text, route
    for code in ERROR_CODES:
        assert code in text, code


def test_the_library_reference_documents_the_calls(site: Path) -> None:
    text = _text(site, "reference/library")
    for name in (
        "open",
        "start",
        "consumer",
        "schedule",
        "reschedule",
        "cancel",
        "peek",
        "schedule_async",
        "LocalRecord",
        "KafkaNereus",
    ):
        assert re.search(rf"\b{name}\b", text), name


def test_the_design_pages_are_the_specs_as_they_are(site: Path) -> None:
    text = _text(site, "design/kafka")
    first_heading = (ROOT / "specs" / "kafka.md").read_text().splitlines()[0].lstrip("# ")
    assert first_heading in text


def _docs_examples() -> list[str]:
    text = (ROOT / "docs" / "tutorial.md").read_text()
    return re.findall(r"<!-- docs-example -->\n```python\n(.*?)```", text, re.S)


def test_the_tutorial_has_examples() -> None:
    assert len(_docs_examples()) >= 3


@pytest.mark.parametrize("index", range(len(_docs_examples())))
def test_the_tutorial_examples_run(
    index: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tempfile  # noqa: PLC0415

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    exec(compile(_docs_examples()[index], f"docs/tutorial.md example {index + 1}", "exec"), {})


# The README's first commands ------------------------------------------------------------


def test_the_readme_starts_with_the_demo_and_the_suite() -> None:
    text = README.read_text()
    first_block = re.search(r"```sh\n(.*?)```", text, re.S)
    assert first_block is not None
    commands = [line.split("#")[0].strip() for line in first_block.group(1).splitlines()]
    assert commands == ["./scripts/demo", "./scripts/test"]
    for script in ("scripts/demo", "scripts/test", ".ci/run"):
        assert os.access(ROOT / script, os.X_OK), script
    assert "exec ./scripts/test" in (ROOT / ".ci" / "run").read_text()


def test_the_demo_installs_the_embedded_default_only() -> None:
    plan = subprocess.run(
        [str(ROOT / "scripts" / "demo"), "--plan"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    (tools,) = (line for line in plan.splitlines() if line.startswith("build tools:"))
    assert tools.split()[-2:] == ["setuptools>=77", "wheel"], tools
    (install,) = (line for line in plan.splitlines() if line.startswith("install:"))
    words = install.split()
    assert words[-2:] == ["-e", "."], install  # the checkout, with no extra
    assert "[" not in install and "-r" not in words, install
    assert "NEREUS_PURE_PYTHON=1" in words, install  # no compile step for a demo
    # The embedded default pulls none of what the other modes and the tools need.
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = {re.split(r"[<>=!~\[ ;]", d, maxsplit=1)[0].lower() for d in project["dependencies"]}
    assert names == {"msgspec", "pyrsistent", "lmdb", "uvicorn", "h11", "jinja2"}
    for heavy in ("pulsar-client", "confluent-kafka", "matplotlib", "schemathesis", "mkdocs"):
        assert heavy not in names


@pytest.mark.timeout(180)
def test_the_demo_runs_end_to_end(tmp_path: Path) -> None:
    """The README's first command, in this test's own environment (nothing installed)."""
    env = dict(os.environ)
    env["NEREUS_DEMO_VENV"] = sys.prefix
    env["NEREUS_DEMO_DATA"] = str(tmp_path / "data")
    (tmp_path / "data").mkdir()
    done = subprocess.run(
        [str(ROOT / "scripts" / "demo")],
        capture_output=True,
        text=True,
        env=env,
        timeout=150,
        check=False,
    )
    out = done.stdout
    assert done.returncode == 0, done.stdout + done.stderr
    assert out.count('"deliverAt"') >= 4 and "too_late" in out, out
    assert "canceled" in out, out
    assert "verify       ok" in out, out
