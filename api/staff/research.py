"""Research runs and investigations (``/staff``): start a run over an issue, read it, open
an investigation it suggested.

A run is a workflow: the route produces its first record (202 with the run's id, whose state
``GET /staff/research/{run}`` reads) and the engine runs it; the read comes from this edge's
view of ``voice.workflows``. Its input names the issue's evidence by a span of the issue's log.
"""

from __future__ import annotations

import secrets
from typing import Literal

from fastapi import APIRouter, HTTPException
from pydantic import BaseModel

from api.frame.commands import CommandsDep, refused
from api.frame.deadline import remaining
from api.frame.deps import VIEW_WAIT_S, known, known_or_404
from api.staff.deps import NOT_FOUND, InvestigateDep, IssuesManageDep, IssuesReadDep, StaffViewsDep
from api.staff.views import InvestigationView, WorkflowView
from schemas.staff import OpenInvestigation
from schemas.workflow import WorkflowStarted

router = APIRouter(prefix="/staff", tags=["staff"])

class RunAccepted(BaseModel):
    """``202``: read the run at ``GET /staff/research/{run}``."""

    run: str


class RunSummary(BaseModel):
    run: str
    state: Literal["Running", "Done", "Failed"]


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


def run_state(view: WorkflowView) -> Literal["Running", "Done", "Failed"]:
    return {"completed": "Done", "failed": "Failed"}.get(view.status, "Running")  # type: ignore[return-value]


def investigation_out(inv: InvestigationView) -> InvestigationOut:
    return InvestigationOut.model_validate(inv, from_attributes=True)


@router.post("/issues/{issue}/research", status_code=202, responses=NOT_FOUND)
async def start_research(issue: str, principal: IssuesManageDep, commands: CommandsDep,
                         views: StaffViewsDep) -> RunAccepted:
    """Start a research run over the issue and its evidence as this edge sees them now."""
    v = await known_or_404(views.issues, issue, "issue", principal.tenant)
    run = f"run-{secrets.token_hex(8)}"
    # The evidence by reference — the issue's log up to the seq this edge has read — never a
    # copy: the input is one record (and a changelog value, and every edge's), however much
    # evidence the issue has. The step reads the span back.
    started = WorkflowStarted(workflow=run, kind="research", input={
        "run": run, "issue": {"issue": v.issue, "title": v.title, "summary": v.summary},
        "evidence": {"partition": v.partition, "opened": v.opened or 0, "through": v.last_seq},
        "requested_by": principal.sub, "tenant": principal.tenant})
    await commands.start_workflow(started)
    return RunAccepted(run=run)


@router.get("/research/{run}", responses={404: {"description": "No such research run."}})
async def get_research(run: str, principal: IssuesReadDep, views: StaffViewsDep) -> ResearchOut:
    """``Running`` | ``Done`` (with suggestions) | ``Failed`` (with the reason)."""
    await known(views.workflows, run)
    w = views.workflows.in_tenant(run, principal.tenant)
    if w is None or w.kind != "research":
        raise HTTPException(404, f"no research run {run!r}")
    state = run_state(w)
    out = ResearchOut(run=run, issue=(w.input.get("issue") or {}).get("issue", ""), state=state,
                      # The failure's code (its message, which may quote a model, is not kept
                      # plain: docs/security.md, "Free text outside the seal").
                      reason=f"the run failed: {w.last_error}" if state == "Failed" else None)
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
async def open_investigation(investigation: str, principal: InvestigateDep,
                             commands: CommandsDep, views: StaffViewsDep) -> InvestigationOut:
    """A representative opens a suggested investigation (``suggested`` → ``open``)."""
    inv = await known_or_404(views.investigations, investigation, "investigation", principal.tenant)
    ack = await commands.submit(inv.issue, OpenInvestigation(
        issue=inv.issue, investigation=investigation, by=principal.sub))
    if ack.outcome == "rejected":
        raise refused(ack, f"investigation {investigation!r}")
    await views.investigations.wait(investigation, lambda _v: inv.state == "open",
                                    remaining(VIEW_WAIT_S))
    out = investigation_out(inv)
    return out.model_copy(update={"state": "open", "opened_by": inv.opened_by or principal.sub})
