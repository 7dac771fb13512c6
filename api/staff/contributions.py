"""Participants' issue routes: read an issue's published parts (``/issues``), follow it and
contribute to it, list those the caller follows (``/me/issues``).

Nothing staff-only is answered here: no evidence, no investigations, no contribution that is
not published, no author. A contribution's text is sealed under its own key before it is
produced; its disclosure review starts at once and answers 202 with the contribution's id.

Its author may erase it (``DELETE``), in the conversations' order: its key is destroyed first
(text, flags and published text no longer open anywhere), then this edge forgets it, then
``voice.contributions`` records the erasure (its key's latest record, what compaction keeps).
Staff cannot erase one: they reject it in review; erasure is the author's right over their
words. A review still waiting fails at its next step (the text no longer opens).
"""

from __future__ import annotations

import asyncio
import secrets
from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Response
from pydantic import AfterValidator, BaseModel

from api.frame.auth import Principal
from api.frame.commands import Commands, CommandsDep, refused
from api.frame.deps import (
    VIEW_WAIT_S,
    ContributorDep,
    PublicDep,
    SealerDep,
    SettingsDep,
    check_text_size,
    known_or_404,
    known_or_behind,
    not_found,
)
from api.frame.models import NonBlank, RequestModel
from api.staff.deps import NOT_FOUND, StaffViewsDep
from api.staff.views import StaffViews
from schemas.staff import ContributionErased, ContributionRecorded, FollowIssue, UnfollowIssue
from schemas.workflow import WorkflowStarted
from streams.sealing import KeyErased
from streams.topics import CONTRIBUTIONS

public = APIRouter(prefix="/issues", tags=["issues"])
mine = APIRouter(prefix="/me/issues", tags=["issues"])


class ContributionIn(RequestModel):
    """``POST /me/issues/{issue}/contributions``; the byte limit is ``VOICE_MAX_MESSAGE_BYTES``.
    Surrounding whitespace is dropped before the text is sealed."""

    text: Annotated[NonBlank, AfterValidator(str.strip)]


class ContributionAccepted(BaseModel):
    """``202``: the contribution is in review; it is published only if reviewers agree."""

    contribution: str


class FollowOut(BaseModel):
    issue: str
    following: bool


class PublicIssueOut(BaseModel):
    issue: str
    title: str
    summary: str
    published_contributions: int
    followers: int


class FollowedIssueOut(BaseModel):
    """An issue the caller follows (``GET /me/issues``)."""

    issue: str
    title: str
    summary: str
    at: str
    """When the issue was opened."""


class PublishedContribution(BaseModel):
    contribution: str
    text: str
    """As published: the spans reviewers chose are replaced by ``[redacted: kind]``."""
    published_at: str


@public.get("/{issue}", responses=NOT_FOUND)
async def get_issue(issue: str, principal: PublicDep, views: StaffViewsDep) -> PublicIssueOut:
    """An issue's public face."""
    v = await known_or_404(views.issues, issue, "issue", principal.tenant)
    published = sum(1 for c in views.contributions_of(v) if c.state == "published")
    return PublicIssueOut(issue=v.issue, title=v.title, summary=v.summary,
                          published_contributions=published, followers=len(v.followers))


@public.get("/{issue}/contributions", responses=NOT_FOUND)
async def published_contributions(issue: str, principal: PublicDep, views: StaffViewsDep,
                                  sealer: SealerDep) -> list[PublishedContribution]:
    """The issue's published contributions, oldest first (nothing in review or rejected)."""
    v = await known_or_404(views.issues, issue, "issue", principal.tenant)
    out = []
    for c in sorted(views.contributions_of(v), key=lambda c: c.updated_at):
        if c.state != "published" or c.published_text is None:
            continue
        try:
            text = sealer.open_text(c.contribution, "published", c.published_text)
        except KeyErased:  # erased through another edge, not yet on this edge's view
            views.contributions.mark_erased(c.contribution)
            continue
        out.append(PublishedContribution(contribution=c.contribution, text=text,
                                         published_at=c.updated_at))
    return out


async def set_following(issue: str, following: bool, principal: Principal,
                        commands: Commands, views: StaffViews) -> FollowOut:
    """Record that ``principal`` follows ``issue`` (or no longer does)."""
    await known_or_404(views.issues, issue, "issue", principal.tenant)
    command = FollowIssue if following else UnfollowIssue
    ack = await commands.submit(issue, command(issue=issue, participant=principal.sub))
    if ack.outcome == "rejected":
        raise refused(ack, f"issue {issue!r}")
    # Read-your-writes: ``GET /me/issues`` next on this edge lists it (or no longer does).
    await views.issues.wait(issue, lambda v: v is not None
                            and (principal.sub in v.followers) == following, VIEW_WAIT_S)
    return FollowOut(issue=issue, following=following)


@mine.get("")
async def followed_issues(principal: PublicDep, views: StaffViewsDep) -> list[FollowedIssueOut]:
    """The issues the caller follows in its tenant, newest first (as this edge's view of the
    issue log has them: a follow acknowledged a moment ago may take a moment to show)."""
    mine_ = [v for v in views.issues.values()
             if v.tenant == principal.tenant and principal.sub in v.followers]
    mine_.sort(key=lambda v: (v.at, v.issue), reverse=True)
    return [FollowedIssueOut(issue=v.issue, title=v.title, summary=v.summary, at=v.at)
            for v in mine_]


@mine.post("/{issue}/follow", responses=NOT_FOUND)
async def follow(issue: str, principal: PublicDep, commands: CommandsDep,
                 views: StaffViewsDep) -> FollowOut:
    """Follow an issue: its updates come to the caller's inbox."""
    return await set_following(issue, True, principal, commands, views)


@mine.delete("/{issue}/follow", responses=NOT_FOUND)
async def unfollow(issue: str, principal: PublicDep, commands: CommandsDep,
                   views: StaffViewsDep) -> FollowOut:
    """Stop following an issue (no error if the caller did not follow it)."""
    return await set_following(issue, False, principal, commands, views)


@mine.post("/{issue}/contributions", status_code=202, responses=NOT_FOUND)
async def contribute(issue: str, body: ContributionIn, principal: ContributorDep,
                     settings: SettingsDep, commands: CommandsDep, sealer: SealerDep,
                     views: StaffViewsDep) -> ContributionAccepted:
    """Contribute to an issue; a disclosure review decides whether (and how) it is published."""
    check_text_size(settings, body.text)
    await known_or_404(views.issues, issue, "issue", principal.tenant)
    contribution = f"ctb-{secrets.token_hex(8)}"
    # Its own data key: erasing the contribution erases every copy of its words.
    sealed = await asyncio.to_thread(sealer.seal, contribution, "text", body.text)
    now = datetime.now(UTC).isoformat()
    record = ContributionRecorded(contribution=contribution, issue=issue, author=principal.sub,
                                  text=sealed, submitted_at=now, updated_at=now)
    env = commands.envelope(record, contribution, correlation=contribution,
                            id=f"{contribution}:submitted")
    # The contribution's record first, so its workflow never runs ahead of it.
    await commands.record(CONTRIBUTIONS, env, "record the contribution")
    await commands.start_workflow(WorkflowStarted(
        workflow=contribution, kind="disclosure-review", input={
            "contribution": contribution, "issue": issue, "author": principal.sub,
            "text": sealed.model_dump(), "submitted_at": now, "tenant": principal.tenant}))
    return ContributionAccepted(contribution=contribution)



@mine.delete("/{issue}/contributions/{contribution}", status_code=204, responses=NOT_FOUND)
async def erase_contribution(issue: str, contribution: str, principal: ContributorDep,
                             commands: CommandsDep, sealer: SealerDep, views: StaffViewsDep
                             ) -> Response:
    """Erase a contribution of the caller's (published or not): its key is destroyed first,
    so its words no longer open anywhere, then the log records the erasure; it then answers
    404 everywhere, as an unknown id does. Anyone else's, or another issue's: 404."""
    await known_or_behind(views.contributions, contribution, "contribution")
    c = views.contributions.authored(contribution, principal)
    if c is None or c.issue != issue:
        raise not_found("contribution", contribution)
    await asyncio.to_thread(sealer.erase, contribution)
    views.contributions.mark_erased(contribution)
    env = commands.envelope(ContributionErased(contribution=contribution, issue=issue),
                            contribution, correlation=contribution, id=f"{contribution}:erased")
    await commands.record(CONTRIBUTIONS, env, "record the erasure")
    return Response(status_code=204)
