"""The console in a real browser (headless Debian Chromium through Selenium) against a real
service: log in, find a timer the test scheduled and see its Admission and its destination
evidence once it fired, see an UNKNOWN attempt after a forced destination failure, cancel a
timer from the page and see the verdict, and a tenant that cannot see another's queue. Every
page is also checked without JavaScript and for Content-Security-Policy reports, and each
test saves its page as the screenshot docs/console/ shows."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.common.by import By

from nereus.adapters.local.destination import LocalDestination
from nereus.kernel.records import Unknown
from nereus.runtime.destination import Send, SendResult
from tests.support.browser import console_errors, csp_violations, screenshot
from tests.support.http_harness import QUEUE, Service, config, schedule, start_service

LOST_QUEUE = "lost"


class LosingDestination(LocalDestination):
    """Loses every send to the `lost` queue: the producer's answer never comes, so the
    attempt is UNKNOWN (nothing is written: a search would prove it absent)."""

    def _submit(self, sends: Sequence[Send], now_ms: int) -> None:
        lost = [s for s in sends if s.prepared.topic.endswith(LOST_QUEUE)]
        kept = [s for s in sends if not s.prepared.topic.endswith(LOST_QUEUE)]
        if kept:
            super()._submit(kept, now_ms)
        for send in lost:
            self._results.append(SendResult.of(send, Unknown("timeout", "lost by the test")))


@pytest.fixture
def svc(tmp_path: Path) -> Iterator[Service]:
    data = tmp_path / "data"
    destination = LosingDestination(str(data / "destination"))
    with start_service(data, config(), destination=destination) as s:
        yield s


def until(what: str, done: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if done():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def login(driver: webdriver.Chrome, svc: Service, token: str) -> None:
    driver.get(f"{svc.url}/console/overview")
    assert driver.current_url.endswith("/console/login")
    driver.find_element(By.ID, "token").send_keys(token)
    driver.find_element(By.ID, "login-button").click()
    # A click on a form's button may return before the navigation it starts has ended.
    until("the overview", lambda: driver.current_url.endswith("/console/overview"))


def find_timer(driver: webdriver.Chrome, queue: str, key: str) -> None:
    driver.get(f"{driver.current_url.split('/console')[0]}/console/timer")
    driver.find_element(By.ID, "q-queue").send_keys(queue)
    driver.find_element(By.ID, "q-key").send_keys(key)
    driver.find_element(By.ID, "find").click()
    until("the answer", lambda: "key=" in driver.current_url and page_loaded(driver))


def page_loaded(driver: webdriver.Chrome) -> bool:
    return bool(driver.find_elements(By.TAG_NAME, "footer"))


def no_policy_reports(driver: webdriver.Chrome) -> None:
    errors = console_errors(driver)
    assert csp_violations(errors) == [], errors
    assert errors == [], errors


def test_a_fired_timers_story_shows_its_admission_and_evidence(
    svc: Service, browser: webdriver.Chrome
) -> None:
    svc.post(schedule("welcome", delay_ms=1_500, payload=b"hello"))
    svc.post(*(schedule(f"later-{i}", delay_ms=3_600_000 + i) for i in range(12)))
    login(browser, svc, "acme-all")
    until("the delivery", lambda: len(svc.delivered(tenant="acme")) == 1)
    (record,) = svc.delivered(tenant="acme")
    find_timer(browser, QUEUE, "welcome")
    assert browser.find_element(By.ID, "status").text == "DELIVERED"
    story = browser.find_element(By.ID, "story")
    kinds = [e.get_attribute("data-kind") for e in story.find_elements(By.CSS_SELECTOR, "li.event")]
    assert kinds[:3] == ["command", "admission", "outcome"], kinds
    assert "verdict-PUBLISHED" in (story.get_attribute("innerHTML") or "")
    attempts = browser.find_element(By.ID, "attempts").text
    assert f"offset {record.offset}" in attempts and record.attempt_id in attempts
    assert browser.find_element(By.ID, "deliver-at-boundary").is_displayed()
    # The viewer's zone beside UTC: a preference kept in a cookie, no script needed.
    browser.find_element(By.ID, "zone").send_keys("Europe/Berlin")
    browser.find_element(By.ID, "zone-set").click()
    until("the zone", lambda: bool(browser.find_elements(By.CSS_SELECTOR, "#deliver-at .zone")))
    assert "Europe/Berlin" in browser.find_element(By.CSS_SELECTOR, "#deliver-at .zone").text
    screenshot(browser, "timer")
    no_policy_reports(browser)
    browser.get(f"{svc.url}/console/overview")
    assert browser.find_element(By.ID, "early").text.startswith("0")
    screenshot(browser, "overview")
    browser.get(f"{svc.url}/console/queues")
    assert QUEUE in browser.find_element(By.ID, "queues").text
    screenshot(browser, "queues")
    browser.find_element(By.LINK_TEXT, QUEUE).click()
    assert "later-0" in browser.find_element(By.ID, "timers").text
    screenshot(browser, "queue")
    no_policy_reports(browser)


def test_a_lost_send_shows_as_an_unknown_obligation(
    svc: Service, browser: webdriver.Chrome
) -> None:
    svc.post(schedule("receipt-7", delay_ms=200, queue=LOST_QUEUE))
    login(browser, svc, "acme-all")

    def unknown_listed() -> bool:
        browser.get(f"{svc.url}/console/obligations")
        return "UNKNOWN" in browser.find_element(By.TAG_NAME, "main").text

    until("the UNKNOWN attempt", unknown_listed)
    row = browser.find_element(By.CSS_SELECTOR, "#obligations tr.attempt-UNKNOWN")
    assert "receipt-7" in row.text and "proof either way" in row.text
    screenshot(browser, "obligations")
    find_timer(browser, LOST_QUEUE, "receipt-7")
    assert browser.find_element(By.ID, "status").text == "UNCERTAIN"
    assert "UNKNOWN" in browser.find_element(By.ID, "attempts").text
    no_policy_reports(browser)


def test_cancel_from_the_page_shows_the_verdict(
    svc: Service, browser_without_js: webdriver.Chrome
) -> None:
    driver = browser_without_js
    svc.post(schedule("trial-ends", delay_ms=3_600_000))
    login(driver, svc, "acme-all")
    find_timer(driver, QUEUE, "trial-ends")
    driver.find_element(By.ID, "cancel-link").click()
    until("the confirmation", lambda: bool(driver.find_elements(By.ID, "confirm")))
    assert "trial-ends" in driver.find_element(By.ID, "confirm").text
    screenshot(driver, "confirm")
    driver.find_element(By.ID, "confirm-button").click()
    until("the verdict", lambda: bool(driver.find_elements(By.ID, "verdict-status")))
    assert driver.find_element(By.ID, "verdict-status").text == "canceled"
    assert driver.find_element(By.ID, "verdict-code").text == "canceled"
    screenshot(driver, "verdict")
    assert svc.nereus.peek(QUEUE, "trial-ends", tenant="acme").status == "CANCELED"
    find_timer(driver, QUEUE, "trial-ends")
    assert driver.find_element(By.ID, "status").text == "CANCELED"
    assert "CANCEL_V1" in driver.find_element(By.ID, "story").text


def test_a_tenant_cannot_see_another_tenants_queue(
    svc: Service, browser_without_js: webdriver.Chrome
) -> None:
    driver = browser_without_js
    svc.post(schedule("acme-only", delay_ms=3_600_000))
    login(driver, svc, "globex-all")
    assert "globex" in driver.find_element(By.ID, "tenant").text
    driver.get(f"{svc.url}/console/queues")
    assert driver.find_elements(By.ID, "no-queues")
    driver.get(f"{svc.url}/console/queues/{QUEUE}")
    assert "acme-only" not in driver.find_element(By.TAG_NAME, "main").text
    find_timer(driver, QUEUE, "acme-only")
    assert driver.find_elements(By.ID, "not-found")
    assert not driver.find_elements(By.ID, "summary")


def test_the_login_and_audit_pages_work_without_javascript(
    svc: Service, browser_without_js: webdriver.Chrome
) -> None:
    driver = browser_without_js
    svc.post(*(schedule(f"k{i}", delay_ms=100) for i in range(10)))
    until("the deliveries", lambda: len(svc.delivered(tenant="acme")) == 10)
    driver.get(f"{svc.url}/console/login")
    screenshot(driver, "login")
    driver.find_element(By.ID, "token").send_keys("acme-all")
    driver.find_element(By.ID, "login-button").click()
    until("the overview", lambda: driver.current_url.endswith("/console/overview"))
    driver.get(f"{svc.url}/console/audit")
    driver.find_element(By.ID, "audit-start").click()
    # The POST's redirect must land before the next get, which would cancel it.
    until("the audit's row", lambda: bool(driver.find_elements(By.ID, "audits")))

    def finished() -> bool:
        driver.get(f"{svc.url}/console/audit")
        return bool(driver.find_elements(By.CSS_SELECTOR, "#audits tr.audit-ok"))

    until("the audit", finished)
    screenshot(driver, "audit")
    driver.find_element(By.ID, "logout").click()
    until("the login page", lambda: driver.current_url.endswith("/console/login"))
    driver.get(f"{svc.url}/console/overview")
    assert driver.current_url.endswith("/console/login")
