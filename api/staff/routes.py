"""Staff routes (``/staff``): issues and evidence, research runs, investigations, developments,
disclosure reviews, and operators' view of workflows.

Every route answers at once: a command acknowledged by its writer, a workflow started on the
log (202 with an id to read later), or this edge's view of the log. None calls a model.
Roles come from the JWT: staff for staff routes, a representative to open an investigation,
an operator to retry a workflow, a reviewer to review; anyone else gets 403.
"""

from __future__ import annotations

import secrets
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Header, HTTPException, Request
from pydantic import BaseModel, ConfigDict, Field, JsonValue, model_validator

from api.auth import Principal
from api.commands import submit
from api.deps import VIEW_WAIT_S, ProducerDep, SealerDep, SettingsDep, TailDep, require_role
from api.staff_views import InvestigationView, StaffViews, WorkflowView
from schemas.staff import AddEvidence, OpenInvestigation, OpenIssue, RecordDevelopment
from schemas.system import CommandAcknowledged
from schemas.workflow import WorkflowCommandReceived, WorkflowStarted
from streams.envelope import Envelope
from streams.producer import ProduceError
from streams.topics import WORKFLOWS, topic_name

router = APIRouter(prefix="/staff", tags=["staff"])

MAX_EVIDENCE_IN_RUN = 200
"""Evidence a research run's input carries (the most recent); the input is one record."""


async def get_staff_views(request: Request) -> StaffViews:
    return request.app.state.staff


StaffViewsDep = Annotated[StaffViews, Depends(get_staff_views)]
StaffDep = Annotated[Principal, Depends(require_role("staff"))]
StaffReadDep = Annotated[Principal, Depends(require_role("staff", "representative"))]
RepresentativeDep = Annotated[Principal, Depends(require_role("representative"))]
OperatorDep = Annotated[Principal, Depends(require_role("operator"))]
WorkflowReadDep = Annotated[Principal, Depends(require_role("staff", "operator"))]
NOT_FOUND = {404: {"description": "No such issue."}}


# --- bodies ----------------------------------------------------------------------------------


class IssueIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    title: str = Field(min_length=1, max_length=200)
    summary: str = Field("", max_length=4000)


class EvidenceIn(BaseModel):
    """A source: a title and its text, its URL, or both."""

    model_config = ConfigDict(extra="forbid")

    title: str = Field(min_length=1, max_length=300)
    body: str | None = Field(None, max_length=16_000)
    url: str | None = Field(None, max_length=2000, pattern=r"^https?://\S+$")

    @model_validator(mode="after")
    def _body_or_url(self) -> EvidenceIn:
        if not (self.body or "").strip() and not self.url:
            raise ValueError("evidence needs a body, a url, or both")
        return self


class DevelopmentIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    title: str = Field(min_length=1, max_length=200)
    body: str = Field(min_length=1, max_length=16_000)


class IssueCreated(BaseModel):
    issue: str


class EvidenceCreated(BaseModel):
    issue: str
    evidence: str


class RunAccepted(BaseModel):
    """``202``: read the run at ``GET /staff/research/{run}``."""

    run: str


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


class InvestigationOut(BaseModel):
    investigation: str
    issue: str
    run: str
    title: str
    reason: str
    read: list[str]
    state: Literal["suggested", "open"]
    """``suggested`` until a representative opens it."""
    opened_by: str | None = None


class DevelopmentOut(BaseModel):
    development: str
    title: str
    body: str
    by: str
    at: str
    delivery: Literal["waiting", "delivering", "delivered", "failed"]


class RunSummary(BaseModel):
    run: str
    state: Literal["Running", "Done", "Failed"]


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


class SuggestionOut(BaseModel):
    title: str
    reason: str
    read: list[str]
    """Ids of the records the agent read for this suggestion."""
    investigation: str | None = None
    state: Literal["suggested", "open"] | None = None
    """For investigations: ``suggested`` until a representative opens it."""


class SuggestionsOut(BaseModel):
    sources: list[SuggestionOut]
    questions: list[SuggestionOut]
    investigations: list[SuggestionOut]


class ResearchOut(BaseModel):
    run: str
    issue: str
    state: Literal["Running", "Done", "Failed"]
    reason: str | None = None
    suggestions: SuggestionsOut | None = None


class WorkflowRecordOut(BaseModel):
    id: str
    seq: int | None
    type: str
    time: str
    record: dict[str, JsonValue]


class WorkflowOut(BaseModel):
    workflow: str
    kind: str
    status: Literal["running", "paused", "completed", "failed"] | str
    step: str | None
    waiting_for: str | None
    last_error: str | None
    records: list[WorkflowRecordOut]


class RetryAccepted(BaseModel):
    workflow: str
    command_id: str


# --- helpers ---------------------------------------------------------------------------------


def refused(ack: CommandAcknowledged, what: str) -> HTTPException:
    """The HTTP error of a command its writer refused (404 for an unknown aggregate)."""
    reason = str(ack.detail.get("reason") or "refused")
    return HTTPException(404 if reason.startswith("no such") else 409, f"{what}: {reason}")


async def known_issue(issue: str, views: StaffViews) -> Any:
    """The issue's view, waiting briefly for this edge to catch up; 404 when unknown."""
    await views.wait(f"issue:{issue}", lambda: issue in views.issues, VIEW_WAIT_S)
    view = views.issues.get(issue)
    if view is None:
        raise HTTPException(404, f"no issue {issue!r}")
    return view


def run_state(view: WorkflowView) -> Literal["Running", "Done", "Failed"]:
    return {"completed": "Done", "failed": "Failed"}.get(view.status, "Running")  # type: ignore[return-value]


def investigation_out(inv: InvestigationView) -> InvestigationOut:
    return InvestigationOut(investigation=inv.investigation, issue=inv.issue, run=inv.run,
                            title=inv.title, reason=inv.reason, read=inv.read,
                            state=inv.state, opened_by=inv.opened_by)  # type: ignore[arg-type]


def _delivery(views: StaffViews, issue: Any, development: str) -> str:
    ended = issue.ended.get(development)
    if ended is not None:
        return "delivered" if ended.status == "completed" else "failed"
    return "delivering" if development in views.workflows else "waiting"


# --- issues and evidence ---------------------------------------------------------------------


@router.post("/issues", status_code=201)
async def open_issue(body: IssueIn, principal: StaffDep, settings: SettingsDep,
                     producer: ProducerDep, tail: TailDep, views: StaffViewsDep) -> IssueCreated:
    """Open an issue."""
    issue = f"iss-{secrets.token_hex(8)}"
    ack = await submit(settings, producer, tail, principal, issue,
                       OpenIssue(issue=issue, title=body.title, summary=body.summary,
                                 by=principal.sub))
    if ack.outcome == "rejected":
        raise refused(ack, f"issue {issue!r}")
    await views.wait(f"issue:{issue}", lambda: issue in views.issues, VIEW_WAIT_S)
    return IssueCreated(issue=issue)


@router.get("/issues/{issue}", responses=NOT_FOUND)
async def get_issue(issue: str, _p: StaffReadDep, views: StaffViewsDep) -> StaffIssueOut:
    """The issue as staff see it: evidence, followers, developments, investigations, runs."""
    v = await known_issue(issue, views)
    counts = {"in_review": 0, "published": 0, "rejected": 0}
    for c in views.contributions_of(issue):
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
                       for w in views.runs_of(issue)],
        contributions=counts)


@router.post("/issues/{issue}/evidence", status_code=201, responses=NOT_FOUND)
async def add_evidence(issue: str, body: EvidenceIn, principal: StaffDep, settings: SettingsDep,
                       producer: ProducerDep, tail: TailDep, views: StaffViewsDep
                       ) -> EvidenceCreated:
    """Add a source to the issue's evidence (``added_by`` is the caller)."""
    await known_issue(issue, views)
    evidence = f"evd-{secrets.token_hex(8)}"
    ack = await submit(settings, producer, tail, principal, issue, AddEvidence(
        issue=issue, evidence=evidence, title=body.title, body=body.body, url=body.url,
        added_by=principal.sub))
    if ack.outcome == "rejected":
        raise refused(ack, f"issue {issue!r}")
    # Read-your-writes: a research run started next on this edge must see it.
    await views.wait(f"issue:{issue}", lambda: evidence in views.issues[issue].evidence,
                     VIEW_WAIT_S)
    return EvidenceCreated(issue=issue, evidence=evidence)


# --- research and investigations -------------------------------------------------------------


@router.post("/issues/{issue}/research", status_code=202, responses=NOT_FOUND)
async def start_research(issue: str, principal: StaffDep, settings: SettingsDep,
                         producer: ProducerDep, views: StaffViewsDep) -> RunAccepted:
    """Start a research run over the issue and its evidence as this edge sees them now."""
    v = await known_issue(issue, views)
    run = f"run-{secrets.token_hex(8)}"
    evidence = [{"evidence": e.evidence, "title": e.title, "body": e.body, "url": e.url,
                 "added_by": e.added_by, "at": e.at}
                for e in list(v.evidence.values())[-MAX_EVIDENCE_IN_RUN:]]
    started = WorkflowStarted(workflow=run, kind="research", input={
        "run": run, "issue": {"issue": v.issue, "title": v.title, "summary": v.summary},
        "evidence": evidence, "requested_by": principal.sub, "tenant": principal.tenant})
    await start_workflow(settings, producer, principal, run, started)
    return RunAccepted(run=run)


async def start_workflow(settings: Any, producer: Any, principal: Principal, workflow: str,
                 started: WorkflowStarted) -> None:
    """Produce a workflow's first record (seq 1, id ``{workflow}:1``): the engine takes it."""
    env = Envelope(record=started, key=workflow, source="/voice/edge", subject=workflow, seq=1,
                   tenant=principal.tenant, correlation=workflow, id=f"{workflow}:1")
    try:
        await producer.send(topic_name(settings, WORKFLOWS), env)
    except ProduceError as exc:
        raise HTTPException(503, f"could not start {workflow!r}: {exc}") from None


@router.get("/research/{run}", responses={404: {"description": "No such research run."}})
async def get_research(run: str, _p: StaffReadDep, views: StaffViewsDep) -> ResearchOut:
    """``Running`` | ``Done`` (with suggestions) | ``Failed`` (with the reason)."""
    await views.wait(f"wf:{run}", lambda: run in views.workflows, VIEW_WAIT_S)
    w = views.workflows.get(run)
    if w is None or w.kind != "research":
        raise HTTPException(404, f"no research run {run!r}")
    state = run_state(w)
    out = ResearchOut(run=run, issue=(w.input.get("issue") or {}).get("issue", ""), state=state,
                      reason=w.last_error if state == "Failed" else None)
    found = (w.outputs.get("research") or {}).get("suggestions")
    if state == "Done" and found:
        def items(section: str) -> list[SuggestionOut]:
            out = []
            for s in found.get(section) or []:
                inv = views.investigations.get(s.get("investigation") or "")
                out.append(SuggestionOut(
                    title=s["title"], reason=s["reason"], read=s["read"],
                    investigation=s.get("investigation"),
                    state=(inv.state if inv else "suggested") if s.get("investigation")
                    else None))  # type: ignore[arg-type]
            return out

        out.suggestions = SuggestionsOut(sources=items("sources"), questions=items("questions"),
                                         investigations=items("investigations"))
    return out


@router.post("/investigations/{investigation}/open",
             responses={404: {"description": "No such investigation."}})
async def open_investigation(investigation: str, principal: RepresentativeDep,
                             settings: SettingsDep, producer: ProducerDep, tail: TailDep,
                             views: StaffViewsDep) -> InvestigationOut:
    """A representative opens a suggested investigation (``suggested`` → ``open``)."""
    await views.wait(f"inv:{investigation}", lambda: investigation in views.investigations,
                     VIEW_WAIT_S)
    inv = views.investigations.get(investigation)
    if inv is None:
        raise HTTPException(404, f"no investigation {investigation!r}")
    ack = await submit(settings, producer, tail, principal, inv.issue, OpenInvestigation(
        issue=inv.issue, investigation=investigation, by=principal.sub))
    if ack.outcome == "rejected":
        raise refused(ack, f"investigation {investigation!r}")
    await views.wait(f"inv:{investigation}", lambda: inv.state == "open", VIEW_WAIT_S)
    out = investigation_out(inv)
    return out.model_copy(update={"state": "open", "opened_by": inv.opened_by or principal.sub})


# --- developments ----------------------------------------------------------------------------


@router.post("/issues/{issue}/developments", status_code=202, responses=NOT_FOUND)
async def record_development(issue: str, body: DevelopmentIn, principal: StaffDep,
                             settings: SettingsDep, producer: ProducerDep, tail: TailDep,
                             views: StaffViewsDep) -> DevelopmentAccepted:
    """Record a development; its followers get the update by a workflow, in order."""
    await known_issue(issue, views)
    ack = await submit(settings, producer, tail, principal, issue, RecordDevelopment(
        issue=issue, title=body.title, body=body.body, by=principal.sub))
    if ack.outcome == "rejected":
        raise refused(ack, f"issue {issue!r}")
    return DevelopmentAccepted(development=str(ack.detail["development"]))


# --- workflows (operators) -------------------------------------------------------------------


async def known_workflow(workflow: str, views: StaffViews) -> WorkflowView:
    """The workflow's view, waiting briefly for this edge to catch up; 404 when unknown."""
    await views.wait(f"wf:{workflow}", lambda: workflow in views.workflows, VIEW_WAIT_S)
    w = views.workflows.get(workflow)
    if w is None:
        raise HTTPException(404, f"no workflow {workflow!r}")
    return w


@router.get("/workflows/{workflow}", responses={404: {"description": "No such workflow."}})
async def get_workflow(workflow: str, _p: WorkflowReadDep, views: StaffViewsDep) -> WorkflowOut:
    """A workflow's records as the log has them (the last 1000), and where it stands."""
    w = await known_workflow(workflow, views)
    return WorkflowOut(
        workflow=w.workflow, kind=w.kind, status=w.status, step=w.step,
        waiting_for=w.waiting_for, last_error=w.last_error,
        records=[WorkflowRecordOut(id=e.id, seq=e.seq, type=e.type, time=e.time.isoformat(),
                                   record=e.record.model_dump(mode="json"))
                 for e in w.records])


@router.post("/workflows/{workflow}/retry", status_code=202,
             responses={404: {"description": "No such workflow."},
                        409: {"description": "The workflow has not failed."}})
async def retry_workflow(workflow: str, principal: OperatorDep, settings: SettingsDep,
                         producer: ProducerDep, tail: TailDep, views: StaffViewsDep
                         ) -> RetryAccepted:
    """Restart a failed workflow from its failed step (operators only)."""
    w = await known_workflow(workflow, views)
    if w.status != "failed":
        raise HTTPException(409, f"workflow {workflow!r} is {w.status}, not failed; only a "
                                 "failed workflow can be retried")
    command_id = f"{workflow}:retry:{w.last_seq}"
    # One retry per failure: the id names the failure, so a repeated click resumes once.
    await submit(settings, producer, tail, principal, workflow, WorkflowCommandReceived(
        workflow=workflow, command="retry", command_id=command_id, by=principal.sub))
    return RetryAccepted(workflow=workflow, command_id=command_id)


# --- disclosure reviews ----------------------------------------------------------------------

ReviewerDep = Annotated[Principal, Depends(require_role("reviewer"))]
ReviewReadDep = Annotated[Principal, Depends(require_role("reviewer", "staff"))]
ReviewState = Literal["checking", "waiting", "published", "rejected", "failed"]
NO_CONTRIBUTION = {404: {"description": "No such contribution."}}


class RedactionIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    start: int = Field(ge=0)
    end: int = Field(gt=0)
    kind: str | None = Field(None, max_length=40)

    @model_validator(mode="after")
    def _ordered(self) -> RedactionIn:
        if self.end <= self.start:
            raise ValueError(f"end ({self.end}) must be after start ({self.start})")
        return self


class ReviewIn(BaseModel):
    """``redact`` without spans redacts every flagged span; with spans, those."""

    model_config = ConfigDict(extra="forbid")

    decision: Literal["approve", "reject", "redact"]
    redactions: list[RedactionIn] = Field(default_factory=list, max_length=500)

    @model_validator(mode="after")
    def _spans_only_to_redact(self) -> ReviewIn:
        if self.redactions and self.decision != "redact":
            raise ValueError(f"redactions go with decision 'redact', not {self.decision!r}")
        return self


class ReviewAccepted(BaseModel):
    """``202``: the review is on the workflow's log; publication happens in the workflow."""

    contribution: str
    command: Literal["review", "second_review"]
    command_id: str


class FlagOut(BaseModel):
    start: int
    end: int
    kind: str
    source: Literal["detector", "agent"]
    reason: str
    text: str
    """The flagged span of the contribution."""


class ReviewerOut(BaseModel):
    by: str
    decision: Literal["approve", "reject", "redact"]
    redactions: int


class ReviewItem(BaseModel):
    contribution: str
    issue: str
    state: ReviewState
    waiting_for: Literal["review", "second_review"] | None = None
    flag_count: int | None
    flag_kinds: list[str]
    reviews: list[ReviewerOut]
    submitted_at: str


class ContributionForReview(ReviewItem):
    author: str
    text: str
    flags: list[FlagOut] | None
    published_text: str | None


def review_state(views: StaffViews, contribution: str) -> tuple[ReviewState, str | None]:
    c = views.contributions[contribution]
    if c.state != "in_review":
        return c.state, None  # type: ignore[return-value]
    w = views.workflows.get(contribution)
    if w is not None and w.status == "paused":
        return "waiting", w.waiting_for
    if w is not None and w.status == "failed":
        return "failed", None
    return "checking", None


def review_item(views: StaffViews, contribution: str) -> ReviewItem:
    c = views.contributions[contribution]
    state, waiting_for = review_state(views, contribution)
    return ReviewItem(contribution=contribution, issue=c.issue, state=state,
                      waiting_for=waiting_for, flag_count=c.flag_count,  # type: ignore[arg-type]
                      flag_kinds=c.flag_kinds, submitted_at=c.submitted_at,
                      reviews=[ReviewerOut(**r.model_dump()) for r in c.reviews])


async def known_contribution(contribution: str, views: StaffViews) -> None:
    """Waits briefly for this edge to see the contribution; 404 when unknown."""
    await views.wait(f"ctb:{contribution}", lambda: contribution in views.contributions,
                     VIEW_WAIT_S)
    if contribution not in views.contributions:
        raise HTTPException(404, f"no contribution {contribution!r}")


@router.get("/reviews")
async def review_queue(_p: ReviewReadDep, views: StaffViewsDep,
                       state: ReviewState | Literal["all"] = "waiting") -> list[ReviewItem]:
    """Contributions by review state, oldest first (``waiting``: a reviewer is needed)."""
    items = [review_item(views, c) for c in views.contributions]
    return sorted((i for i in items if state == "all" or i.state == state),
                  key=lambda i: i.submitted_at)


@router.get("/contributions/{contribution}", responses=NO_CONTRIBUTION)
async def get_contribution(contribution: str, _p: ReviewReadDep, views: StaffViewsDep,
                           sealer: SealerDep) -> ContributionForReview:
    """A contribution as its reviewers see it: the text, the flags and the reviews so far."""
    await known_contribution(contribution, views)
    c = views.contributions[contribution]
    text = sealer.open_text(contribution, "text", c.text)
    flags = None
    if c.flags is not None:
        opened = sealer.open_json(contribution, "flags", c.flags)["flags"]
        flags = [FlagOut(**f, text=text[f["start"]:f["end"]]) for f in opened]
    published = (sealer.open_text(contribution, "published", c.published_text)
                 if c.published_text is not None else None)
    return ContributionForReview(**review_item(views, contribution).model_dump(),
                                 author=c.author, text=text, flags=flags,
                                 published_text=published)


@router.post("/contributions/{contribution}/review", status_code=202,
             responses={**NO_CONTRIBUTION,
                        409: {"description": "Not waiting for a review, or the second review "
                                             "came from the first reviewer."}})
async def review_contribution(
    contribution: str, body: ReviewIn, principal: ReviewerDep, settings: SettingsDep,
    producer: ProducerDep, tail: TailDep, views: StaffViewsDep,
    idempotency_key: Annotated[str | None, Header(
        alias="Idempotency-Key", min_length=1, max_length=200,
        description="Repeating a review with the same key applies it once.")] = None,
) -> ReviewAccepted:
    """Answer a paused disclosure review; the workflow publishes or rejects."""
    await known_contribution(contribution, views)
    w = views.workflows.get(contribution)
    key = idempotency_key or secrets.token_hex(8)
    command_id = f"{contribution}:review:{principal.sub}:{key}"

    def earlier() -> WorkflowCommandReceived | None:
        w = views.workflows.get(contribution)
        return next((c for c in w.commands if c.command_id == command_id), None) if w else None

    def waits() -> bool:
        return (w is not None and w.status == "paused"
                and w.waiting_for in ("review", "second_review"))

    if idempotency_key and not waits():
        # Perhaps a repeat whose first request this edge has not read back yet.
        await views.wait(f"wf:{contribution}", lambda: earlier() is not None, VIEW_WAIT_S)
    if (first_time := earlier()) is not None:  # a repeated request: the first answer again
        return ReviewAccepted(contribution=contribution, command=first_time.command,  # type: ignore[arg-type]
                              command_id=command_id)
    if w is None or not waits():
        state, _ = review_state(views, contribution)
        raise HTTPException(409, f"contribution {contribution!r} is not waiting for a review "
                                 f"(it is {state})")
    waiting_for = w.waiting_for
    first = (w.outputs.get("review") or {}).get("by")
    if waiting_for == "second_review" and first == principal.sub:
        raise HTTPException(409, f"reviewer {principal.sub!r} gave the first review of "
                                 f"{contribution!r}; the second review must come from a "
                                 "different reviewer")
    await submit(settings, producer, tail, principal, contribution, WorkflowCommandReceived(
        workflow=contribution, command=waiting_for, command_id=command_id, by=principal.sub,
        payload={"decision": body.decision,
                 "redactions": [r.model_dump(exclude_none=True) for r in body.redactions]}))
    # Read-your-writes: the worker forwarded the command before acknowledging it.
    await views.wait(f"wf:{contribution}", lambda: earlier() is not None, VIEW_WAIT_S)
    return ReviewAccepted(contribution=contribution, command=waiting_for,  # type: ignore[arg-type]
                          command_id=command_id)
