"""The listings the pages need instead of typed ids (issue 15), on a real broker, worker and
edge: ``GET /me/issues`` (the issues the caller follows, right after following),
``GET /staff/issues`` (the tenant's, newest first, a page at a time) and
``GET /staff/workflows?status=failed`` (what an operator may retry) — each tenant-scoped."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest

from schemas.workflow import WorkflowStarted
from streams.envelope import Envelope
from streams.settings import VoiceSettings
from streams.tokens import mint_token
from streams.topics import WORKFLOWS
from tests.integration.test_staff_helpers import Api, produce

pytestmark = pytest.mark.integration

OTHER = "elsewhere"
"""Another tenant: nothing of it is ever listed to the default tenant's callers, nor back."""


def as_(api: Api, sub: str, role: str, tenant: str = "default") -> dict[str, str]:
    return {"Authorization": f"Bearer {mint_token(api.settings, sub, role, tenant)}"}


def get(api: Api, path: str, headers: dict[str, str], **params: Any) -> Any:
    r = httpx.get(f"{api.url}{path}", params=params, headers=headers, timeout=15)
    assert r.status_code == 200, (path, r.status_code, r.text)
    return r.json()


def test_followed_issues_are_listed_at_once_and_only_to_their_follower(
        settings: VoiceSettings, start_worker, start_edge  # noqa: ANN001
) -> None:
    start_worker()
    api = Api(start_edge(), settings)
    first, second, unfollowed = (api.open_issue(t) for t in (
        "Potholes on Mill Lane", "Bus 12 skips Elm Road", "Noise from the depot"))
    for issue in (first, second, unfollowed):
        api.ok(api.post(f"/me/issues/{issue}/follow", "pat", "participant"))
    # No wait: the follow answers once this edge's view shows it (read-your-writes).
    listed = get(api, "/me/issues", as_(api, "pat", "participant"))
    assert [i["issue"] for i in listed] == [unfollowed, second, first]  # newest first
    assert listed[1]["title"] == "Bus 12 skips Elm Road"

    api.ok(api.delete(f"/me/issues/{unfollowed}/follow", "pat", "participant"))
    assert [i["issue"] for i in get(api, "/me/issues", as_(api, "pat", "participant"))] == [
        second, first]
    # Someone else follows nothing; the same sub in another tenant follows nothing there.
    assert get(api, "/me/issues", as_(api, "quinn", "participant")) == []
    assert get(api, "/me/issues", as_(api, "pat", "participant", OTHER)) == []


def test_staff_list_the_tenants_issues_newest_first_a_page_at_a_time(
        settings: VoiceSettings, start_worker, start_edge  # noqa: ANN001
) -> None:
    start_worker()
    api = Api(start_edge(), settings)
    opened = [api.open_issue(f"Issue {n}") for n in range(5)]
    theirs = httpx.post(f"{api.url}/staff/issues", json={"title": "Not yours"},
                        headers=as_(api, "sam", "staff", OTHER), timeout=15)
    assert theirs.status_code == 201, theirs.text
    staff = as_(api, "sam", "staff")

    pages, before = [], None
    while True:
        page = get(api, "/staff/issues", staff, limit=2,
                   **({"before": before} if before else {}))
        pages.append([i["issue"] for i in page["issues"]])
        before = page["next"]
        if before is None:
            break
    assert pages == [opened[4:2:-1], opened[2:0:-1], opened[0:1]]  # newest first, each once
    assert get(api, "/staff/issues", staff)["issues"][0]["title"] == "Issue 4"
    assert [i["issue"] for i in get(api, "/staff/issues", as_(api, "sam", "staff", OTHER)
                                    )["issues"]] == [theirs.json()["issue"]]

    bad = httpx.get(f"{api.url}/staff/issues", params={"before": "no-cursor"}, headers=staff,
                    timeout=15)
    assert bad.status_code == 422 and "before" in bad.text


def test_operators_list_failed_workflows_of_their_tenant(
        settings: VoiceSettings, start_worker, start_edge  # noqa: ANN001
) -> None:
    start_worker()
    api = Api(start_edge(), settings)
    # A research run whose input lacks its issue: its one step fails every attempt.
    workflow = f"run-{uuid.uuid4().hex[:16]}"
    started = WorkflowStarted(workflow=workflow, kind="research",
                              input={"run": workflow, "requested_by": "sam", "tenant": "default"})
    produce(settings, WORKFLOWS, Envelope(record=started, key=workflow, source="/test",
                                          subject=workflow, tenant="default", seq=1,
                                          correlation=workflow, id=f"{workflow}:1"))
    operator = as_(api, "olga", "operator")
    failed = api.until("/staff/workflows", "olga", "operator",
                       lambda j: any(w["workflow"] == workflow for w in j), status="failed",
                       what="the broken run listed as failed", timeout=120)
    mine = next(w for w in failed if w["workflow"] == workflow)
    assert mine["kind"] == "research" and mine["status"] == "failed" and mine["last_error"]
    assert all(w["status"] == "failed" for w in failed)
    assert workflow not in {w["workflow"] for w in get(api, "/staff/workflows", operator,
                                                       status="completed")}
    assert workflow in {w["workflow"] for w in get(api, "/staff/workflows", operator)}
    assert get(api, "/staff/workflows", as_(api, "olga", "operator", OTHER),
               status="failed") == []
    bad = httpx.get(f"{api.url}/staff/workflows", params={"status": "broken"}, headers=operator,
                    timeout=15)
    assert bad.status_code == 422 and "status" in bad.text
