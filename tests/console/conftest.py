"""The console's tests run in a real browser: every module here may take `browser` (scripts
on) or `browser_without_js` (scripts off), both from tests/support/browser.py."""

from tests.support.browser import browser, browser_without_js

__all__ = ["browser", "browser_without_js"]
