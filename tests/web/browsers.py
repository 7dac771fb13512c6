"""The two browsers the page tests drive, behind one small surface (``Browser``): Debian's
headless Chromium through Selenium and its ``chromedriver``, and Debian's ``firefox-esr``
through Marionette, the remote protocol built into Firefox, with Mozilla's own client
(``marionette-driver``) — Debian has no ``geckodriver`` and nothing can be downloaded here.

Both speak the W3C WebDriver vocabulary: locator strategies are the same strings (``By``) and
keys the same code points (``Keys``), and both clients' elements answer ``text``,
``get_attribute``, ``click``, ``send_keys``, ``clear``, ``is_displayed``, ``is_enabled`` and
``find_element(s)`` (``Element``). What differs — navigation, window size, screenshots, and
above all how the console's errors are read — is what the two adapters here hide. A test asks
``browser.errors()``, never a driver's own log.

Console errors in Firefox: Marionette has no console log to read. A listener registered in the
browser's chrome (privileged) context on the console service receives every script error of
every page from its first byte — uncaught exceptions, unhandled rejections, Content-Security-
Policy violations — including those of pages loading in content processes; warnings and the
browser's own (chrome) messages are left out. A page's own ``console.error`` calls never reach
that service, so after each navigation the adapter wraps the page's ``console.error`` to also
``reportError`` what it was given, which does. (A ``console.error`` during a page's load, before
the wrapper is in, is the one thing not seen; the pages call ``console.error`` nowhere.)
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys

__all__ = ["BROWSERS", "Browser", "By", "Element", "Keys", "chromium_browser", "firefox_browser"]

BROWSERS = ("chromium", "firefox")
"""Every page test runs in each, unless it says otherwise (``conftest.browser``)."""

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
FIREFOX = "/usr/bin/firefox-esr"
INSTALL = {"chromium": "apt-get install -y chromium chromium-driver",
           "firefox": "apt-get install -y firefox-esr"}
"""What `.ci/run` installs when a browser is missing."""

PAGE_LOAD_S = 60


class Element(Protocol):
    """What a test may ask of an element, in either browser."""

    @property
    def text(self) -> str: ...
    def get_attribute(self, name: str) -> str | None: ...
    def click(self) -> None: ...
    def send_keys(self, *values: str) -> None: ...
    def clear(self) -> None: ...
    def is_displayed(self) -> bool: ...
    def is_enabled(self) -> bool: ...
    def find_element(self, by: str, value: str) -> Any: ...
    def find_elements(self, by: str, value: str) -> list[Any]: ...


class Browser(Protocol):
    """What a test may ask of a browser, in either."""

    name: str

    def get(self, url: str) -> None: ...
    def refresh(self) -> None: ...
    @property
    def current_url(self) -> str: ...
    def find_element(self, by: str, value: str) -> Any: ...
    def find_elements(self, by: str, value: str) -> list[Any]: ...
    def execute_script(self, script: str, *args: Any) -> Any:
        """Run ``script`` as a function body in the page's own context (its globals, its
        ``window``), with ``arguments``; return what it returns."""
    def set_window_size(self, width: int, height: int) -> None: ...
    def save_screenshot(self, path: Path) -> None:
        """The page as PNG (Chromium: the window; Firefox: the whole page)."""
    def errors(self) -> list[str]:
        """The errors the browser logged since the last call (each one line of text)."""


def _require(*paths: str, browser: str) -> None:
    for path in paths:
        if shutil.which(path) is None:
            pytest.fail(f"{path} is missing: {INSTALL[browser]} (.ci/run does it)")


class ChromiumBrowser:
    """Headless Chromium through Selenium and ``chromedriver``; errors from its own log."""

    name = "chromium"

    def __init__(self, driver: Any) -> None:
        self.driver = driver

    def get(self, url: str) -> None:
        self.driver.get(url)

    def refresh(self) -> None:
        self.driver.refresh()

    @property
    def current_url(self) -> str:
        return str(self.driver.current_url)

    def find_element(self, by: str, value: str) -> Any:
        return self.driver.find_element(by, value)

    def find_elements(self, by: str, value: str) -> list[Any]:
        return list(self.driver.find_elements(by, value))

    def execute_script(self, script: str, *args: Any) -> Any:
        return self.driver.execute_script(script, *args)

    def set_window_size(self, width: int, height: int) -> None:
        self.driver.set_window_size(width, height)

    def save_screenshot(self, path: Path) -> None:
        self.driver.save_screenshot(str(path))

    def errors(self) -> list[str]:
        return [str(e["message"]) for e in self.driver.get_log("browser")
                if e["level"] == "SEVERE"]


@contextmanager
def chromium_browser() -> Iterator[ChromiumBrowser]:
    """One headless Chromium (a fresh profile per test is not needed: each test signs in
    again, and sessionStorage is per tab)."""
    _require(CHROMIUM, CHROMEDRIVER, browser="chromium")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1280,900", "--no-first-run", "--disable-extensions"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    driver.set_page_load_timeout(PAGE_LOAD_S)
    try:
        yield ChromiumBrowser(driver)
    finally:
        driver.quit()


LISTEN = """
if (!window.voiceErrors) {
  const kept = window.voiceErrors = [];
  const quiet = Ci.nsIScriptError.warningFlag | Ci.nsIScriptError.infoFlag;
  Services.console.registerListener({observe(message) {
    if (!(message instanceof Ci.nsIScriptError) || (message.flags & quiet)
        || message.isFromChromeContext) return;
    kept.push(`${message.sourceName}:${message.lineNumber} ${message.errorMessage}`);
  }});
}"""
"""Run in the chrome context once: every page's script errors (not warnings, not the
browser's own) kept in the chrome window, which lives as long as the browser."""

TAKE = "return window.voiceErrors.splice(0)"

WRAP_CONSOLE_ERROR = """
if (!window.voiceConsoleWrapped) {
  window.voiceConsoleWrapped = true;
  const original = console.error;
  console.error = function (...args) {
    original.apply(console, args);
    reportError(new Error(`console.error: ${args.map(String).join(" ")}`));
  };
}"""
"""Run in the page after each navigation: its ``console.error`` calls reported as errors too,
so the console service (and the listener above) sees them."""

PREFS = {
    "dom.ipc.processCount": 1,  # one content process: the machine has two cores, shared
}


class FirefoxBrowser:
    """Headless Firefox ESR through Marionette; errors from the console service (above)."""

    name = "firefox"

    def __init__(self, client: Any) -> None:
        self.client = client
        with client.using_context("chrome"):
            # The browser window's own minimum width (500 px) would keep a page from being
            # seen at 360 px; the page's layout is what is tested, not the toolbar's.
            client.execute_script("document.documentElement.style.minWidth = '0px'")
            client.execute_script(LISTEN)

    def _wrap_console(self) -> None:
        self.client.execute_script(WRAP_CONSOLE_ERROR, sandbox=None)

    def get(self, url: str) -> None:
        self.client.navigate(url)
        if url.startswith("http"):
            self._wrap_console()

    def refresh(self) -> None:
        self.client.refresh()
        self._wrap_console()

    @property
    def current_url(self) -> str:
        return str(self.client.get_url())

    def find_element(self, by: str, value: str) -> Any:
        return self.client.find_element(by, value)

    def find_elements(self, by: str, value: str) -> list[Any]:
        return list(self.client.find_elements(by, value))

    def execute_script(self, script: str, *args: Any) -> Any:
        # sandbox=None: the page's own globals, as Selenium's scripts see them (a sandbox
        # would see the page through Xray wrappers, and its `window.fetch = …` would not
        # reach the page).
        return self.client.execute_script(script, script_args=args, sandbox=None)

    def set_window_size(self, width: int, height: int) -> None:
        self.client.set_window_rect(width=width, height=height)

    def save_screenshot(self, path: Path) -> None:
        path.write_bytes(self.client.screenshot(format="binary", full=True))

    def errors(self) -> list[str]:
        with self.client.using_context("chrome"):
            return [str(e) for e in self.client.execute_script(TAKE)]


@contextmanager
def firefox_browser(logs: Path) -> Iterator[FirefoxBrowser]:
    """One headless Firefox ESR on a fresh profile, Marionette on a free port; its own
    output in ``logs/gecko.log``."""
    _require(FIREFOX, browser="firefox")
    from marionette_driver.marionette import Marionette

    from deploy.kafka_local import free_port

    client = Marionette(bin=FIREFOX, headless=True, port=free_port(), startup_timeout=120,
                        gecko_log=str(logs / "gecko.log"), prefs=PREFS)
    try:
        client.start_session()
        client.timeout.page_load = PAGE_LOAD_S
        client.set_window_rect(width=1280, height=900)
        yield FirefoxBrowser(client)
    finally:
        client.cleanup()
