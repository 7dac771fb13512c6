"""Views the edge derives from the staff topics (rebuilt from Kafka at every start).

- issues, from the issue log ``voice.issues`` (deduped by the issue's seq): title, summary,
  evidence, followers, developments, investigations;
- workflows, from ``voice.workflows``: each workflow's records (deduped by seq, or by record
  id for the records without one) and their fold (status, step, what it waits for, outputs,
  commands) — research runs, reviews waiting and operators' reads come from here;
- contributions, from the compacted ``voice.contributions`` (the latest record is the state;
  a finished contribution never goes back to ``in_review``);
- inboxes, from ``voice.inbox`` (deduped by seq and by notification id), for the inbox stream.

Sealed content stays sealed here; routes open it. Everything runs on the edge's event loop;
``wait`` wakes on every change of its key, so reads that must see a write need not poll.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from api.changes import Changes
from api.tail import RecordHandler
from schemas.staff import (
    ContributionRecorded,
    DeliveryEnded,
    DevelopmentRecorded,
    EvidenceAdded,
    FollowerAdded,
    FollowerRemoved,
    InvestigationOpened,
    InvestigationSuggested,
    IssueOpened,
    NotificationRecorded,
)
from schemas.workflow import (
    StepFailed,
    StepStarted,
    StepSucceeded,
    WorkflowCommandReceived,
    WorkflowCompleted,
    WorkflowFailed,
    WorkflowPaused,
    WorkflowResumed,
    WorkflowStarted,
)
from streams.envelope import Envelope
from streams.topics import CONTRIBUTIONS, INBOX, ISSUES, WORKFLOWS, TopicSpec

MAX_WORKFLOW_RECORDS = 1000
"""Records kept per workflow for ``GET /staff/workflows/{id}`` (the log keeps them all)."""


@dataclass
class IssueView:
    issue: str
    title: str
    summary: str
    by: str
    at: str
    last_seq: int = 0
    evidence: dict[str, EvidenceAdded] = field(default_factory=dict)
    followers: set[str] = field(default_factory=set)
    developments: dict[str, DevelopmentRecorded] = field(default_factory=dict)
    ended: dict[str, DeliveryEnded] = field(default_factory=dict)
    investigations: dict[str, InvestigationView] = field(default_factory=dict)


@dataclass
class InvestigationView:
    investigation: str
    issue: str
    run: str
    title: str
    reason: str
    read: list[str]
    state: str = "suggested"
    opened_by: str | None = None


@dataclass
class WorkflowView:
    workflow: str
    kind: str
    input: dict[str, Any] = field(default_factory=dict)
    status: str = "running"
    step: str | None = None
    attempt: int = 1
    waiting_for: str | None = None
    last_error: str | None = None
    outputs: dict[str, dict[str, Any]] = field(default_factory=dict)
    commands: list[WorkflowCommandReceived] = field(default_factory=list)
    records: deque[Envelope] = field(default_factory=lambda: deque(maxlen=MAX_WORKFLOW_RECORDS))
    last_seq: int = 0
    ids: set[str] = field(default_factory=set)


@dataclass
class InboxView:
    recipient: str
    kept: int
    events: deque[Envelope] = field(default_factory=deque)
    last_seq: int = 0
    ids: set[str] = field(default_factory=set)

    def oldest_cursor(self) -> int:
        """The smallest ``after`` this view can serve every later notification for."""
        return (self.events[0].seq or 1) - 1 if self.events else self.last_seq

    def after(self, cursor: int) -> list[Envelope]:
        return [e for e in self.events if (e.seq or 0) > cursor]


class StaffViews:
    """Every issue, workflow, contribution and inbox this edge has seen."""

    def __init__(self, kept: int = 10_000) -> None:
        self.kept = kept
        self.issues: dict[str, IssueView] = {}
        self.investigations: dict[str, InvestigationView] = {}
        self.workflows: dict[str, WorkflowView] = {}
        self.contributions: dict[str, ContributionRecorded] = {}
        self.inboxes: dict[str, InboxView] = {}
        self._changes = Changes()

    def handlers(self) -> dict[TopicSpec, RecordHandler]:
        """What the edge's tail feeds into these views, by topic."""
        return {ISSUES: self.apply_issue, WORKFLOWS: self.apply_workflow,
                CONTRIBUTIONS: self.apply_contribution, INBOX: self.apply_inbox}

    # --- issues --------------------------------------------------------------------------

    def apply_issue(self, env: Envelope) -> None:
        rec = env.record
        if isinstance(rec, IssueOpened):
            if env.key not in self.issues:
                self.issues[env.key] = IssueView(rec.issue, rec.title, rec.summary, rec.by,
                                                 rec.at)
        view = self.issues.get(env.key)
        if view is None or env.seq is None or env.seq <= view.last_seq:
            return
        view.last_seq = env.seq
        if isinstance(rec, EvidenceAdded):
            view.evidence[rec.evidence] = rec
        elif isinstance(rec, FollowerAdded):
            view.followers.add(rec.participant)
        elif isinstance(rec, FollowerRemoved):
            view.followers.discard(rec.participant)
        elif isinstance(rec, DevelopmentRecorded):
            view.developments[rec.development] = rec
        elif isinstance(rec, DeliveryEnded):
            view.ended[rec.development] = rec
        elif isinstance(rec, InvestigationSuggested):
            inv = InvestigationView(rec.investigation, rec.issue, rec.run, rec.title,
                                    rec.reason, list(rec.read))
            view.investigations[rec.investigation] = inv
            self.investigations[rec.investigation] = inv
        elif isinstance(rec, InvestigationOpened):
            inv = self.investigations.get(rec.investigation)
            if inv is not None:
                inv.state, inv.opened_by = "open", rec.by
                self._notify(f"inv:{rec.investigation}")
        self._notify(f"issue:{env.key}")

    # --- workflows -----------------------------------------------------------------------

    def apply_workflow(self, env: Envelope) -> None:
        rec = env.record
        workflow = getattr(rec, "workflow", env.key)
        view = self.workflows.get(workflow)
        if view is None:
            kind = rec.kind if isinstance(rec, WorkflowStarted) else "unknown"
            view = self.workflows[workflow] = WorkflowView(workflow, kind)
        if env.seq is not None:
            if env.seq <= view.last_seq:
                return
            view.last_seq = env.seq
        elif env.id in view.ids:
            return
        else:
            view.ids.add(env.id)
        view.records.append(env)
        self._fold(view, rec)
        self._notify(f"wf:{workflow}")

    def _fold(self, view: WorkflowView, rec: Any) -> None:
        if isinstance(rec, WorkflowStarted):
            view.kind, view.input = rec.kind, dict(rec.input)
        elif isinstance(rec, StepStarted):
            view.status, view.step, view.attempt = "running", rec.step, rec.attempt
        elif isinstance(rec, StepSucceeded):
            view.outputs[rec.step] = dict(rec.output)
        elif isinstance(rec, StepFailed):
            view.last_error = f"{rec.error_type}: {rec.error}"
        elif isinstance(rec, WorkflowPaused):
            view.status, view.step, view.waiting_for = "paused", rec.step, rec.waiting_for
        elif isinstance(rec, WorkflowCommandReceived):
            if all(c.command_id != rec.command_id for c in view.commands):
                view.commands.append(rec)
        elif isinstance(rec, WorkflowResumed):
            view.status, view.waiting_for = "running", None
        elif isinstance(rec, WorkflowCompleted):
            view.status, view.waiting_for = "completed", None
        elif isinstance(rec, WorkflowFailed):
            view.status, view.last_error = "failed", rec.error

    # --- contributions -------------------------------------------------------------------

    def apply_contribution(self, env: Envelope) -> None:
        rec = env.record
        if not isinstance(rec, ContributionRecorded):
            return
        current = self.contributions.get(env.key)
        if current is not None and current.state != "in_review" and rec.state == "in_review":
            return  # a late re-run of an earlier step; the outcome stands
        self.contributions[env.key] = rec
        self._notify(f"ctb:{env.key}")

    def runs_of(self, issue: str) -> list[WorkflowView]:
        """The research runs of an issue, in the order this edge saw them start."""
        return [w for w in self.workflows.values() if w.kind == "research"
                and (w.input.get("issue") or {}).get("issue") == issue]

    def contributions_of(self, issue: str) -> list[ContributionRecorded]:
        return [c for c in self.contributions.values() if c.issue == issue]

    # --- inboxes -------------------------------------------------------------------------

    def apply_inbox(self, env: Envelope) -> None:
        rec = env.record
        if not isinstance(rec, NotificationRecorded) or env.seq is None:
            return
        view = self.inboxes.get(env.key)
        if view is None:
            view = self.inboxes[env.key] = InboxView(env.key, self.kept)
        if env.seq <= view.last_seq:
            return  # a writer's replay: same seq, same record
        view.last_seq = env.seq
        if rec.notification not in view.ids:
            view.ids.add(rec.notification)
            view.events.append(env)
            while len(view.events) > view.kept:
                view.events.popleft()
        self._notify(f"inbox:{env.key}")

    def inbox(self, recipient: str) -> InboxView:
        return self.inboxes.get(recipient) or InboxView(recipient, self.kept)

    # --- waiting for the log to reach a point ----------------------------------------------

    def _notify(self, key: str) -> None:
        self._changes.notify(key)

    async def wait(self, key: str, until: Callable[[], bool], timeout: float) -> bool:
        """Wait at most ``timeout`` seconds until ``until()`` holds (re-checked on every change
        of ``key``, e.g. ``issue:<id>``, ``wf:<id>``, ``ctb:<id>``, ``inbox:<recipient>``)."""
        return await self._changes.wait(key, until, timeout)
