"""The live service against its own OpenAPI document, with schemathesis.

A real `HttpServer` over an embedded `Nereus` (LMDB in a temp dir, the host clock with an
assumed error) and a configuration with tenants and tokens; schemathesis loads
`/openapi.json` from it and sends generated requests (valid and invalid) to every operation
with a bearer token. Every response must be documented (status, content type, headers,
schema), none may be a 5xx, and every error body must carry a code from `ERROR_CODES`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from nereus.adapters.http.contract import ERROR_CODES
from nereus.adapters.http.openapi import build_document
from nereus.adapters.tenancy import parse_tenancy
from nereus.kernel.config import KernelConfig
from tests.support.http_harness import Service, config, start_service

AUTH = {"Authorization": "Bearer acme-all"}


TENANCY = parse_tenancy(
    config(acme={"horizon_ms": 3_600_000, "max_live_timers": 100_000}), "schemathesis.toml"
)
# The document the service serves for this tenancy (checked below against `/openapi.json`).
# It is built here, at collection, because the pytest plugin needs the operations before any
# fixture runs (`schemathesis.pytest.from_fixture` does not work with this pytest).
DOCUMENT = build_document(TENANCY, KernelConfig())
schema = schemathesis.openapi.from_dict(json.loads(json.dumps(DOCUMENT)))


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    with start_service(tmp_path_factory.mktemp("schemathesis"), tenancy=TENANCY) as svc:
        served = json.loads(svc.call("GET", "/openapi.json", token=None).body)
        assert served == json.loads(json.dumps(DOCUMENT))
        yield svc


def error_bodies_carry_a_known_code(ctx: Any, response: Any, case: Any) -> bool | None:
    if response.status_code < 400 or case.path in ("/healthz", "/readyz"):
        return None
    doc = json.loads(response.content)
    assert isinstance(doc, dict) and set(doc) == {"error"}, doc
    code = doc["error"]["code"]
    assert code in ERROR_CODES, f"{code!r} is not in ERROR_CODES"
    assert isinstance(doc["error"]["message"], str) and doc["error"]["message"]
    return True


CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    error_bodies_carry_a_known_code,
]


@schema.parametrize()
@settings(
    max_examples=50,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=True,
)
def test_the_live_service_conforms_to_its_openapi_document(case: Any, live: Service) -> None:
    response = case.call(base_url=live.url, headers=AUTH, timeout=30)
    case.validate_response(response, checks=CHECKS)
    assert live.nereus.runtime.halted is None
