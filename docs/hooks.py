"""MkDocs hook: the pages rendered from the code and the pages taken from the repository.

Theory of operation: MkDocs calls `on_files` once per build with the pages it found under
`docs/`; this hook adds the rest as generated files before the navigation is built, so
`--strict` checks them like any page:

* `reference/cli.md` from the argparse parsers of `nereus` (`adapters.cli.main.build_parser`),
  each command's own `--help` text at a fixed width, so the page is what the program says;
* `reference/http.md` from the OpenAPI document the service serves at `/openapi.json`
  (`adapters.http.openapi.build_document`, the default configuration): routes, grants,
  parameters, request bodies and every status with its error codes;
* `design/*.md` from `specs/*.md`, `RELIABILITY.md` and `bench/README.md` as they are in the
  checkout (one source of truth: the specs are not copied into `docs/`), with the benchmark
  plots beside them.

The library reference (`reference/library.md`) is written by mkdocstrings from docstrings.
Nothing here reads the network; `render_cli` and `render_http` are plain functions so a test
can check them without a build.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parent.parent

# Repository documents shown under design/: source path -> page.
TAKEN = {
    "specs/README.md": "design/specs.md",
    "specs/codes.md": "design/codes.md",
    "specs/console.md": "design/console.md",
    "specs/compiled.md": "design/compiled.md",
    "specs/destinations.md": "design/destinations.md",
    "specs/http.md": "design/http.md",
    "specs/invariants.md": "design/invariants.md",
    "specs/kafka.md": "design/kafka.md",
    "specs/layers.md": "design/layers.md",
    "specs/library.md": "design/library.md",
    "specs/lifecycle.md": "design/lifecycle.md",
    "specs/pulsar.md": "design/pulsar.md",
    "specs/records.md": "design/records.md",
    "specs/time.md": "design/time.md",
    "RELIABILITY.md": "design/reliability.md",
    "bench/README.md": "design/benchmarks.md",
}
PLOTS = ("fire_lag.png", "apply_rate.png")
HELP_COLUMNS = "96"


def on_files(files: Files, config: MkDocsConfig, **_: Any) -> Files:
    files.append(File.generated(config, "reference/cli.md", content=render_cli()))
    files.append(File.generated(config, "reference/http.md", content=render_http()))
    for source, page in TAKEN.items():
        files.append(File.generated(config, page, abs_src_path=str(ROOT / source)))
    for plot in PLOTS:
        path = ROOT / "bench" / "results" / plot
        files.append(File.generated(config, f"design/results/{plot}", abs_src_path=str(path)))
    return files


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def render_cli() -> str:
    """The command-line reference: `nereus --help`, then each command's `--help`."""
    from nereus.adapters.cli.main import build_parser  # noqa: PLC0415

    # argparse wraps its help to $COLUMNS: fixed here, so the page does not depend on the
    # terminal the build ran in.
    previous = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = HELP_COLUMNS
    try:
        parser = build_parser()
        out = [
            "# Command line",
            "",
            "Rendered from the program's own argument parsers when the site is built, so each",
            "section is exactly what `nereus COMMAND --help` prints. A usage error (an unknown",
            "option, a missing argument) exits with status 2; every exit status is listed at the",
            "end of `nereus --help`, below.",
            "",
            "```text",
            parser.format_help().rstrip(),
            "```",
        ]
        for name, command in _subcommands(parser).items():
            out += ["", f"## nereus {name}", "", "```text", command.format_help().rstrip(), "```"]
    finally:
        if previous is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = previous
    return "\n".join(out) + "\n"


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _schema_name(schema: dict[str, Any]) -> str:
    ref = schema.get("$ref")
    if isinstance(ref, str):
        return ref.rsplit("/", 1)[-1]
    kind = schema.get("type", "object")
    return "/".join(kind) if isinstance(kind, list) else str(kind)


def _operation(path: str, method: str, op: dict[str, Any]) -> list[str]:
    out = [f"### `{method.upper()} {path}`", "", op.get("summary", "")]
    security = "none (public)" if op.get("security") == [] else op.get("description", "")
    out += ["", f"Credential: {security}", ""]
    params = op.get("parameters", [])
    if params:
        out += ["| parameter | in | required | schema |", "|---|---|---|---|"]
        for p in params:
            schema = _schema_name(p.get("schema", {}))
            out.append(f"| `{p['name']}` | {p['in']} | {p.get('required', False)} | {schema} |")
        out.append("")
    body = op.get("requestBody")
    if body is not None:
        schema = body["content"]["application/json"]["schema"]
        out += [f"Request body: `{_schema_name(schema)}` (JSON).", ""]
    out += ["| status | body | answer |", "|---|---|---|"]
    for status, response in op["responses"].items():
        schema = response.get("content", {}).get("application/json", {}).get("schema")
        body_name = f"`{_schema_name(schema)}`" if schema else ""
        # One error code per line: the document joins them with "; ".
        text = _cell(response.get("description", "")).replace("; `", "<br>`")
        out.append(f"| {status} | {body_name} | {text} |")
    return [*out, ""]


def _schemas(schemas: dict[str, Any]) -> list[str]:
    out = ["## Schemas", "", "Each schema as the document states it (JSON Schema).", ""]
    for name, schema in schemas.items():
        out += [f"### {name}", "", "```json", json.dumps(schema, indent=2), "```", ""]
    return out


def render_http() -> str:
    """The HTTP reference, from the OpenAPI document of the default configuration."""
    from nereus.adapters.http.openapi import build_document  # noqa: PLC0415
    from nereus.adapters.tenancy import Tenancy  # noqa: PLC0415
    from nereus.kernel.config import KernelConfig  # noqa: PLC0415

    doc = build_document(Tenancy.open_default(), KernelConfig())
    info = doc["info"]
    out = [
        "# HTTP API",
        "",
        "Rendered from the OpenAPI document that `nereus serve` answers at `GET /openapi.json`,",
        "here for the default configuration (no `--config`: one tenant, the default limits).",
        "A configured service states its own limits in its own document. The contract in",
        "prose, with the reasons, is [the HTTP spec](../design/http.md).",
        "",
        f"**{info['title']}**, OpenAPI {doc['openapi']}, version {info['version']}.",
        "",
        _cell(info["description"]),
        "",
        "## Routes",
        "",
    ]
    for path, methods in doc["paths"].items():
        for method, op in methods.items():
            out += _operation(path, method, op)
    out += _schemas(doc["components"]["schemas"])
    return "\n".join(out) + "\n"
