"""A real browser for the operator console's tests: Debian's headless Chromium, driven by
Selenium through Debian's chromedriver.

Theory of operation: `chromium()` starts /usr/bin/chromedriver, which starts /usr/bin/chromium
in a fresh profile in a temporary directory, with a fixed window so that screenshots compare
from run to run. Both paths are given to Selenium, so its Selenium Manager (which would look
for, and may download, a browser and a driver of its own) is never run; SE_OFFLINE forbids it
any download should a later Selenium call it anyway. Leaving the block quits the driver, then
waits for every process the driver started to exit (killing stragglers by pid) before the
profile is removed, so no test leaves a Chromium behind. `javascript=False` turns scripts off
the way an administrator's policy does, because the console's pages must work without them.

The browser console (goog:loggingPrefs) is read with `console_errors`; `csp_violations` picks
out the Content-Security-Policy reports among them. `screenshot` saves a full-page PNG under
docs/console/. The fixtures `browser` and `browser_without_js` FAIL (never skip) when Chromium
or its driver is missing: a browser test that silently does not run would prove nothing.
"""

from __future__ import annotations

import base64
import os
import signal
import tempfile
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service

from tests.support.worker_process import gone

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
INSTALL = (
    "`sudo apt-get install chromium chromium-driver` (./scripts/test runs it as root or with sudo)"
)
ROOT = Path(__file__).resolve().parents[2]
SCREENSHOTS = ROOT / "docs" / "console"
# The window, not the page: headless Chromium keeps room for toolbars it does not draw, so the
# viewport is shorter (1280x757 in Chromium 156); a full-page screenshot is the window's width.
WINDOW = (1280, 900)
# Headless and reproducible: no GPU or sandbox (containers, root), and nothing that reaches
# out on its own (QUIC, first-run pages, component updates, sync, background fetches).
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)
# Chromium's content-setting value for "block", as an enterprise policy would set it.
BLOCK = 2
QUIT_TIMEOUT_S = 10.0

# Read by Selenium Manager, should any Selenium call run it despite the paths given below.
os.environ["SE_OFFLINE"] = "true"


class BrowserMissing(RuntimeError):
    pass


def missing() -> str | None:
    """Why no browser can start here, with how to install one, or None when both are there."""
    absent = [str(path) for path in (CHROMIUM, CHROMEDRIVER) if not os.access(path, os.X_OK)]
    if not absent:
        return None
    return f"{' and '.join(absent)} not found: the browser tests need Debian's Chromium: {INSTALL}"


def options(*, javascript: bool = True, window: tuple[int, int] = WINDOW) -> Options:
    opts = Options()
    opts.binary_location = str(CHROMIUM)
    for flag in FLAGS:
        opts.add_argument(flag)
    opts.add_argument(f"--window-size={window[0]},{window[1]}")
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    if not javascript:
        opts.add_experimental_option(
            "prefs", {"profile.managed_default_content_settings.javascript": BLOCK}
        )
    return opts


@contextmanager
def chromium(
    *, javascript: bool = True, window: tuple[int, int] = WINDOW
) -> Iterator[webdriver.Chrome]:
    """Headless Chromium in a fresh profile, quit and its profile removed on leaving."""
    why = missing()
    if why is not None:
        raise BrowserMissing(why)
    with tempfile.TemporaryDirectory(prefix="nereus-chromium-") as profile:
        opts = options(javascript=javascript, window=window)
        opts.add_argument(f"--user-data-dir={profile}")
        service = Service(executable_path=str(CHROMEDRIVER))
        driver = webdriver.Chrome(options=opts, service=service)
        try:
            yield driver
        finally:
            # The driver's own quit does not wait for the browser's helpers (renderer,
            # zygote, crash handler), which would write into the profile as it is removed.
            started = descendants(service.process.pid)
            driver.quit()
            _reap(started)


def descendants(root: int) -> list[int]:
    """`root` and every process under it, as /proc shows them now."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(") ", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def _reap(pids: list[int]) -> None:
    deadline = time.monotonic() + QUIT_TIMEOUT_S
    while time.monotonic() < deadline and not all(gone(pid) for pid in pids):
        time.sleep(0.05)
    for pid in pids:
        if not gone(pid):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture
def browser() -> Iterator[webdriver.Chrome]:
    """Headless Chromium with JavaScript on."""
    with _required(javascript=True) as driver:
        yield driver


@pytest.fixture
def browser_without_js() -> Iterator[webdriver.Chrome]:
    """Headless Chromium with JavaScript off, as the console's pages must work."""
    with _required(javascript=False) as driver:
        yield driver


@contextmanager
def _required(*, javascript: bool) -> Iterator[webdriver.Chrome]:
    why = missing()
    if why is not None:
        pytest.fail(why, pytrace=False)
    with chromium(javascript=javascript) as driver:
        yield driver


def console_errors(driver: webdriver.Chrome) -> list[str]:
    """The browser console's errors since the last read (reading the log empties it)."""
    entries = driver.get_log("browser")  # type: ignore[no-untyped-call]  # unannotated in Selenium
    return [str(entry["message"]) for entry in entries if entry.get("level") == "SEVERE"]


def csp_violations(messages: Iterable[str]) -> list[str]:
    """The messages that report a Content-Security-Policy violation."""
    return [message for message in messages if "Content Security Policy" in message]


def screenshot(driver: webdriver.Chrome, name: str, folder: Path = SCREENSHOTS) -> Path:
    """Save the whole page, not only the window, as `folder/<name>.png`; its path."""
    width = int(driver.get_window_size()["width"])
    # A viewport as tall as the page has no scroll bar to take width from the layout, so the
    # picture is as wide as the window whatever the page's length, at one pixel per CSS pixel.
    metrics = {"width": width, "deviceScaleFactor": 1, "mobile": False}
    driver.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride", {**metrics, "height": _page_height(driver)}
    )
    try:
        clip = {"x": 0, "y": 0, "width": width, "height": _page_height(driver), "scale": 1}
        shot = driver.execute_cdp_cmd(
            "Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True, "clip": clip}
        )
    finally:
        driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.png"
    path.write_bytes(base64.b64decode(shot["data"]))
    return path


def _page_height(driver: webdriver.Chrome) -> int:
    metrics = driver.execute_cdp_cmd("Page.getLayoutMetrics", {})
    content, view = metrics["cssContentSize"], metrics["cssLayoutViewport"]
    return int(max(content["height"], view["clientHeight"]))
