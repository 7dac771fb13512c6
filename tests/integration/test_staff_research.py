"""Research runs end to end on a real broker, worker and edge; roles; a worker killed mid-step;
an operator's retry of a failed run."""

from __future__ import annotations

import pytest

from schemas.staff import InvestigationSuggested
from streams.settings import VoiceSettings
from streams.topics import ISSUES
from tests.integration.test_staff_helpers import (
    Api,
    envelopes,
    kill,
    kinds,
    slow_simulator,
    workflow_log,
)
from tests.support import step_running, stop, wait_for

pytestmark = pytest.mark.integration

EVIDENCE = ["Three streetlights on Elm Road are broken since March.",
            "The streetlights on Elm Road are not broken; they were repaired in April."]


def test_a_research_run_suggests_and_a_representative_opens_an_investigation(
    settings: VoiceSettings, start_worker, start_edge  # noqa: ANN001
) -> None:
    start_worker()
    api = Api(start_edge(), settings)
    issue = api.open_issue("Streetlights on Elm Road are broken", "Crime rose at night.",
                           EVIDENCE)
    staff_view = api.ok(api.get(f"/staff/issues/{issue}", "sam", "staff"))
    evidence_ids = [e["evidence"] for e in staff_view["evidence"]]
    assert len(evidence_ids) == 2 and all(e["added_by"] == "sam" for e in staff_view["evidence"])

    run = api.ok(api.post(f"/staff/issues/{issue}/research", "sam", "staff"), 202)["run"]
    done = api.until(f"/staff/research/{run}", "sam", "staff", lambda j: j["state"] != "Running",
                     what="the run to end")
    assert done["state"] == "Done", done
    s = done["suggestions"]
    assert s["sources"] and s["questions"] and s["investigations"]
    for section in s.values():
        for item in section:
            assert item["reason"] and set(item["read"]) == {issue, *evidence_ids}
    [inv] = s["investigations"]
    assert inv["state"] == "suggested" and inv["investigation"] == f"{run}:inv-1"

    # Labelled "suggested" everywhere until a representative opens it.
    listed = api.until(f"/staff/issues/{issue}", "sam", "staff",
                       lambda j: j["investigations"], what="the investigation on the issue")
    assert [i["state"] for i in listed["investigations"]] == ["suggested"]
    assert listed["research_runs"] == [{"run": run, "state": "Done"}]
    path = f"/staff/investigations/{inv['investigation']}/open"
    assert api.post(path, "sam", "staff").status_code == 403
    opened = api.ok(api.post(path, "rita", "representative"))
    assert opened["state"] == "open" and opened["opened_by"] == "rita"
    again = api.ok(api.get(f"/staff/research/{run}", "sam", "staff"))
    assert again["suggestions"]["investigations"][0]["state"] == "open"
    assert api.post("/staff/investigations/nope/open", "rita", "representative"
                    ).status_code == 404


def test_roles_are_checked(settings: VoiceSettings, start_worker, start_edge) -> None:  # noqa: ANN001
    start_worker()
    api = Api(start_edge(), settings)
    assert api.post("/staff/issues", "ann", "participant", {"title": "x"}).status_code == 403
    assert api.post("/staff/issues", "rev", "reviewer", {"title": "x"}).status_code == 403
    issue = api.open_issue("Bins are not emptied")
    for sub, role in [("ann", "participant"), ("rev", "reviewer"), ("op", "operator")]:
        assert api.post(f"/staff/issues/{issue}/research", sub, role).status_code == 403
        assert api.post(f"/staff/issues/{issue}/evidence", sub, role,
                        {"title": "t", "body": "b"}).status_code == 403
        assert api.post(f"/staff/issues/{issue}/developments", sub, role,
                        {"title": "t", "body": "b"}).status_code == 403
    assert api.get(f"/staff/issues/{issue}", "ann", "participant").status_code == 403
    assert api.get("/staff/reviews", "ann", "participant").status_code == 403
    assert api.post("/staff/workflows/x/retry", "sam", "staff").status_code == 403
    assert api.post("/staff/contributions/x/review", "sam", "staff",
                    {"decision": "approve"}).status_code == 403
    assert api.get("/staff/issues/iss-00000000", "sam", "staff").status_code == 404
    public = api.ok(api.get(f"/issues/{issue}", "ann", "participant"))
    assert public == {"issue": issue, "title": "Bins are not emptied", "summary": "",
                      "published_contributions": 0, "followers": 0}


def test_a_worker_killed_mid_research_is_resumed_and_suggests_once(
    settings: VoiceSettings, start_worker, start_edge, tmp_path  # noqa: ANN001
) -> None:
    with slow_simulator(tmp_path) as slow:
        first = start_worker(ANTHROPIC_BASE_URL=slow)
        api = Api(start_edge(), settings)
        issue = api.open_issue("Streetlights on Elm Road are broken", "", EVIDENCE)
        run = api.ok(api.post(f"/staff/issues/{issue}/research", "sam", "staff"), 202)["run"]
        wait_for(lambda: step_running(settings, run), timeout=30,
                 what="the research step to start")
        kill(first)
        start_worker(ANTHROPIC_BASE_URL=slow)
        done = api.until(f"/staff/research/{run}", "sam", "staff",
                         lambda j: j["state"] != "Running", timeout=120, what="the run to end")
    assert done["state"] == "Done"
    envs = workflow_log(settings, run)
    lost = [e.record for e in envs if type(e.record).__name__ == "StepFailed"]
    started = [e.id for e in envs if type(e.record).__name__ == "StepStarted"]
    # The new owner resumes the step one of two ways, depending on whether the killed worker's
    # table write reached its changelog: it finds the step running with no task holding it
    # (a WorkerLost attempt, then the next one), or it replays the run from its first record
    # (the same StepStarted again, same id, which readers dedupe). Either way the step ran again.
    assert (lost and lost[0].error_type == "WorkerLost") or len(started) > len(set(started)), \
        kinds(envs)
    assert kinds(envs).count("LastStepSucceeded") == 1
    suggested = [e for e in envelopes(settings, ISSUES, issue)
                 if isinstance(e.record, InvestigationSuggested)]
    assert [e.record.investigation for e in suggested] == [f"{run}:inv-1"]


def test_an_operator_retries_a_failed_run_from_its_step(
    settings: VoiceSettings, start_worker, start_edge  # noqa: ANN001
) -> None:
    failing = start_worker(VOICE_MODEL="sim-fail-500", VOICE_FALLBACK_MODELS="[]")
    api = Api(start_edge(), settings)
    issue = api.open_issue("Bus stop has no shelter", "", ["The stop on Hill Road has no roof."])
    run = api.ok(api.post(f"/staff/issues/{issue}/research", "sam", "staff"), 202)["run"]
    failed = api.until(f"/staff/research/{run}", "sam", "staff",
                       lambda j: j["state"] != "Running", what="the run to fail")
    assert failed["state"] == "Failed" and "failed" in failed["reason"]
    wf = api.ok(api.get(f"/staff/workflows/{run}", "op", "operator"))
    assert wf["status"] == "failed" and [r["type"] for r in wf["records"]].count(
        "voice.workflow.step_failed.v1") == 3
    assert api.post(f"/staff/workflows/{run}/retry", "sam", "staff").status_code == 403
    stop(failing)  # gracefully: it leaves the group at once
    start_worker()
    r1 = api.ok(api.post(f"/staff/workflows/{run}/retry", "op", "operator"), 202)
    done = api.until(f"/staff/research/{run}", "sam", "staff", lambda j: j["state"] == "Done",
                     timeout=90, what="the retried run")
    assert done["suggestions"]["sources"]
    log = kinds(workflow_log(settings, run))
    assert log.count("WorkflowResumed") == 1 and log[-1] == "LastStepSucceeded"
    assert r1["command_id"].startswith(f"{run}:retry:")
    assert api.post(f"/staff/workflows/{run}/retry", "op", "operator").status_code == 409
