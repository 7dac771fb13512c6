"""The issue writer: the aggregate whose single writer appends each issue's log (``voice.issues``).

Like the conversation sequencer, ``IssueWriter.decide`` is pure: the issue's state and one
command in, the records to append and the answer out (``consumers.frame`` gives them a dense
per-issue seq and ids derived from the command, so a command replayed after a crash yields
identical records). It never calls a model and never starts a workflow (the developments
consumer does, from this log).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from consumers.frame import (
    MAX_REMEMBERED,
    Ack,
    Aggregate,
    AggregateState,
    Decision,
    append,
    remember,
)
from schemas.base import Record
from schemas.staff import (
    ISSUE_COMMANDS,
    AddEvidence,
    DeliveryEnded,
    DevelopmentRecorded,
    EndDelivery,
    EvidenceAdded,
    FollowerAdded,
    FollowerRemoved,
    FollowIssue,
    InvestigationOpened,
    InvestigationSuggested,
    IssueOpened,
    OpenInvestigation,
    OpenIssue,
    RecordDevelopment,
    SuggestInvestigation,
    UnfollowIssue,
)
from streams.envelope import Envelope
from streams.topics import ISSUES

SOURCE = "/voice/issue-writer"
MAX_FOLLOWS = 1024
"""Follow states the writer remembers per issue (see ``IssueState.follows``)."""


@dataclass(kw_only=True)
class IssueState(AggregateState):
    """What the writer keeps per issue (a Faust table value, as a dict)."""

    follows: dict[str, bool] = field(default_factory=dict)
    """Whether each of the most recent ``MAX_FOLLOWS`` participants to follow or unfollow
    follows now: a repeat among them records nothing. Not every follower — that would make
    this value (a changelog record) grow with them; readers fold the log's follow records,
    so a repeat older than the memory recording again changes nothing."""
    developments: int = 0
    investigations: dict[str, str] = field(default_factory=dict)
    """investigation id → ``suggested`` | ``open``"""
    ended: list[str] = field(default_factory=list)
    """Developments whose delivery ended (each is recorded once)."""
    commands: dict[str, dict[str, Any]] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> Any:
        if d is not None and "followers" in d:  # a value kept before ``follows``
            d = dict(d)
            d["follows"] = {p: True for p in d.pop("followers")[-MAX_FOLLOWS:]}
        return super().from_dict(d)


def _done(state: IssueState, records: list[Record], /, **detail: Any) -> Decision[IssueState]:
    appended = append(state, *records)
    return Decision(state, appended, Ack.accepted(state.seq if records else None, **detail))


class IssueWriter(Aggregate[IssueState]):
    """Issues: opened, evidence, followers, developments, investigations, delivery ends."""

    name = "staff_issues"
    what = "issue"
    state = IssueState
    log = ISSUES
    source = SOURCE
    commands = ISSUE_COMMANDS

    def decide(self, state: IssueState | None, cmd: Envelope) -> Decision[IssueState]:
        """Apply one command to an issue; times come from the command, so a replay is
        identical."""
        rec = cmd.record
        at = cmd.time.isoformat()
        if getattr(rec, "issue", None) != cmd.key:  # the log of one issue holds only its records
            return Decision(state, ack=Ack.rejected(
                f"command for issue {getattr(rec, 'issue', None)!r} sent to {cmd.key!r}"))
        if isinstance(rec, OpenIssue):
            if state is not None:
                return Decision(state, ack=Ack.rejected("issue exists"))
            return _done(IssueState(), [IssueOpened(issue=rec.issue, title=rec.title,
                                                    summary=rec.summary, by=rec.by, at=at)],
                         issue=rec.issue)
        if state is None:
            return Decision(None, ack=Ack.rejected("no such issue"))
        return _apply(state, rec, at)


def _apply(state: IssueState, rec: Record, at: str) -> Decision[IssueState]:
    if isinstance(rec, AddEvidence):
        return _done(state, [EvidenceAdded(
            issue=rec.issue, evidence=rec.evidence, title=rec.title, body=rec.body, url=rec.url,
            added_by=rec.added_by, at=at)], evidence=rec.evidence)
    if isinstance(rec, FollowIssue | UnfollowIssue):
        follow = isinstance(rec, FollowIssue)
        if state.follows.get(rec.participant) is follow:
            return _done(state, [], following=int(follow))
        remember(state.follows, rec.participant, follow, MAX_FOLLOWS)
        changed = FollowerAdded if follow else FollowerRemoved
        return _done(state, [changed(issue=rec.issue, participant=rec.participant)],
                     following=int(follow))
    if isinstance(rec, RecordDevelopment):
        state.developments += 1
        development = f"{rec.issue}:dev-{state.developments}"
        return _done(state, [DevelopmentRecorded(
            issue=rec.issue, development=development, title=rec.title, body=rec.body, by=rec.by,
            at=at)], development=development)
    if isinstance(rec, SuggestInvestigation):
        if rec.investigation in state.investigations:  # a research step re-run
            return _done(state, [], investigation=rec.investigation,
                         state=state.investigations[rec.investigation])
        state.investigations[rec.investigation] = "suggested"
        return _done(state, [InvestigationSuggested(
            issue=rec.issue, investigation=rec.investigation, run=rec.run, title=rec.title,
            reason=rec.reason, read=rec.read)], investigation=rec.investigation,
            state="suggested")
    if isinstance(rec, OpenInvestigation):
        current = state.investigations.get(rec.investigation)
        if current is None:
            return Decision(state, ack=Ack.rejected("no such investigation"))
        if current == "open":
            return _done(state, [], investigation=rec.investigation, state="open")
        state.investigations[rec.investigation] = "open"
        return _done(state, [InvestigationOpened(
            issue=rec.issue, investigation=rec.investigation, by=rec.by)],
            investigation=rec.investigation, state="open")
    if isinstance(rec, EndDelivery):
        if rec.development in state.ended:
            return _done(state, [], development=rec.development)
        state.ended = [*state.ended[-(MAX_REMEMBERED - 1):], rec.development]
        return _done(state, [DeliveryEnded(issue=rec.issue, development=rec.development,
                                           status=rec.status, reason=rec.reason)],
                     development=rec.development)
    return Decision(state, ack=Ack.rejected(f"not an issue command: {rec.ce_type}"))
