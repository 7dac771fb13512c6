"""Disclosure reviews (``/staff/reviews``, ``/staff/contributions``): the queue, a
contribution as its reviewers see it, and a review, which answers the paused workflow."""

from __future__ import annotations

import secrets
from typing import Annotated, Literal

from fastapi import APIRouter, Header, HTTPException
from pydantic import BaseModel, Field, model_validator

from api.frame.commands import CommandsDep
from api.frame.deadline import remaining
from api.frame.deps import VIEW_WAIT_S, SealerDep, known_or_404
from api.frame.models import MAX_STRING_CHARS, HeaderText, RequestModel
from api.staff.deps import ReviewDecideDep, ReviewReadDep, StaffViewsDep
from api.staff.views import StaffViews
from schemas.workflow import WorkflowCommandReceived

router = APIRouter(prefix="/staff", tags=["staff"])

ReviewState = Literal["checking", "waiting", "published", "rejected", "failed"]
NO_CONTRIBUTION = {404: {"description": "No such contribution."}}


class RedactionIn(RequestModel):
    start: int = Field(ge=0, le=MAX_STRING_CHARS)
    end: int = Field(gt=0, le=MAX_STRING_CHARS)
    kind: str | None = Field(None, max_length=40)

    @model_validator(mode="after")
    def _ordered(self) -> RedactionIn:
        if self.end <= self.start:
            raise ValueError(f"end ({self.end}) must be after start ({self.start})")
        return self


class ReviewIn(RequestModel):
    """``redact`` without spans redacts every flagged span; with spans, those."""

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


@router.get("/reviews")
async def review_queue(principal: ReviewReadDep, views: StaffViewsDep,
                       state: ReviewState | Literal["all"] = "waiting") -> list[ReviewItem]:
    """Contributions by review state, oldest first (``waiting``: a reviewer is needed)."""
    items = [review_item(views, c) for c in views.contributions
             if views.contributions.tenant_of(c) == principal.tenant]
    return sorted((i for i in items if state == "all" or i.state == state),
                  key=lambda i: i.submitted_at)


@router.get("/contributions/{contribution}", responses=NO_CONTRIBUTION)
async def get_contribution(contribution: str, principal: ReviewReadDep, views: StaffViewsDep,
                           sealer: SealerDep) -> ContributionForReview:
    """A contribution as its reviewers see it: the text, the flags and the reviews so far."""
    c = await known_or_404(views.contributions, contribution, "contribution", principal.tenant)
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
    contribution: str, body: ReviewIn, principal: ReviewDecideDep, commands: CommandsDep,
    views: StaffViewsDep,
    idempotency_key: Annotated[HeaderText | None, Header(
        alias="Idempotency-Key", min_length=1, max_length=200,
        description="Repeating a review with the same key applies it once.")] = None,
) -> ReviewAccepted:
    """Answer a paused disclosure review; the workflow publishes or rejects."""
    await known_or_404(views.contributions, contribution, "contribution", principal.tenant)
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
        await views.workflows.wait(contribution, lambda _w: earlier() is not None,
                                   remaining(VIEW_WAIT_S))
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
    await commands.submit(contribution, WorkflowCommandReceived(
        workflow=contribution, command=waiting_for, command_id=command_id, by=principal.sub,
        payload={"decision": body.decision,
                 "redactions": [r.model_dump(exclude_none=True) for r in body.redactions]}))
    # Read-your-writes: the worker forwarded the command before acknowledging it.
    await views.workflows.wait(contribution, lambda _w: earlier() is not None,
                                   remaining(VIEW_WAIT_S))
    return ReviewAccepted(contribution=contribution, command=waiting_for,  # type: ignore[arg-type]
                          command_id=command_id)
