"""Records of the staff domain: issues and their evidence, followers, developments,
investigations (topic ``voice.issues``, key = issue id, appended by the issue's writer only),
contributions (compacted ``voice.contributions``, key = contribution id, current state) and
participants' inboxes (``voice.inbox``, key = recipient, appended by the inbox's writer only).

Commands travel on ``voice.commands`` keyed by the aggregate they change. A contribution's text
is participant content: it is always ``Sealed`` with the contribution's own data key (the
contribution id plays the sealer's "conversation"), so erasing that key erases every copy.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from schemas.base import Record, Sealed, record_type

ISSUE_ID = r"^iss-[0-9a-f]{8,32}$"
DevelopmentEnd = Literal["completed", "failed"]
ContributionState = Literal["in_review", "published", "rejected"]
Decision = Literal["approve", "reject", "redact"]


class Suggestion(BaseModel):
    """One suggestion of a research run: what, why, and which records the agent read for it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    title: str
    reason: str
    read: list[str] = []
    """Ids of the records (issue, evidence, claims, gaps) the agent read for it."""


class ReviewSummary(BaseModel):
    """A reviewer's decision as the contribution's state shows it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    by: str
    decision: Decision
    redactions: int = 0
    """How many spans this reviewer asked to redact."""


# --- issue commands (topic voice.commands, key = issue id) ----------------------------------


@record_type("voice.issue.open.v1")
class OpenIssue(Record):
    issue: str = Field(pattern=ISSUE_ID)
    title: str = Field(min_length=1, max_length=200)
    summary: str = Field(default="", max_length=4000)
    by: str


@record_type("voice.issue.add_evidence.v1")
class AddEvidence(Record):
    issue: str
    evidence: str
    title: str
    body: str | None = None
    url: str | None = None
    added_by: str


@record_type("voice.issue.follow.v1")
class FollowIssue(Record):
    issue: str
    participant: str


@record_type("voice.issue.unfollow.v1")
class UnfollowIssue(Record):
    issue: str
    participant: str


@record_type("voice.issue.record_development.v1")
class RecordDevelopment(Record):
    """A development on the issue; the writer names it ``{issue}:dev-{n}``."""

    issue: str
    title: str
    body: str
    by: str


@record_type("voice.issue.suggest_investigation.v1")
class SuggestInvestigation(Record):
    """Submitted by a research run; the id is derived from the run, so a re-run is a no-op."""

    issue: str
    investigation: str
    run: str
    title: str
    reason: str
    read: list[str] = []


@record_type("voice.issue.open_investigation.v1")
class OpenInvestigation(Record):
    issue: str
    investigation: str
    by: str


@record_type("voice.issue.end_delivery.v1")
class EndDelivery(Record):
    """The update-delivery workflow of a development ended (submitted by the worker)."""

    issue: str
    development: str
    status: DevelopmentEnd
    reason: str | None = None


# --- the issue log (topic voice.issues, key = issue id) --------------------------------------


@record_type("voice.issue.opened.v1")
class IssueOpened(Record):
    issue: str
    title: str
    summary: str
    by: str
    at: str


@record_type("voice.issue.evidence_added.v1")
class EvidenceAdded(Record):
    issue: str
    evidence: str
    title: str
    body: str | None = None
    url: str | None = None
    added_by: str
    at: str


@record_type("voice.issue.follower_added.v1")
class FollowerAdded(Record):
    issue: str
    participant: str


@record_type("voice.issue.follower_removed.v1")
class FollowerRemoved(Record):
    issue: str
    participant: str


@record_type("voice.issue.development_recorded.v1")
class DevelopmentRecorded(Record):
    issue: str
    development: str
    title: str
    body: str
    by: str
    at: str


@record_type("voice.issue.delivery_ended.v1")
class DeliveryEnded(Record):
    """The development's update-delivery workflow ended; the next one on the issue may start."""

    issue: str
    development: str
    status: DevelopmentEnd
    reason: str | None = None


@record_type("voice.issue.investigation_suggested.v1")
class InvestigationSuggested(Record):
    """An investigation a research run suggested: state ``suggested`` until a representative
    opens it."""

    issue: str
    investigation: str
    run: str
    title: str
    reason: str
    read: list[str] = []


@record_type("voice.issue.investigation_opened.v1")
class InvestigationOpened(Record):
    issue: str
    investigation: str
    by: str


# --- contributions (compacted topic voice.contributions, key = contribution id) -------------


@record_type("voice.contribution.recorded.v1")
class ContributionRecorded(Record):
    """The contribution's current state; the latest record of a key is the truth.

    Written first by the edge (submitted), then only by its disclosure-review workflow.
    """

    contribution: str
    issue: str
    author: str
    text: Sealed
    """The participant's words, sealed under the contribution's key (content id ``text``)."""
    state: ContributionState = "in_review"
    flag_count: int | None = None
    """``None`` until the privacy checks ran."""
    flag_kinds: list[str] = []
    flags: Sealed | None = None
    """Sealed JSON ``{"flags": [{start, end, kind, source, reason}]}`` (content id ``flags``):
    an agent's reason may quote the text, so flags are content too."""
    reviews: list[ReviewSummary] = []
    published_text: Sealed | None = None
    """The published (redacted) text, sealed (content id ``published``)."""
    submitted_at: str
    updated_at: str


@record_type("voice.contribution.erased.v1")
class ContributionErased(Record):
    """Its author erased the contribution (its key destroyed first): every edge forgets it, and,
    being the key's latest record, it is what compaction keeps. A disclosure-review step that
    runs after it fails (the text no longer opens) and records nothing."""

    contribution: str
    issue: str


# --- inboxes (commands on voice.commands and the log voice.inbox, key = recipient) -----------


@record_type("voice.inbox.deliver.v1")
class DeliverNotification(Record):
    """Submitted by an update-delivery workflow; its record id is the notification id
    ``{development}:{recipient}``, which the inbox writer records at most once."""

    notification: str
    recipient: str
    issue: str
    development: str
    title: str
    body: str


@record_type("voice.inbox.notification_recorded.v1")
class NotificationRecorded(Record):
    recipient: str
    notification: str
    issue: str
    development: str
    title: str
    body: str
    at: str


ISSUE_COMMANDS = (OpenIssue, AddEvidence, FollowIssue, UnfollowIssue, RecordDevelopment,
                  SuggestInvestigation, OpenInvestigation, EndDelivery)
