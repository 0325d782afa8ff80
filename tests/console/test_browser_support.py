"""The browser tests' own machinery, end to end without the console: Debian's Chromium and
chromedriver start with no Selenium Manager, render a page served under the console's strict
Content-Security-Policy, report the inline script that policy blocks, post a form with
scripts off, save a full-page PNG, and leave no process or profile behind."""

from __future__ import annotations

import html
import os
import struct
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import NoReturn
from urllib.parse import parse_qs

import pytest
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.common.selenium_manager import SeleniumManager
from selenium.webdriver.support.wait import WebDriverWait

from tests.support.browser import (
    WINDOW,
    chromium,
    console_errors,
    csp_violations,
    descendants,
    screenshot,
)
from tests.support.worker_process import gone

CSP = (
    "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
    "frame-ancestors 'none'; base-uri 'none'"
)
PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Browser smoke</title>
<link rel="stylesheet" href="/style.css"></head>
<body><h1 id="status">rendered by the server</h1>
<noscript><p id="noscript">scripts are off</p></noscript>
<script>document.getElementById("status").textContent = "the inline script ran";</script>
<form method="post" action="/echo"><input id="name" name="name">
<button id="send" type="submit">Send</button></form>
</body></html>
"""
STYLE = "body { font-family: sans-serif; margin: 2em; } h1 { color: #1f4e79; }"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


class _Site(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path == "/":
            self._answer(200, "text/html", PAGE)
        elif self.path == "/style.css":
            self._answer(200, "text/css", STYLE)
        elif self.path == "/favicon.ico":
            # The browser asks for it unprompted; a 404 would be an error in its console.
            self._answer(204, "image/x-icon", "")
        else:
            self._answer(404, "text/plain", "not found")

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        form = parse_qs(self.rfile.read(length).decode())
        name = html.escape(form.get("name", [""])[0])
        self._answer(200, "text/html", f'<!doctype html><p id="echo">posted {name}</p>')

    def _answer(self, status: int, kind: str, text: str) -> None:
        body = text.encode()
        self.send_response(status)
        self.send_header("Content-Type", f"{kind}; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Content-Security-Policy", CSP)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass  # pytest shows a failing test's output: the browser's requests are noise there


@pytest.fixture(scope="module")
def site() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Site)
    thread = threading.Thread(target=server.serve_forever, name="browser-smoke-site")
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def _no_selenium_manager(*_: object) -> NoReturn:
    raise AssertionError("Selenium Manager was asked for a browser or driver")


@pytest.fixture(autouse=True)
def _offline_selenium(monkeypatch: pytest.MonkeyPatch) -> None:
    """Autouse, so in place before the browser fixtures start Chromium: any call on Selenium
    Manager fails the test instead of looking for (and maybe downloading) a browser."""
    monkeypatch.setattr(SeleniumManager, "binary_paths", _no_selenium_manager)
    assert os.environ.get("SE_OFFLINE") == "true"


def _violations_within(driver: webdriver.Chrome, timeout_s: float) -> list[str]:
    # The driver collects console messages as the browser sends them, not with the page load.
    deadline = time.monotonic() + timeout_s
    found: list[str] = []
    while not found and time.monotonic() < deadline:
        found = csp_violations(console_errors(driver))
        time.sleep(0.1)
    return found


def test_the_page_renders_and_the_policy_blocks_its_inline_script(
    browser: webdriver.Chrome, site: str
) -> None:
    browser.get(f"{site}/")
    assert browser.find_element(By.ID, "status").text == "rendered by the server"
    assert browser.find_elements(By.ID, "noscript") == []  # scripts are on: <noscript> is inert
    violations = _violations_within(browser, timeout_s=10)
    assert len(violations) == 1, violations
    assert "inline script" in violations[0] and "default-src 'none'" in violations[0]


def test_a_form_posts_with_javascript_off(browser_without_js: webdriver.Chrome, site: str) -> None:
    browser_without_js.get(f"{site}/")
    assert browser_without_js.find_element(By.ID, "noscript").text == "scripts are off"
    browser_without_js.find_element(By.ID, "name").send_keys("ada & co")
    browser_without_js.find_element(By.ID, "send").click()
    # The click only starts the navigation: wait for the answer's page, as a person would.
    echo = WebDriverWait(browser_without_js, 30).until(
        lambda d: d.find_element(By.ID, "echo"), "the posted form's answer"
    )
    assert echo.text == "posted ada & co"
    assert browser_without_js.current_url == f"{site}/echo"
    # Scripts off, the inline script is never run, so the policy has nothing to report.
    assert console_errors(browser_without_js) == []


def test_a_screenshot_is_a_full_width_png(
    browser: webdriver.Chrome, site: str, tmp_path: Path
) -> None:
    browser.get(f"{site}/")
    # Not docs/console/: a test run must not leave files in the clone.
    path = screenshot(browser, "smoke", tmp_path / "console")
    assert path == tmp_path / "console" / "smoke.png"
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    length, kind, width, height = struct.unpack(">I4sII", data[8:24])
    assert (length, kind) == (13, b"IHDR")
    assert width == WINDOW[0]
    assert 0 < height <= WINDOW[1]


def test_leaving_the_block_ends_every_browser_process_and_removes_the_profile(site: str) -> None:
    with chromium() as driver:
        driver.get(f"{site}/")
        started = descendants(driver.service.process.pid)
        profile = Path(driver.capabilities["chrome"]["userDataDir"])
        assert len(started) > 1, "chromedriver started no browser"
        assert profile.is_dir()
    assert [pid for pid in started if not gone(pid)] == []
    assert not profile.exists()
