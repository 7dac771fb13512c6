"""Disclosure reviews end to end on a real broker, worker and edge: flags, one or two
reviewers, publication with redactions, duplicate commands, crashes mid-step."""

from __future__ import annotations

from collections import Counter

import pytest

from schemas.workflow import WorkflowCommandReceived, step_success
from streams.settings import VoiceSettings
from streams.topics import (
    ACKS,
    AGENT,
    COMMANDS,
    CONTRIBUTIONS,
    REVIEW_QUEUE,
    TELEMETRY,
    WORKFLOWS,
    topic_name,
)
from tests.integration.test_staff_helpers import (
    Api,
    command,
    envelopes,
    kill,
    kinds,
    slow_simulator,
    workflow_log,
)
from tests.support import read_all, step_running, wait_for

pytestmark = pytest.mark.integration

FLAGGED = "I met Jane Porter at jane@example.org; the lights on Elm Road are broken."
PLAIN = "The lights on the corner of the road have been broken since March."


def contribute(api: Api, issue: str, text: str, sub: str = "ann") -> str:
    return api.ok(api.post(f"/me/issues/{issue}/contributions", sub, "participant",
                           {"text": text}), 202)["contribution"]


def waiting(api: Api, contribution: str, waiting_for: str, timeout: float = 60) -> dict:
    def check(items: list[dict]) -> bool:
        return any(i["contribution"] == contribution and i["waiting_for"] == waiting_for
                   for i in items)
    items = api.until("/staff/reviews", "rev1", "reviewer", check, timeout=timeout,
                      what=f"{contribution} waiting for {waiting_for}", state="waiting")
    return next(i for i in items if i["contribution"] == contribution)


def review(api: Api, contribution: str, reviewer: str, decision: str, **body: object):  # noqa: ANN201
    return api.post(f"/staff/contributions/{contribution}/review", reviewer, "reviewer",
                    {"decision": decision, **body})


def published(api: Api, issue: str, n: int = 1, timeout: float = 60) -> list[dict]:
    return api.until(f"/issues/{issue}/contributions", "ann", "participant",
                     lambda j: len(j) >= n, timeout=timeout, what=f"{n} published")


def test_a_flagged_contribution_needs_two_different_reviewers_and_is_published_redacted(
    settings: VoiceSettings, start_worker, start_edge  # noqa: ANN001
) -> None:
    start_worker()
    api = Api(start_edge(), settings)
    issue = api.open_issue("Streetlights on Elm Road are broken")
    assert api.post(f"/me/issues/{issue}/contributions", "sam", "staff",
                    {"text": "x"}).status_code == 403
    c = contribute(api, issue, FLAGGED)
    item = waiting(api, c, "review")
    assert item["flag_count"] == 2 and item["flag_kinds"] == ["email", "person_name"]
    seen = api.ok(api.get(f"/staff/contributions/{c}", "rev1", "reviewer"))
    assert seen["text"] == FLAGGED and seen["author"] == "ann"
    assert sorted((f["source"], f["text"]) for f in seen["flags"]) == [
        ("agent", "Jane Porter"), ("detector", "jane@example.org")]
    assert api.get(f"/staff/contributions/{c}", "ann", "participant").status_code == 403

    first = api.ok(review(api, c, "rev1", "approve"), 202)
    assert first["command"] == "review"
    waiting(api, c, "second_review")
    # The same review again is the same command (answered again); another one from the
    # first reviewer is refused by the workflow, which says why.
    assert api.ok(review(api, c, "rev1", "approve"), 202) == first
    same = review(api, c, "rev1", "reject")
    assert same.status_code == 409 and "different reviewer" in same.json()["detail"]
    wf = api.ok(api.get(f"/staff/workflows/{c}", "sam", "staff"))
    assert (wf["status"], wf["waiting_for"]) == ("paused", "second_review")
    assert api.get(f"/issues/{issue}/contributions", "ann", "participant").json() == []

    assert api.ok(review(api, c, "rev2", "redact"), 202)["command"] == "second_review"
    [out] = published(api, issue)
    assert out["contribution"] == c
    assert out["text"] == ("I met [redacted: person_name] at [redacted: email]; the lights on "
                           "Elm Road are broken.")
    public = api.ok(api.get(f"/issues/{issue}", "bob", "participant"))
    assert public["published_contributions"] == 1 and "author" not in str(public)
    done = api.ok(api.get("/staff/reviews", "sam", "staff", state="published"))
    assert [(r["contribution"], [x["by"] for x in r["reviews"]]) for r in done] == [
        (c, ["rev1", "rev2"])]
    # The participant's words never travel in the clear.
    for spec in (COMMANDS, WORKFLOWS, CONTRIBUTIONS, AGENT, TELEMETRY):
        for m in read_all(settings, topic_name(settings, spec)):
            blob = (m.value() or b"") + b"".join(v or b"" for _, v in m.headers() or [])
            assert b"Jane" not in blob and b"jane@example" not in blob, spec.name


def test_one_review_when_nothing_is_flagged_and_a_rejection_is_never_published(
    settings: VoiceSettings, start_worker, start_edge  # noqa: ANN001
) -> None:
    start_worker()
    api = Api(start_edge(), settings)
    issue = api.open_issue("Streetlights on Elm Road are broken")
    kept, dropped = contribute(api, issue, PLAIN), contribute(api, issue, "It is all wrong.")
    assert waiting(api, kept, "review")["flag_count"] == 0
    waiting(api, dropped, "review")
    api.ok(review(api, kept, "rev1", "approve"), 202)
    api.ok(review(api, dropped, "rev1", "reject"), 202)
    [out] = published(api, issue)
    assert (out["contribution"], out["text"]) == (kept, PLAIN)
    rejected = api.until("/staff/reviews", "sam", "staff", lambda j: len(j) == 1,
                         state="rejected", what="the rejection")
    assert rejected[0]["contribution"] == dropped
    late = review(api, dropped, "rev2", "approve")
    assert late.status_code == 409 and "not waiting" in late.json()["detail"]
    assert api.get(f"/issues/{issue}/contributions", "ann", "participant").json() == [out]
    assert review(api, "ctb-00000000", "rev1", "approve").status_code == 404
    bad = review(api, kept, "rev1", "approve", redactions=[{"start": 0, "end": 3}])
    assert bad.status_code == 422


def test_duplicate_review_commands_resume_once(
    settings: VoiceSettings, start_worker, start_edge  # noqa: ANN001
) -> None:
    start_worker()
    api = Api(start_edge(), settings)
    issue = api.open_issue("Streetlights on Elm Road are broken")
    c = contribute(api, issue, PLAIN)
    waiting(api, c, "review")
    first = api.ok(api.post(f"/staff/contributions/{c}/review", "rev1", "reviewer",
                            {"decision": "approve"}, **{"Idempotency-Key": "k1"}), 202)
    again = api.ok(api.post(f"/staff/contributions/{c}/review", "rev1", "reviewer",
                            {"decision": "approve"}, **{"Idempotency-Key": "k1"}), 202)
    assert first == again
    # The same command, redelivered twice more straight onto the log.
    dup = WorkflowCommandReceived(workflow=c, command="review", command_id=first["command_id"],
                                  by="rev1", payload={"decision": "approve"})
    command(settings, dup, c, "dup-1")
    command(settings, dup, c, "dup-2")
    published(api, issue)
    wait_for(lambda: sum(isinstance(e.record, WorkflowCommandReceived)
                         for e in workflow_log(settings, c)) >= 3, what="the duplicates")
    log = kinds(workflow_log(settings, c))
    assert log.count("WorkflowResumed") == 1 and log.count("LastStepSucceeded") == 1
    steps = [done.step for done in (step_success(e.record) for e in workflow_log(settings, c))
             if done is not None]
    assert steps == ["flag", "review", "second_review", "publish"]


def test_the_first_reviewer_cannot_be_the_second_even_past_the_edge(
    settings: VoiceSettings, start_worker, start_edge  # noqa: ANN001
) -> None:
    start_worker()
    api = Api(start_edge(), settings)
    issue = api.open_issue("Streetlights on Elm Road are broken")
    c = contribute(api, issue, FLAGGED)
    waiting(api, c, "review")
    api.ok(review(api, c, "rev1", "approve"), 202)
    waiting(api, c, "second_review")
    command(settings, WorkflowCommandReceived(workflow=c, command="second_review",
                                              command_id="raced", by="rev1",
                                              payload={"decision": "approve"}), c, "raced")
    # The workflow refuses it, says why, and stays where it was.
    [answer] = wait_for(lambda: [e.record for e in envelopes(settings, ACKS, "raced")] or None,
                        what="the workflow's answer")
    assert answer.outcome == "rejected" and "different reviewer" in answer.detail["reason"]
    assert kinds(workflow_log(settings, c)).count("WorkflowPaused") == 2
    wf = api.ok(api.get(f"/staff/workflows/{c}", "sam", "staff"))
    assert (wf["status"], wf["waiting_for"]) == ("paused", "second_review")
    api.ok(review(api, c, "rev2", "approve"), 202)
    [out] = published(api, issue)
    assert out["text"] == FLAGGED  # both approved as written


def test_a_worker_killed_mid_flagging_and_mid_publishing_publishes_once(
    settings: VoiceSettings, start_worker, start_edge, tmp_path  # noqa: ANN001
) -> None:
    with slow_simulator(tmp_path) as slow:
        env = {"ANTHROPIC_BASE_URL": slow,
               "VOICE_STAFF_STEP_DELAY_MS": "flag=12000,publish=12000"}
        first = start_worker(**env)
        api = Api(start_edge(), settings)
        issue = api.open_issue("Streetlights on Elm Road are broken")
        c = contribute(api, issue, PLAIN)
        wait_for(lambda: step_running(settings, c), timeout=30,
                 what="the flag step to start")
        kill(first)
        second = start_worker(**env)
        waiting(api, c, "review", timeout=120)
        api.ok(review(api, c, "rev1", "approve"), 202)
        wait_for(lambda: any(type(e.record).__name__ == "StepStarted" and e.record.step ==
                             "publish" for e in workflow_log(settings, c)),
                 timeout=30, what="the publish step to start")
        kill(second)
        start_worker(**env)
        [out] = published(api, issue, timeout=120)
    assert out["text"] == PLAIN
    envs = workflow_log(settings, c)
    lost = {r.step for r in (e.record for e in envs)
            if type(r).__name__ == "StepFailed" and r.error_type == "WorkerLost"}
    starts = Counter(e.id for e in envs if type(e.record).__name__ == "StepStarted")
    for step in ("flag", "publish"):
        # The next owner resumes a step one of two ways, depending on whether the killed
        # worker's table write reached its changelog: a WorkerLost attempt, or the replay of
        # the lease record (for a later step the same StepStarted again, same id; a first step
        # starts with WorkflowStarted and writes no record of its own: that it ran again shows
        # in the workflow going on, below). Either way it ran again.
        replayed = step == "flag" or any(
            n > 1 and any(e.id == i and e.record.step == step for e in envs)
            for i, n in starts.items())
        assert step in lost or replayed, (step, kinds(envs))
    assert kinds(envs).count("LastStepSucceeded") == 1
    # The tenant's review queue noted each event once, under dense seqs, across both kills.
    assert [(e.seq, e.id) for e in envelopes(settings, REVIEW_QUEUE)] == [
        (1, f"{c}:entered"), (2, f"{c}:reviewed:1"), (3, f"{c}:published")]
