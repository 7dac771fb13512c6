"""Staff workflow commands answer from the workflow's decision (issue 12 §6), on a real broker,
worker and edge: a double click, a reviewer arriving while the workflow is between two states,
hostile bursts — each request learns what the workflow did with it, and the workflow resumes
exactly as often as it answered ``202``."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from streams.settings import VoiceSettings
from tests.integration.test_staff_helpers import Api, kinds, workflow_log
from tests.integration.test_staff_review import (
    FLAGGED,
    PLAIN,
    contribute,
    published,
    review,
    waiting,
)
from tests.support import wait_for

pytestmark = pytest.mark.integration


def at_once(*calls) -> list[httpx.Response]:  # noqa: ANN002
    """Run the calls concurrently (each its own HTTP request); their responses in order."""
    with ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(lambda call: call(), calls))


def keyed(api: Api, c: str, reviewer: str, decision: str, key: str):  # noqa: ANN201
    return lambda: api.post(f"/staff/contributions/{c}/review", reviewer, "reviewer",
                            {"decision": decision}, **{"Idempotency-Key": key})


def test_a_double_click_is_one_review_and_the_other_is_told_why(
    settings: VoiceSettings, start_worker, start_edge  # noqa: ANN001
) -> None:
    start_worker()
    api = Api(start_edge(), settings)
    issue = api.open_issue("Streetlights on Elm Road are broken")
    flagged, plain, same = (contribute(api, issue, FLAGGED), contribute(api, issue, PLAIN),
                            contribute(api, issue, PLAIN))
    for c in (flagged, plain, same):
        waiting(api, c, "review")

    # Two clicks with two idempotency keys (a client that makes one per click).
    a, b = at_once(keyed(api, flagged, "rev1", "approve", "k1"),
                   keyed(api, flagged, "rev1", "approve", "k2"))
    assert sorted([a.status_code, b.status_code]) == [202, 409], (a.text, b.text)
    refused = a if a.status_code == 409 else b
    assert "second review must come from a different reviewer" in refused.json()["detail"]

    a, b = at_once(keyed(api, plain, "rev1", "approve", "k1"),
                   keyed(api, plain, "rev1", "approve", "k2"))
    assert sorted([a.status_code, b.status_code]) == [202, 409], (a.text, b.text)
    refused = a if a.status_code == 409 else b
    assert "not waiting" in refused.json()["detail"]

    # Two clicks without a key: the same review twice is one command, answered twice alike.
    a, b = at_once(lambda: review(api, same, "rev1", "approve"),
                   lambda: review(api, same, "rev1", "approve"))
    assert a.status_code == b.status_code == 202 and a.json() == b.json(), (a.text, b.text)

    published(api, issue, 2)
    for c in (flagged, plain, same):
        assert kinds(workflow_log(settings, c)).count("WorkflowResumed") == 1, c


def test_a_second_reviewer_while_the_workflow_is_between_states_is_decided(
    settings: VoiceSettings, start_worker, start_edge  # noqa: ANN001
) -> None:
    # The first review's step takes 1.5 s: the second reviewer comes while it runs.
    start_worker(VOICE_STAFF_STEP_DELAY_MS="review=1500")
    api = Api(start_edge(), settings)
    issue = api.open_issue("Streetlights on Elm Road are broken")
    c = contribute(api, issue, FLAGGED)
    waiting(api, c, "review")
    assert api.ok(review(api, c, "rev1", "approve"), 202)["command"] == "review"
    state = api.ok(api.get(f"/staff/contributions/{c}", "rev2", "reviewer"))["state"]
    assert state == "checking", "the workflow should be between its two reviews now"
    second = api.ok(review(api, c, "rev2", "redact"), 202)
    assert second["command"] == "second_review"
    [out] = published(api, issue)
    assert out["text"] == ("I met [redacted: person_name] at [redacted: email]; the lights on "
                           "Elm Road are broken.")


def test_hostile_bursts_get_one_decision_each_and_resume_the_workflow_once_per_202(
    settings: VoiceSettings, start_worker, start_edge  # noqa: ANN001
) -> None:
    start_worker()
    api = Api(start_edge(), settings)
    issue = api.open_issue("Streetlights on Elm Road are broken")
    c, again = contribute(api, issue, FLAGGED), contribute(api, issue, PLAIN)
    waiting(api, c, "review")
    waiting(api, again, "review")

    # Twenty reviewers, twenty different reviews, at once.
    burst = at_once(*(keyed(api, c, f"rev{n}", "approve", f"k{n}") for n in range(20)))
    codes = [r.status_code for r in burst]
    assert set(codes) <= {202, 409, 503}, [(r.status_code, r.text) for r in burst]
    taken = [r.json()["command"] for r in burst if r.status_code == 202]
    assert sorted(taken) == ["review", "second_review"], [r.text for r in burst]
    assert all("Retry-After" in r.headers for r in burst if r.status_code == 503)
    [out] = published(api, issue)
    assert out["contribution"] == c
    log = kinds(workflow_log(settings, c))
    assert log.count("WorkflowResumed") == 2 and log.count("LastStepSucceeded") == 1

    # The same review with the same key, twenty times at once: one command, one answer.
    burst = at_once(*(keyed(api, again, "rev1", "approve", "same") for _ in range(20)))
    assert {r.status_code for r in burst} == {202}, [r.text for r in burst]
    assert len({r.text for r in burst}) == 1
    published(api, issue, 2)
    wait_for(lambda: kinds(workflow_log(settings, again)).count("LastStepSucceeded") == 1,
             what="the second contribution's workflow to complete")
    assert kinds(workflow_log(settings, again)).count("WorkflowResumed") == 1
