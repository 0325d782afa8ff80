"""The configuration a composed service starts with: the tenancy, and the edges' own sections.

Theory of operation: `adapters.tenancy` reads the file and checks every rule that is not one
edge's; a section that belongs to an edge (`[pulsar]`, the Pulsar routing of queues) is kept
raw there, because the tenancy must not import an edge. It is parsed here, where the edges
are composed: `load_configuration` is `load_tenancy` plus those sections' checks, so a bad
`[pulsar]` still stops `nereus serve --config` at load, naming the key, before anything is
opened. `pulsar_routing` turns the section (or `--pulsar URL` alone) into the routing the
destination is built from (`adapters.compose.destinations`).
"""

from __future__ import annotations

from collections.abc import Mapping

from nereus.adapters.config_file import convert
from nereus.adapters.pulsar.config import PulsarRouting, parse_section, routing_for_url
from nereus.adapters.tenancy import ConfigError, Tenancy, load_tenancy, parse_tenancy

# A stand-in service URL for checking a section whose targets leave theirs to `--pulsar URL`.
_URL_UNSET = "pulsar://unset"


def load_configuration(path: str, environ: Mapping[str, str] | None = None) -> Tenancy:
    """The file at `path` as a Tenancy, every section checked (ConfigError otherwise)."""
    return check_sections(load_tenancy(path, environ))


def parse_configuration(
    doc: dict[str, object], source: str, environ: Mapping[str, str] | None = None
) -> Tenancy:
    """A parsed TOML document as a Tenancy, every section checked (ConfigError otherwise)."""
    return check_sections(parse_tenancy(doc, source, environ))


def check_sections(tenancy: Tenancy) -> Tenancy:
    """The edges' sections checked as they will be used, so a bad one refuses the file."""
    if tenancy.pulsar:
        pulsar_routing(tenancy, None if _has_urls(tenancy.pulsar) else _URL_UNSET)
    return tenancy


def pulsar_routing(tenancy: Tenancy, service_url: str | None) -> PulsarRouting | None:
    """Which queues go to which Pulsar target (`[pulsar]`, `--pulsar URL`), or None when
    every queue stays on the local destination. `--topic` mappings and the check of
    `--pulsar URL`'s routing: `adapters.compose.destinations`."""
    if tenancy.pulsar:
        source = tenancy.source
        return parse_section(
            tenancy.pulsar,
            lambda key, problem: ConfigError(source, key, problem),
            lambda value, typ, at: convert(value, typ, at, source),
            service_url=service_url,
            tenants=tenancy.tenants,
        )
    if service_url is not None:
        return routing_for_url(service_url, {})
    return None


def _has_urls(section: dict[str, object]) -> bool:
    """Whether every target names its service URL (else `--pulsar URL` must)."""
    targets = section.get("targets")
    return isinstance(targets, dict) and all(
        isinstance(t, dict) and "service_url" in t for t in targets.values()
    )
