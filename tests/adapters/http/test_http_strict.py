"""Strict parsing at the HTTP edge, and what the access log may write (issue 31, item 6).

* Obsolete line folding is refused: a header line that starts with a space or a tab is
  `400 malformed_request`, and the app never sees the request (h11 accepts folding by
  design and would have joined `Authorization: Bearer` and ` TOKEN` into one credential, or
  read ` Transfer-Encoding: chunked` as part of `X-A`).
* A credential in the query never reaches the access log: the value of a parameter named
  like one is written `[redacted]`.

The same rules are guarded from other sides by `test_http_hostile` (the folded requests in
its table of hostile bytes) and `test_http_logs` (the access log of `nereus serve`).
"""

from __future__ import annotations

import logging
import socket
import urllib.parse
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nereus.adapters.http.errors import Response
from nereus.adapters.http.redact import redact_target
from nereus.runtime.log import Logger
from tests.support.http_harness import QUEUE, Service, config, read_reply, start_service
from tests.support.strategies import props

AUTH_LINE = b"Authorization: Bearer acme-all\r\n"
# The two requests the black-box probe sent (issue 31).
FOLDED_AUTH = (
    b"GET /api/v1/timers/" + QUEUE.encode() + b"/k HTTP/1.1\r\nHost: x\r\n"
    b"Authorization: Bearer\r\n acme-all\r\n\r\n"
)
FOLDED_TE = (
    b"POST /api/v1/timers HTTP/1.1\r\nHost: x\r\n" + AUTH_LINE + b"Content-Length: 5\r\n"
    b"X-A: 1\r\n Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
)


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    with start_service(tmp_path_factory.mktemp("strict"), config()) as s:
        yield s


@contextmanager
def _app_calls(svc: Service) -> Iterator[list[str]]:
    """The requests that reached the API's handlers while the block runs."""
    calls: list[str] = []
    respond = svc.api.respond

    async def recording(
        method: str, raw_path: str, query: str, body: bytes, headers: Mapping[str, str]
    ) -> Response:
        calls.append(f"{method} {raw_path}")
        return await respond(method, raw_path, query, body, headers)

    svc.api.respond = recording  # type: ignore[method-assign]
    try:
        yield calls
    finally:
        svc.api.respond = respond  # type: ignore[method-assign]


def _send(svc: Service, data: bytes) -> tuple[int, str | None]:
    with socket.create_connection(("127.0.0.1", svc.server.port), timeout=30) as sock:
        sock.sendall(data)
        reply = read_reply(sock)
    return reply.status, reply.code


@pytest.mark.parametrize("data", [FOLDED_AUTH, FOLDED_TE], ids=["authorization", "te"])
def test_a_folded_header_is_refused_before_the_app_sees_it(svc: Service, data: bytes) -> None:
    before = svc.log_end
    with _app_calls(svc) as seen:
        assert _send(svc, data) == (400, "malformed_request")
        assert seen == [], "the app saw a request with a folded header"
        assert svc.log_end == before
        # The same request with each header on one line reaches the app: the recorder works.
        _send(svc, data.replace(b"\r\n ", b" "))
        assert len(seen) == 1, "the unfolded request did not reach the app either"


_HEADERS = [b"Host: x", AUTH_LINE.rstrip(), b"Accept: application/json", b"X-Trace: abc"]


@props(40)
@given(
    st.integers(0, len(_HEADERS)),
    st.text(" \t", min_size=1, max_size=3).map(str.encode),
    st.sampled_from([b"", b"more", b"X-Injected: 1"]),
    st.sampled_from([b"\r\n", b"\n"]),
)
def test_any_header_line_that_starts_with_a_space_or_tab_is_refused(
    svc: Service, at: int, indent: bytes, text: bytes, eol: bytes
) -> None:
    """Wherever the folded line is (right after the request line h11 itself refuses it),
    whatever it holds, however the lines end: 400, and the app sees nothing."""
    lines = [b"GET /healthz HTTP/1.1", *_HEADERS[:at], indent + text, *_HEADERS[at:]]
    with _app_calls(svc) as seen:
        assert _send(svc, eol.join(lines) + eol + eol) == (400, "malformed_request")
    assert seen == []


# The access log ---------------------------------------------------------------------------------

# Written here, not read from the code under test: the names the issue lists.
CREDENTIAL_NAMES = [
    "access_token",
    "token",
    "api_key",
    "apikey",
    "key",
    "password",
    "secret",
    "auth",
    "authorization",
    "signature",
    "sig",
    "session",
]
_secret = st.text("ABCDEFGHJKLMNPQRSTUVWXYZ23456789", min_size=6, max_size=20).map(
    lambda s: "S3CR" + s
)


def _spelled(name: str, how: int) -> str:
    """A credential name as a client might spell it: as listed, upper case, mixed case,
    percent-encoded, or with `-` for `_`."""
    return [
        name,
        name.upper(),
        name.title(),
        "".join(f"%{ord(c):02X}" for c in name),
        name.replace("_", "-"),
    ][how]


@props(200)
@given(
    st.lists(
        st.tuples(st.sampled_from(CREDENTIAL_NAMES), st.integers(0, 4), _secret),
        min_size=1,
        max_size=3,
    ),
    st.lists(st.sampled_from(["after=k1", "limit=10", "txn=t-1", "flag"]), max_size=3),
    st.randoms(use_true_random=False),
    st.sampled_from(["&", ";"]),
)
def test_credential_values_never_survive_redaction(
    credentials: list[tuple[str, int, str]],
    plain: list[str],
    rnd: Any,
    sep: str,
) -> None:
    pairs = [f"{_spelled(n, how)}={urllib.parse.quote(v)}" for n, how, v in credentials]
    pairs += plain
    rnd.shuffle(pairs)
    target = f"/api/v1/timers/{QUEUE}?" + sep.join(pairs)
    logged = redact_target(target)
    for _, _, value in credentials:
        assert value not in logged, (target, logged)
    for pair in plain:
        assert pair in logged.partition("?")[2].split(sep), (target, logged)
    assert logged.count("=[redacted]") == len(credentials)
    assert logged.startswith(f"/api/v1/timers/{QUEUE}?")


def test_names_that_are_not_credentials_are_logged_as_sent() -> None:
    for target in (
        "/api/v1/timers/q?after=token&limit=5",
        "/api/v1/timers/q/k?txn=secret-looking-txn",
        "/healthz",
        "/api/v1/timers/q?keyword=x&tokens=y&monkey=z",
    ):
        assert redact_target(target) == target


def test_the_access_log_of_a_refused_token_in_the_query_holds_no_secret(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="nereus.http.access")
    with start_service(tmp_path / "data", config()) as s:
        # The harness's server logs no access lines; this one's connections share `Shared`.
        s.server.shared.access = Logger().child("http.access")
        for target in (
            f"/api/v1/timers/{QUEUE}/k?access_token=S3CRET-ONE",
            f"/api/v1/timers/{QUEUE}?after=a&Token=S3CRET-TWO&limit=2",
            "/healthz?API-KEY=S3CRET-THREE",
        ):
            s.call("GET", target, token=None)
    lines = [r for r in caplog.records if r.getMessage() == "http_request"]
    targets = [r.fields["target"] for r in lines]  # type: ignore[attr-defined]
    assert len(targets) == 3, targets
    assert not [t for t in targets if "S3CRET" in t], targets
    assert targets[0] == f"/api/v1/timers/{QUEUE}/k?access_token=[redacted]"
    assert targets[1] == f"/api/v1/timers/{QUEUE}?after=a&Token=[redacted]&limit=2"
    assert not [r for r in caplog.records if "S3CRET" in str(getattr(r, "fields", ""))]
