"""Disclosure reviews (``/staff/reviews``, ``/staff/contributions``): the queue, a
contribution as its reviewers see it, and a review, which answers the paused workflow."""

from __future__ import annotations

import hashlib
import json
from typing import Annotated, Literal

from fastapi import APIRouter, Header
from pydantic import BaseModel, Field, model_validator

from api.frame.commands import CommandsDep, refused
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
    """``202``: the workflow took the review (as its first or second); publication happens
    in the workflow."""

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
                        409: {"description": "The workflow refused the review, and says why: "
                                             "the contribution is not waiting for a review "
                                             "(any more), or the second review came from the "
                                             "first reviewer."}})
async def review_contribution(
    contribution: str, body: ReviewIn, principal: ReviewDecideDep, commands: CommandsDep,
    views: StaffViewsDep,
    idempotency_key: Annotated[HeaderText | None, Header(
        alias="Idempotency-Key", min_length=1, max_length=200,
        description="Repeating a review with the same key applies it once. Without one, "
                    "the same reviewer sending the same review again is the same command "
                    "(a double click answers the first answer again).")] = None,
) -> ReviewAccepted:
    """Review a contribution: the workflow decides (a review while it is between two states
    waits for the next one) and the answer is its decision — ``202`` when it took the review,
    ``409`` with its reason when it refused it."""
    # Even for a contribution already published the workflow answers: a repeated review
    # gets its first answer again, any other is refused with the reason.
    await known_or_404(views.contributions, contribution, "contribution", principal.tenant)
    payload = {"decision": body.decision,
               "redactions": [r.model_dump(exclude_none=True) for r in body.redactions]}
    key = idempotency_key or _digest(payload)
    command_id = f"{contribution}:review:{principal.sub}:{key}"
    ack = await commands.submit(contribution, WorkflowCommandReceived(
        workflow=contribution, command="review", command_id=command_id, by=principal.sub,
        payload=payload))
    if ack.outcome == "rejected":
        raise refused(ack, f"contribution {contribution!r}")
    # Read-your-writes: the workflow resumed (seq ``ack.seq``) before it answered.
    await views.workflows.wait(contribution, lambda w: w is not None and ack.seq is not None
                               and (w.last_seq or 0) >= ack.seq,
                               remaining(VIEW_WAIT_S))
    return ReviewAccepted(contribution=contribution, command=ack.detail["command"],  # type: ignore[arg-type]
                          command_id=command_id)


def _digest(payload: dict[str, object]) -> str:
    """The default idempotency key: the review itself, so the same review sent twice by one
    reviewer is one command, and a different one is another (which the workflow decides)."""
    blob = json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()
    return "body-" + hashlib.sha256(blob).hexdigest()[:16]
