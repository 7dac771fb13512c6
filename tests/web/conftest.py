"""The web pages in real headless browsers — Debian's Chromium (Selenium and ``chromedriver``)
and Firefox ESR (Marionette), one surface for both in ``tests/web/browsers.py`` — against a
real stack: the session's broker, a worker and an edge.

The edge runs in ``dev`` on 127.0.0.1, so the pages offer the dev sign-in form and the tests
sign in through it, as a person would. Its gateway bound is short (``GATEWAY_BOUND_S``): every
stream is cut by the edge every few seconds, so each test also proves the pages resume; the edge
can also be restarted on the same address (``WebStack.restart_edge``).
Every test runs in each browser (``browser``'s params) and ends by asserting the browser logged
no error while it ran; screenshots go to ``test-artifacts/web/`` (git-ignored), linked from
``docs/web.md``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from streams.settings import VoiceSettings
from tests.support import (
    settings_with_topics,
    spawn_voice,
    stop,
    wait_group_stable,
    wait_http_ready,
    worker_group,
)
from tests.web.browsers import BROWSERS, Browser, By, chromium_browser, firefox_browser

GATEWAY_BOUND_S = "4"
"""The edge ends every stream about 3 s after it starts (1 s before this bound)."""

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "web"
"""Where the screenshots go (git-ignored); ``docs/web.md`` links them."""

WAIT_S = 90.0
"""Generous: a turn runs through the broker, a worker and the simulator on a shared 2-core box."""


EDGE_ENV = {"VOICE_ENV": "dev", "VOICE_GATEWAY_BOUND_S": GATEWAY_BOUND_S}
"""The edge's: dev (so the dev sign-in exists, on 127.0.0.1) and the short bound."""


@dataclass
class WebStack:
    """A worker and an edge on their own topics of the session's broker; the edge can be
    restarted on the same address (a browser's connection dropped by the server)."""

    settings: VoiceSettings
    url: str
    port: int
    logs: Path
    edge: subprocess.Popen[bytes]

    def start_edge(self) -> None:
        self.edge = spawn_voice(self.settings, "edge", "--port", str(self.port),
                                log=self.logs / "edge.log", **EDGE_ENV)
        wait_http_ready(f"{self.url}/readyz", timeout=WAIT_S, proc=self.edge)

    def restart_edge(self) -> None:
        """Stop the edge (its streams end mid-flight), start a new one on the same port."""
        stop(self.edge)
        self.start_edge()


@contextmanager
def running_web_stack(kafka_bootstrap: str, tmp: Path, model_url: str) -> Iterator[WebStack]:
    """A worker (its model at ``model_url``) and an edge on their own topics."""
    from deploy.kafka_local import free_port

    settings = settings_with_topics(kafka_bootstrap, tmp)
    worker = spawn_voice(settings, "worker", log=tmp / "worker.log",
                         ANTHROPIC_API_KEY="simulator", ANTHROPIC_BASE_URL=model_url)
    port = free_port()
    web = WebStack(settings, f"http://127.0.0.1:{port}", port, tmp,
                   spawn_voice(settings, "edge", "--port", str(port), log=tmp / "edge.log",
                               **EDGE_ENV))
    try:
        wait_group_stable(settings, worker_group(settings))
        wait_http_ready(f"{web.url}/readyz", timeout=WAIT_S, proc=web.edge)
        yield web
    finally:
        stop(web.edge)
        stop(worker)


@pytest.fixture(scope="session")
def stack(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory, simulator_url: str
          ) -> Iterator[WebStack]:
    """The stack the web tests share (each signs in as its own people, so they do not see
    each other's data)."""
    with running_web_stack(kafka_bootstrap, tmp_path_factory.mktemp("web"), simulator_url) as web:
        yield web


SLOW_CHUNK_DELAY_MS = "250"
"""The slow model's pause between streamed pieces (20 characters each): a reply takes seconds
to write, so a page can be seen drawing it."""
SLOW_LATENCY_MS = "1500"
"""And before each of its answers: an assistant turn (four model calls) runs for seconds, so a
cancel lands while it runs, well before its map."""


@pytest.fixture(scope="session")
def slow_stack(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
               ) -> Iterator[WebStack]:
    """A second stack whose worker's model writes slowly (a second ``voice simulator`` with
    ``VOICE_SIMULATOR_CHUNK_DELAY_MS``); started only by the tests that need it."""
    from deploy.kafka_local import free_port

    tmp = tmp_path_factory.mktemp("web-slow")
    port = free_port()
    model = subprocess.Popen(
        [sys.executable, "-m", "deploy.cli", "simulator", "--port", str(port)],
        env={**os.environ, "VOICE_SIMULATOR_CHUNK_DELAY_MS": SLOW_CHUNK_DELAY_MS,
             "VOICE_SIMULATOR_LATENCY_MS": SLOW_LATENCY_MS},
        stdout=open(tmp / "slow-sim.log", "ab"), stderr=subprocess.STDOUT)
    try:
        wait_http_ready(f"http://127.0.0.1:{port}/health", timeout=WAIT_S, proc=model)
        with running_web_stack(kafka_bootstrap, tmp, f"http://127.0.0.1:{port}") as web:
            yield web
    finally:
        stop(model)


@pytest.fixture(scope="session")
def chromium() -> Iterator[Browser]:
    """One headless Chromium for the session, started by the first test that asks."""
    with chromium_browser() as driver:
        yield driver


@pytest.fixture(scope="session")
def firefox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Browser]:
    """One headless Firefox for the session, started by the first test that asks."""
    with firefox_browser(tmp_path_factory.mktemp("firefox")) as driver:
        yield driver


@pytest.fixture(params=BROWSERS)
def browser(request: pytest.FixtureRequest) -> Iterator[Browser]:
    """The session's browser of this run (each test runs in each, unless it is parametrized
    with ``indirect=True`` to fewer), signed out, its errors emptied; after the test, no
    errors in it."""
    driver: Browser = request.getfixturevalue(request.param)
    driver.set_window_size(1280, 900)
    driver.errors()
    yield driver
    errors = driver.errors()
    driver.get("about:blank")
    assert not errors, f"{driver.name} logged errors: {errors}"


def wait_for(check: Callable[[], Any], what: str, timeout: float = WAIT_S,
             page: Browser | Any | None = None) -> Any:
    """Poll ``check`` until it returns something truthy; fail naming ``what`` with the last
    exception or value (and, given the ``page``'s driver, what the page showed then)."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            value = check()
            if value:
                return value
            last = value
        except Exception as exc:  # a stale element while the page re-renders: look again
            last = exc
        time.sleep(0.2)
    shown = f"; the page showed: {page_text(page)}" if page is not None else ""
    raise AssertionError(f"{what}: not within {timeout}s (last: {last!r}){shown}")


def page_text(driver: Browser | Any) -> str:
    """What a page shows, and its stream's state (``data-*`` of ``stream-status``), for a
    failure's message."""
    try:
        status = driver.execute_script(
            "const s = document.querySelector('[data-testid=\"stream-status\"]');"
            "return s ? JSON.stringify(s.dataset) : 'no stream-status';")
        return f"stream {status}; text {driver.find_element(By.TAG_NAME, 'body').text[:3000]!r}"
    except Exception as exc:  # the page itself is gone: say so
        return f"(not readable: {exc!r})"


def by_testid(driver: Browser | Any, testid: str) -> Any:
    """The element (of the page, or under an element) with this ``data-testid``."""
    return driver.find_element(By.CSS_SELECTOR, f'[data-testid="{testid}"]')


def all_by_testid(driver: Browser | Any, testid: str) -> list[Any]:
    return list(driver.find_elements(By.CSS_SELECTOR, f'[data-testid="{testid}"]'))


def sign_in(driver: Browser, url: str, page: str, sub: str, role: str, tenant: str = "default"
            ) -> None:
    """Open ``page`` and sign in with the dev form as ``sub`` (``role`` in ``tenant``)."""
    driver.get(f"{url}{page}")
    driver.execute_script("sessionStorage.clear()")
    driver.get(f"{url}{page}")
    form = wait_for(lambda: all_by_testid(driver, "dev-signin"), "the dev sign-in form")[0]
    for field, value in (("dev-sub", sub), ("dev-tenant", tenant)):
        box = form.find_element(By.ID, field)
        box.clear()
        box.send_keys(value)
    # The role chosen as a person does: its option clicked in the list.
    form.find_element(By.CSS_SELECTOR, f'#dev-role option[value="{role}"]').click()
    by_testid(driver, "dev-signin-button").click()
    wait_for(lambda: by_testid(driver, "signed-in-as").text.startswith(sub),
             f"signed in as {sub}")


def screenshot(driver: Browser, name: str, width: int = 1280) -> Path:
    """Save the page at ``width`` px wide as ``test-artifacts/web/<name>.png`` (Chromium's;
    Firefox's as ``<name>-firefox.png``)."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(width, max(700, min(int(height) + 40, 2400)))
    suffix = "" if driver.name == "chromium" else f"-{driver.name}"
    path = ARTIFACTS / f"{name}{suffix}.png"
    driver.save_screenshot(path)
    return path


def fits_360(driver: Browser) -> bool:
    """Whether the page, 360 px wide, has nothing wider than the window (no sideways scroll)."""
    driver.set_window_size(360, 800)
    try:
        return bool(wait_for(lambda: driver.execute_script(
            "return window.innerWidth <= 360"
            " && document.documentElement.scrollWidth <= window.innerWidth"),
            "nothing wider than 360 px", timeout=10))
    finally:
        driver.set_window_size(1280, 900)


NETWORK_ERRORS = ("net::ERR_CONNECTION_REFUSED", "net::ERR_EMPTY_RESPONSE",
                  "net::ERR_CONNECTION_RESET", "net::ERR_INCOMPLETE_CHUNKED_ENCODING",
                  "Failed to fetch")
"""What Chromium logs while the edge is deliberately down — and nothing else is excused.
(Firefox logs nothing then: a failed ``fetch`` the page handles is not an error to it.)"""


def errors_besides_network(driver: Browser) -> list[str]:
    """The browser's errors logged since the last look, other than the network's own."""
    return [e for e in driver.errors() if not any(n in e for n in NETWORK_ERRORS)]


def token_of(driver: Browser) -> str:
    """The bearer the page keeps (to check the page against the API)."""
    return str(driver.execute_script("return sessionStorage.getItem('voice.token')"))
