"""The issue writer: the single writer of each issue's log (``voice.issues``).

Like the conversation sequencer, ``apply_issue`` is pure: the issue's state and one command in,
the new state and the records to produce out, with a dense per-issue seq and record ids derived
from the command, so a command replayed after a crash yields identical records. It never calls
a model and never starts a workflow (the developments consumer does, from this log).
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, field
from typing import Any

from schemas.base import Record
from schemas.staff import (
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
from schemas.system import CommandAcknowledged
from streams.envelope import Envelope
from streams.topics import ACKS, ISSUES, TopicSpec

SOURCE = "/voice/issue-writer"
MAX_REMEMBERED = 1024
"""Command ids an issue remembers, so a redelivered command is acknowledged, not re-applied."""

Output = tuple[TopicSpec, Envelope]


@dataclass
class IssueState:
    """What the writer keeps per issue (a Faust table value, as a dict)."""

    seq: int = 0
    followers: list[str] = field(default_factory=list)
    developments: int = 0
    investigations: dict[str, str] = field(default_factory=dict)
    """investigation id → ``suggested`` | ``open``"""
    ended: list[str] = field(default_factory=list)
    """Developments whose delivery ended (each is recorded once)."""
    commands: dict[str, dict[str, Any]] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> IssueState | None:
        return None if d is None else cls(**copy.deepcopy(d))

    def to_dict(self) -> dict[str, Any]:
        return copy.deepcopy(asdict(self))

    def remember(self, command_id: str, ack: dict[str, Any]) -> None:
        self.commands[command_id] = ack
        while len(self.commands) > MAX_REMEMBERED:
            self.commands.pop(next(iter(self.commands)))


def ack(cmd: Envelope, outcome: str, seq: int | None, source: str = SOURCE,
        **detail: Any) -> Output:
    """The acknowledgement of ``cmd`` (key = command id) for the edge that waits on it."""
    rec = CommandAcknowledged(command_id=cmd.id, aggregate=cmd.key, outcome=outcome,  # type: ignore[arg-type]
                              seq=seq, detail=detail)
    return ACKS, Envelope(record=rec, key=cmd.id, source=source, subject=cmd.key,
                          tenant=cmd.tenant, correlation=cmd.correlation, causation=cmd.id,
                          id=f"{cmd.id}-ack")


def _append(state: IssueState, cmd: Envelope, record: Record) -> Output:
    state.seq += 1
    return ISSUES, Envelope(record=record, key=cmd.key, source=SOURCE, subject=cmd.key,
                            seq=state.seq, tenant=cmd.tenant,
                            correlation=cmd.correlation or cmd.id, causation=cmd.id,
                            id=f"{cmd.id}-{state.seq}", time=cmd.time)


def _done(state: IssueState, cmd: Envelope, records: list[Record], /, **detail: Any
          ) -> tuple[IssueState, list[Output]]:
    out = [_append(state, cmd, r) for r in records]
    seq = state.seq if records else None
    state.remember(cmd.id, {"seq": seq, **detail})
    return state, [*out, ack(cmd, "accepted", seq, **detail)]


def apply_issue(state: IssueState | None, cmd: Envelope
                ) -> tuple[IssueState | None, list[Output]]:
    """Apply one command to an issue; returns (new state, records to produce in order).

    The given state is not modified; times come from the command, so a replay is identical.
    """
    state = copy.deepcopy(state)
    rec = cmd.record
    at = cmd.time.isoformat()
    if state is not None and cmd.id in state.commands:  # redelivered command
        return state, [ack(cmd, "duplicate", **state.commands[cmd.id])]
    if getattr(rec, "issue", None) != cmd.key:  # the log of one issue holds only its records
        return state, [ack(cmd, "rejected", None, reason=f"command for issue "
                                                      f"{getattr(rec, 'issue', None)!r} "
                                                      f"sent to {cmd.key!r}")]
    if isinstance(rec, OpenIssue):
        if state is not None:
            return state, [ack(cmd, "rejected", None, reason="issue exists")]
        return _done(IssueState(), cmd, [IssueOpened(issue=rec.issue, title=rec.title,
                                                     summary=rec.summary, by=rec.by, at=at)],
                     issue=rec.issue)
    if state is None:
        return None, [ack(cmd, "rejected", None, reason="no such issue")]

    if isinstance(rec, AddEvidence):
        return _done(state, cmd, [EvidenceAdded(
            issue=rec.issue, evidence=rec.evidence, title=rec.title, body=rec.body, url=rec.url,
            added_by=rec.added_by, at=at)], evidence=rec.evidence)
    if isinstance(rec, FollowIssue):
        if rec.participant in state.followers:
            return _done(state, cmd, [], following=1)
        state.followers.append(rec.participant)
        return _done(state, cmd, [FollowerAdded(issue=rec.issue, participant=rec.participant)],
                     following=1)
    if isinstance(rec, UnfollowIssue):
        if rec.participant not in state.followers:
            return _done(state, cmd, [], following=0)
        state.followers.remove(rec.participant)
        return _done(state, cmd, [FollowerRemoved(issue=rec.issue,
                                                  participant=rec.participant)], following=0)
    if isinstance(rec, RecordDevelopment):
        state.developments += 1
        development = f"{rec.issue}:dev-{state.developments}"
        return _done(state, cmd, [DevelopmentRecorded(
            issue=rec.issue, development=development, title=rec.title, body=rec.body, by=rec.by,
            at=at)],
                     development=development)
    if isinstance(rec, SuggestInvestigation):
        if rec.investigation in state.investigations:  # a research step re-run
            return _done(state, cmd, [], investigation=rec.investigation,
                         state=state.investigations[rec.investigation])
        state.investigations[rec.investigation] = "suggested"
        return _done(state, cmd, [InvestigationSuggested(
            issue=rec.issue, investigation=rec.investigation, run=rec.run, title=rec.title,
            reason=rec.reason, read=rec.read)], investigation=rec.investigation,
            state="suggested")
    if isinstance(rec, OpenInvestigation):
        current = state.investigations.get(rec.investigation)
        if current is None:
            return state, [ack(cmd, "rejected", None, reason="no such investigation")]
        if current == "open":
            return _done(state, cmd, [], investigation=rec.investigation, state="open")
        state.investigations[rec.investigation] = "open"
        return _done(state, cmd, [InvestigationOpened(
            issue=rec.issue, investigation=rec.investigation, by=rec.by)],
            investigation=rec.investigation, state="open")
    if isinstance(rec, EndDelivery):
        if rec.development in state.ended:
            return _done(state, cmd, [], development=rec.development)
        state.ended = [*state.ended[-(MAX_REMEMBERED - 1):], rec.development]
        return _done(state, cmd, [DeliveryEnded(issue=rec.issue, development=rec.development,
                                                status=rec.status, reason=rec.reason)],
                     development=rec.development)
    return state, [ack(cmd, "rejected", None, reason=f"not an issue command: {cmd.type}")]

