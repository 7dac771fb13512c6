"""The staff page in a real browser: a flagged contribution in the review queue, its flagged
spans highlighted; a first reviewer approves it; the queue then shows it waiting for a second
review, and to the first reviewer the second-reviewer rule is shown with the decisions
disabled; a second reviewer approves and the contribution is published."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest

from schemas.workflow import WorkflowCommandReceived, WorkflowStarted
from streams.envelope import Envelope
from streams.tokens import mint_token
from streams.topics import WORKFLOWS
from tests.integration.test_staff_helpers import envelopes, produce
from tests.web.browsers import By
from tests.web.conftest import (
    WAIT_S,
    WebStack,
    all_by_testid,
    by_testid,
    fits_360,
    screenshot,
    sign_in,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.web]

FLAGGED = "I met Jane Porter at jane@example.org; the lights on Elm Road are broken."


def call(stack: WebStack, sub: str, role: str, method: str, path: str, **kw: Any) -> Any:
    token = mint_token(stack.settings, sub, role, "default", ttl_s=900)
    r = httpx.request(method, f"{stack.url}{path}", timeout=30,
                      headers={"Authorization": f"Bearer {token}"}, **kw)
    assert r.is_success, f"{method} {path}: {r.status_code} {r.text}"
    return r.json() if r.content else None


def workflow_commands(stack: WebStack, workflow: str) -> list[Envelope]:
    """The commands on ``workflow``'s log (an operator's retry, …)."""
    return [e for e in envelopes(stack.settings, WORKFLOWS, workflow)
            if isinstance(e.record, WorkflowCommandReceived)]


def queue_item(driver: Any, contribution: str, waiting_for: str) -> Any:
    """The queue's entry for ``contribution`` once it waits for ``waiting_for``."""
    def found() -> Any:
        for li in by_testid(driver, "review-queue").find_elements(By.CSS_SELECTOR, "li"):
            if (li.get_attribute("data-contribution") == contribution
                    and li.get_attribute("data-waiting-for") == waiting_for):
                return li
        return None
    return wait_for(found, f"{contribution} in the queue waiting for {waiting_for}")


def open_in_queue(driver: Any, contribution: str, waiting_for: str) -> Any:
    wait_for(lambda: queue_item(driver, contribution, waiting_for).find_element(
        By.TAG_NAME, "button").click() or True, f"{contribution} opened")
    return wait_for(lambda: by_testid(driver, "review").get_attribute("data-contribution")
                    == contribution and by_testid(driver, "review"), "the review panel")


def test_two_reviewers_publish_a_flagged_contribution(stack: WebStack, browser: Any) -> None:
    issue = call(stack, "staff-web", "staff", "POST", "/staff/issues",
                 json={"title": "Streetlights on Elm Road"})["issue"]
    contribution = call(stack, "ann-web", "participant", "POST",
                        f"/me/issues/{issue}/contributions", json={"text": FLAGGED}
                        )["contribution"]

    sign_in(browser, stack.url, "/staff", "rev1-web", "reviewer")
    open_in_queue(browser, contribution, "review")
    flags = [m.text for m in all_by_testid(browser, "flag")]
    assert flags and all(span in FLAGGED for span in flags)
    assert any("jane@example.org" in span for span in flags), flags
    by_testid(browser, "approve").click()
    assert "review (approve)" in wait_for(lambda: by_testid(browser, "review-done").text,
                                          "the first review recorded")

    # The first reviewer sees it wait for a second review, and cannot give it.
    open_in_queue(browser, contribution, "second_review")
    assert by_testid(browser, "second-reviewer-rule").is_displayed()
    assert not by_testid(browser, "approve").is_enabled()
    screenshot(browser, "staff-review")
    assert fits_360(browser)

    sign_in(browser, stack.url, "/staff", "rev2-web", "reviewer")
    open_in_queue(browser, contribution, "second_review")
    assert not all_by_testid(browser, "second-reviewer-rule")
    by_testid(browser, "approve").click()
    assert "second review (approve)" in wait_for(
        lambda: by_testid(browser, "review-done").text, "the second review recorded")

    def published() -> Any:
        return [c for c in call(stack, "ann-web", "participant", "GET",
                                f"/issues/{issue}/contributions")
                if c["contribution"] == contribution]
    (out,) = wait_for(published, "the contribution published", timeout=WAIT_S)
    assert "Elm Road" in out["text"]
    wait_for(lambda: contribution not in by_testid(browser, "review-queue").text,
             "the contribution gone from the queue")


def test_staff_list_issues_and_operators_list_failed_workflows(stack: WebStack, browser: Any
                                                               ) -> None:
    """No id to type: staff see the tenant's issues newest first and open one from the list;
    an operator sees the tenant's failed workflows, opens one and retries it."""
    older, newer = (call(stack, "staff-web", "staff", "POST", "/staff/issues",
                         json={"title": title})["issue"]
                    for title in ("Graffiti on the library", "Flooding under the rail bridge"))
    # A research run whose input lacks its issue: its one step fails every attempt.
    workflow = f"run-{uuid.uuid4().hex[:16]}"
    started = WorkflowStarted(workflow=workflow, kind="research",
                              input={"run": workflow, "requested_by": "staff-web",
                                     "tenant": "default"})
    produce(stack.settings, WORKFLOWS, Envelope(
        record=started, key=workflow, source="/test/web", subject=workflow, tenant="default",
        seq=1, correlation=workflow, id=f"{workflow}:1"))

    sign_in(browser, stack.url, "/staff", "sue-web", "staff")

    def listed() -> list[str]:
        return [li.get_attribute("data-issue") for li in by_testid(browser, "issue-list")
                .find_elements(By.CSS_SELECTOR, "li[data-issue]")]
    order = wait_for(lambda: newer in listed() and listed(), "the new issues listed")
    assert order.index(newer) < order.index(older)  # newest first
    by_testid(browser, "issue-list").find_element(
        By.CSS_SELECTOR, f'li[data-issue="{older}"] button').click()
    wait_for(lambda: by_testid(browser, "issue").get_attribute("data-issue") == older
             and "Graffiti on the library" in by_testid(browser, "issue").text,
             "the issue opened from the list")
    screenshot(browser, "staff-issues")
    assert fits_360(browser)

    sign_in(browser, stack.url, "/staff", "otto-web", "operator")

    def open_failed_item() -> bool:
        # Found and clicked in one step: the list may render again (a refresh answered late)
        # between finding the item and clicking it, and then the click is simply retried.
        browser.find_element(By.ID, "refresh-failed").click()
        items = by_testid(browser, "failed-workflows").find_elements(
            By.CSS_SELECTOR, f'li[data-workflow="{workflow}"]')
        if len(items) != 1:
            return False
        items[0].find_element(By.TAG_NAME, "button").click()
        return True
    wait_for(open_failed_item, "the broken run among the failed workflows, opened")
    panel = wait_for(lambda: by_testid(browser, "workflow").is_displayed()
                     and by_testid(browser, "workflow"), "the failed workflow opened")
    assert panel.find_element(By.CSS_SELECTOR, "[data-status]").text == "failed"
    screenshot(browser, "staff-operator")
    assert fits_360(browser)
    panel.find_element(By.XPATH, ".//button[text()='Retry from the failed step']").click()
    wait_for(lambda: any(c.record.command == "retry" for c in workflow_commands(stack, workflow)),
             "the retry on the workflow's log")
    assert not browser.find_element(By.ID, "workflow-error").is_displayed()


RECORD_FETCHES = """
window.voiceMarker = "not reloaded";
window.voiceFetches = [];
const original = window.fetch;
window.fetch = (url, options) => {
  window.voiceFetches.push(`${(options && options.method) || "GET"} ${url}`);
  return original(url, options);
};
"""


def test_the_queue_is_live_without_polling_or_reloading(stack: WebStack, browser: Any) -> None:
    """A reviewer's open page shows a new contribution enter the queue, then wait for its
    second review, from the queue's stream: the page neither reloads nor asks
    ``GET /staff/reviews`` again (it read the queue once, then follows the stream, which the
    edge's short gateway bound cuts every few seconds and the page resumes after its cursor)."""
    issue = call(stack, "staff-web", "staff", "POST", "/staff/issues",
                 json={"title": "Potholes on Mill Lane"})["issue"]
    sign_in(browser, stack.url, "/staff", "rev3-web", "reviewer")
    wait_for(lambda: by_testid(browser, "queue-status").get_attribute("data-state") == "live",
             "the queue's stream live")
    browser.execute_script(RECORD_FETCHES)
    contribution = call(stack, "ann-web", "participant", "POST",
                        f"/me/issues/{issue}/contributions", json={"text": FLAGGED}
                        )["contribution"]
    queue_item(browser, contribution, "review")
    call(stack, "rev4-web", "reviewer", "POST", f"/staff/contributions/{contribution}/review",
         json={"decision": "approve"})
    queue_item(browser, contribution, "second_review")
    status = by_testid(browser, "queue-status")
    # Two more cuts of the stream: longer than the old 3 s poll, twice over.
    reconnects = int(status.get_attribute("data-reconnects"))
    wait_for(lambda: int(status.get_attribute("data-reconnects")) >= reconnects + 2,
             "the stream cut and resumed twice")
    assert browser.execute_script("return window.voiceMarker") == "not reloaded"
    fetches = browser.execute_script("return window.voiceFetches")
    assert fetches, "the page made no request at all while it followed the queue"
    assert all(f.startswith("GET /staff/reviews/stream?after=") for f in fetches), fetches
    cursors = [int(f.rsplit("=", 1)[1]) for f in fetches]
    assert cursors == sorted(cursors) and cursors[-1] >= 2, cursors  # resumed, never rewound
    assert int(status.get_attribute("data-cursor")) >= cursors[-1]
