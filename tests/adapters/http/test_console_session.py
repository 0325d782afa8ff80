"""Console sessions (adapters/http/console/session.py), from their rules: a cookie is
accepted only as the server wrote it and only until it expires, and a CSRF token only for
its own session. tests/console/test_console_http.py checks the same rules over HTTP."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from nereus.adapters.http.console.session import SESSION_S, Sessions, cookie_value

SESSIONS = Sessions(b"k" * 32)
NOW_S = 1_800_000_000.0
ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.="


def test_a_cookie_reads_back_as_its_session_until_it_expires() -> None:
    session, value = SESSIONS.issue("ab" * 32, NOW_S)
    assert SESSIONS.read(value, NOW_S + 1) == session
    assert SESSIONS.read(value, NOW_S + SESSION_S - 1) == session
    assert SESSIONS.read(value, NOW_S + SESSION_S) is None


@given(st.data())
def test_an_altered_cookie_is_never_a_session(data: st.DataObject) -> None:
    _, value = SESSIONS.issue("cd" * 32, NOW_S)
    at = data.draw(st.integers(0, len(value) - 1))
    char = data.draw(st.sampled_from(ALPHABET).filter(lambda c: c != value[at]))
    altered = value[:at] + char + value[at + 1 :]
    assert SESSIONS.read(altered, NOW_S) is None


@given(st.text(alphabet=ALPHABET, max_size=200))
def test_text_the_server_did_not_sign_is_never_a_session(text: str) -> None:
    assert SESSIONS.read(text, NOW_S) is None


def test_a_cookie_signed_under_another_key_is_no_session() -> None:
    _, value = Sessions(b"x" * 32).issue("ef" * 32, NOW_S)
    assert SESSIONS.read(value, NOW_S) is None


@given(st.text(max_size=80))
def test_a_csrf_token_is_accepted_only_for_its_own_session(guess: str) -> None:
    mine, _ = SESSIONS.issue("", NOW_S)
    other, _ = SESSIONS.issue("", NOW_S)
    assert SESSIONS.csrf_ok(mine, SESSIONS.csrf(mine))
    assert not SESSIONS.csrf_ok(mine, SESSIONS.csrf(other))
    assert not SESSIONS.csrf_ok(mine, None)
    if guess != SESSIONS.csrf(mine):
        assert not SESSIONS.csrf_ok(mine, guess)


def test_the_cookie_header_is_read_by_name() -> None:
    assert cookie_value("a=1; nereus_console=v.w; b=2") == "v.w"
    assert cookie_value("nereus_consolex=1") is None
    assert cookie_value(None) is None
