"""Issues as staff see them (``/staff/issues``): list them, open one, read it, add evidence,
record a development (its followers get the update by a workflow, in order)."""

from __future__ import annotations

import secrets
from typing import Annotated, Literal

from fastapi import APIRouter, Query
from pydantic import BaseModel, Field, model_validator

from api.frame.commands import CommandsDep, refused
from api.frame.deadline import remaining
from api.frame.deps import VIEW_WAIT_S, known, known_or_404
from api.frame.models import RequestModel
from api.staff.deps import NOT_FOUND, IssuesManageDep, IssuesReadDep, StaffViewsDep
from api.staff.research import InvestigationOut, RunSummary, investigation_out, run_state
from api.staff.views import IssueView, StaffViews
from schemas.staff import AddEvidence, OpenIssue, RecordDevelopment

router = APIRouter(prefix="/staff", tags=["staff"])


class IssueIn(RequestModel):
    title: str = Field(min_length=1, max_length=200)
    summary: str = Field("", max_length=4000)


class EvidenceIn(RequestModel):
    """A source: a title and its text, its URL, or both."""

    title: str = Field(min_length=1, max_length=300)
    body: str | None = Field(None, max_length=16_000)
    url: str | None = Field(None, max_length=2000, pattern=r"^https?://\S+$")

    @model_validator(mode="after")
    def _body_or_url(self) -> EvidenceIn:
        if not (self.body or "").strip() and not self.url:
            raise ValueError("evidence needs a body, a url, or both")
        return self


class DevelopmentIn(RequestModel):
    title: str = Field(min_length=1, max_length=200)
    body: str = Field(min_length=1, max_length=16_000)


class IssueCreated(BaseModel):
    issue: str


class EvidenceCreated(BaseModel):
    issue: str
    evidence: str


class DevelopmentAccepted(BaseModel):
    """``202``: the development is recorded; its update is delivered by a workflow."""

    development: str


class EvidenceOut(BaseModel):
    evidence: str
    title: str
    body: str | None
    url: str | None
    added_by: str
    at: str


class DevelopmentOut(BaseModel):
    development: str
    title: str
    body: str
    by: str
    at: str
    delivery: Literal["waiting", "delivering", "delivered", "failed"]


class StaffIssueOut(BaseModel):
    issue: str
    title: str
    summary: str
    created_by: str
    at: str
    evidence: list[EvidenceOut]
    followers: int
    developments: list[DevelopmentOut]
    investigations: list[InvestigationOut]
    research_runs: list[RunSummary]
    contributions: dict[str, int]
    """Contributions by state: ``in_review``, ``published``, ``rejected``."""


class IssueSummary(BaseModel):
    issue: str
    title: str
    summary: str
    created_by: str
    at: str
    followers: int


class IssuePage(BaseModel):
    """A page of the tenant's issues, newest first; ``next`` is the ``before`` of the next
    page (None on the last)."""

    issues: list[IssueSummary]
    next: str | None


ISSUE_CURSOR = r"^[^~]{1,64}~[^~]{1,64}$"
"""A page cursor: ``<opened at>~<issue>`` of the last issue of the previous page."""


def _delivery(views: StaffViews, issue: IssueView, development: str) -> str:
    ended = issue.ended.get(development)
    if ended is not None:
        return "delivered" if ended.status == "completed" else "failed"
    return "delivering" if development in views.workflows else "waiting"


@router.post("/issues", status_code=201)
async def open_issue(body: IssueIn, principal: IssuesManageDep, commands: CommandsDep,
                     views: StaffViewsDep) -> IssueCreated:
    """Open an issue."""
    issue = f"iss-{secrets.token_hex(8)}"
    ack = await commands.submit(issue, OpenIssue(issue=issue, title=body.title,
                                                 summary=body.summary, by=principal.sub))
    if ack.outcome == "rejected":
        raise refused(ack, f"issue {issue!r}")
    await known(views.issues, issue)
    return IssueCreated(issue=issue)


@router.get("/issues")
async def list_issues(
    principal: IssuesReadDep, views: StaffViewsDep,
    limit: Annotated[int, Query(ge=1, le=200, description="Issues per page.")] = 50,
    before: Annotated[str | None, Query(pattern=ISSUE_CURSOR, max_length=129,
                                        description="The ``next`` of the previous page.")
                      ] = None,
) -> IssuePage:
    """The tenant's issues, newest first (by when they were opened), a page at a time."""
    ordered = sorted(((v.at, v.issue, v) for v in views.issues.values()
                      if v.tenant == principal.tenant), key=lambda t: (t[0], t[1]), reverse=True)
    if before is not None:
        at, _, issue = before.partition("~")
        ordered = [t for t in ordered if (t[0], t[1]) < (at, issue)]
    page = ordered[:limit]
    more = len(ordered) > limit
    return IssuePage(
        issues=[IssueSummary(issue=v.issue, title=v.title, summary=v.summary, created_by=v.by,
                             at=v.at, followers=len(v.followers)) for _a, _i, v in page],
        next=f"{page[-1][0]}~{page[-1][1]}" if more and page else None)


@router.get("/issues/{issue}", responses=NOT_FOUND)
async def get_issue(issue: str, principal: IssuesReadDep, views: StaffViewsDep) -> StaffIssueOut:
    """The issue as staff see it: evidence, followers, developments, investigations, runs."""
    v = await known_or_404(views.issues, issue, "issue", principal.tenant)
    counts = {"in_review": 0, "published": 0, "rejected": 0}
    for c in views.contributions_of(v):
        counts[c.state] += 1
    return StaffIssueOut(
        issue=v.issue, title=v.title, summary=v.summary, created_by=v.by, at=v.at,
        evidence=[EvidenceOut(evidence=e.evidence, title=e.title, body=e.body, url=e.url,
                              added_by=e.added_by, at=e.at) for e in v.evidence.values()],
        followers=len(v.followers),
        developments=[DevelopmentOut(development=d.development, title=d.title, body=d.body,
                                     by=d.by, at=d.at,
                                     delivery=_delivery(views, v, d.development))  # type: ignore[arg-type]
                      for d in v.developments.values()],
        investigations=[investigation_out(i) for i in v.investigations.values()],
        research_runs=[RunSummary(run=w.workflow, state=run_state(w))
                       for w in views.runs_of(v)],
        contributions=counts)


@router.post("/issues/{issue}/evidence", status_code=201, responses=NOT_FOUND)
async def add_evidence(issue: str, body: EvidenceIn, principal: IssuesManageDep,
                       commands: CommandsDep, views: StaffViewsDep) -> EvidenceCreated:
    """Add a source to the issue's evidence (``added_by`` is the caller)."""
    await known_or_404(views.issues, issue, "issue", principal.tenant)
    evidence = f"evd-{secrets.token_hex(8)}"
    ack = await commands.submit(issue, AddEvidence(
        issue=issue, evidence=evidence, title=body.title, body=body.body, url=body.url,
        added_by=principal.sub))
    if ack.outcome == "rejected":
        raise refused(ack, f"issue {issue!r}")
    # Read-your-writes: a research run started next on this edge must see it.
    await views.issues.wait(issue, lambda v: v is not None and evidence in v.evidence,
                            remaining(VIEW_WAIT_S))
    return EvidenceCreated(issue=issue, evidence=evidence)


@router.post("/issues/{issue}/developments", status_code=202, responses=NOT_FOUND)
async def record_development(issue: str, body: DevelopmentIn, principal: IssuesManageDep,
                             commands: CommandsDep, views: StaffViewsDep
                             ) -> DevelopmentAccepted:
    """Record a development; its followers get the update by a workflow, in order."""
    await known_or_404(views.issues, issue, "issue", principal.tenant)
    ack = await commands.submit(issue, RecordDevelopment(
        issue=issue, title=body.title, body=body.body, by=principal.sub))
    if ack.outcome == "rejected":
        raise refused(ack, f"issue {issue!r}")
    return DevelopmentAccepted(development=str(ack.detail["development"]))
