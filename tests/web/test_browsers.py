"""The page tests' last assertion — "the browser logged no error" — can fail, in each browser:
an error thrown while a page loads, one thrown later, a rejected promise nobody handles, a
``console.error`` call and a script the page's Content-Security-Policy refuses are each seen by
``Browser.errors()`` (in Firefox through the console listener and the ``console.error`` wrapper
of ``tests/web/browsers.py``; in Chromium through its own log)."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.web.conftest import WebStack, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.web]

FAULTS = """
setTimeout(() => { throw new Error("thrown-later") }, 0);
Promise.reject(new Error("rejected-unhandled"));
console.error("console-error-call");
const inline = document.createElement("script");
inline.textContent = "window.ranInline = true";
document.body.append(inline);
"""
"""Four faults in a page of the edge, whose policy refuses inline scripts."""


def test_errors_in_a_page_are_seen(stack: WebStack, browser: Any) -> None:
    """Each fault is seen, once the page is done with it; nothing is left unread."""
    seen: list[str] = []

    def all_seen(*markers: str) -> bool:
        """Whether each marker (a regular expression) is found in some error seen so far."""
        seen.extend(browser.errors())
        return all(any(re.search(m, e) for e in seen) for m in markers)

    def wait_seen(what: str, *markers: str) -> None:
        try:
            wait_for(lambda: all_seen(*markers), f"{what} in {browser.name}", timeout=30)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; seen: {seen}") from None

    browser.get("data:text/html,<!doctype html><script>throw new Error('thrown-at-load')</script>")
    wait_seen("the error thrown while the page loaded", "thrown-at-load")

    seen.clear()
    browser.get(f"{stack.url}/")
    browser.execute_script(FAULTS)
    wait_seen("the page's errors", "thrown-later", "rejected-unhandled", "console-error-call")
    # Chromium says "Content Security Policy", Firefox "Content-Security-Policy".
    wait_seen("the refused inline script", r"Content.Security.Policy")
    assert not browser.execute_script("return window.ranInline === true")
    assert not browser.errors()  # nothing else
