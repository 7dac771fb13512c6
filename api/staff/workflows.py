"""Operators' view of workflows (``/staff/workflows``): the tenant's workflows (the failed ones,
to retry), a workflow's records as the log has them, and retrying a failed one from its
failed step."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query
from pydantic import BaseModel, JsonValue

from api.frame.commands import CommandsDep, refused
from api.frame.deps import known_or_404
from api.staff.deps import StaffViewsDep, WorkflowReadDep, WorkflowRetryDep
from schemas.workflow import WorkflowCommandReceived

router = APIRouter(prefix="/staff", tags=["staff"])


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


WorkflowStatus = Literal["running", "paused", "completed", "failed"]


class WorkflowSummary(BaseModel):
    workflow: str
    kind: str
    status: WorkflowStatus | str
    step: str | None
    last_error: str | None
    updated_at: str | None
    """When its last record was written (None if this edge keeps none of them)."""


class RetryAccepted(BaseModel):
    workflow: str
    command_id: str


@router.get("/workflows")
async def list_workflows(
    principal: WorkflowReadDep, views: StaffViewsDep,
    status: Annotated[WorkflowStatus | None, Query(description="Only workflows in this "
                                                               "status; all when omitted.")
                      ] = None,
    limit: Annotated[int, Query(ge=1, le=500, description="At most this many.")] = 100,
) -> list[WorkflowSummary]:
    """The tenant's workflows, the most recently changed first (``status=failed``: those an
    operator may retry)."""
    out = []
    for w in views.workflows.values():
        if w.tenant != principal.tenant or (status is not None and w.status != status):
            continue
        updated = w.records[-1].time.isoformat() if w.records else None
        out.append(WorkflowSummary(workflow=w.workflow, kind=w.kind, status=w.status,
                                   step=w.step, last_error=w.last_error, updated_at=updated))
    out.sort(key=lambda s: (s.updated_at or "", s.workflow), reverse=True)
    return out[:limit]


@router.get("/workflows/{workflow}", responses={404: {"description": "No such workflow."}})
async def get_workflow(workflow: str, principal: WorkflowReadDep, views: StaffViewsDep
                       ) -> WorkflowOut:
    """A workflow's records as the log has them (the last 1000), and where it stands."""
    w = await known_or_404(views.workflows, workflow, "workflow", principal.tenant)
    return WorkflowOut(
        workflow=w.workflow, kind=w.kind, status=w.status, step=w.step,
        waiting_for=w.waiting_for, last_error=w.last_error,
        records=[WorkflowRecordOut(id=e.id, seq=e.seq, type=e.type, time=e.time.isoformat(),
                                   record=e.record.model_dump(mode="json"))
                 for e in w.records])


@router.post("/workflows/{workflow}/retry", status_code=202,
             responses={404: {"description": "No such workflow."},
                        409: {"description": "The workflow refused the retry, and says why "
                                             "(it has not failed)."}})
async def retry_workflow(workflow: str, principal: WorkflowRetryDep, commands: CommandsDep,
                         views: StaffViewsDep) -> RetryAccepted:
    """Restart a failed workflow from its failed step (operators only); the answer is the
    workflow's decision: ``202`` when it restarted, ``409`` and why when it refused."""
    w = await known_or_404(views.workflows, workflow, "workflow", principal.tenant)
    command_id = f"{workflow}:retry:{w.last_seq}"
    # One retry per failure as this edge saw it: a repeated click is the same command,
    # answered again; a retry of a workflow no longer failed is refused by the workflow.
    ack = await commands.submit(workflow, WorkflowCommandReceived(
        workflow=workflow, command="retry", command_id=command_id, by=principal.sub))
    if ack.outcome == "rejected":
        raise refused(ack, f"workflow {workflow!r}")
    return RetryAccepted(workflow=workflow, command_id=command_id)
