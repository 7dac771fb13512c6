"""Views the edge derives from the staff topics (rebuilt from Kafka at every start), one
``Projection`` (``api.frame.projection``) per aggregate kind:

- ``issues``, from the issue log ``voice.issues`` (deduped by the issue's seq): title, summary,
  evidence, followers, developments, investigations (also indexed by id: ``investigations``);
- ``workflows``, from ``voice.workflows``: each workflow's records (deduped by seq, or by record
  id for the records without one) and their fold (status, step, what it waits for, outputs,
  commands) — research runs, reviews waiting and operators' reads come from here. A turn's
  workflow is kept while it runs and among the last ``VOICE_EDGE_TURN_WORKFLOWS_KEPT`` ended,
  not for ever: each turn makes one;
- ``contributions``, from the compacted ``voice.contributions`` (the latest record is the
  state; a finished contribution never goes back to ``in_review``);
- ``inboxes``, from ``voice.inbox``: a ``KeptEvents`` per recipient and tenant (deduped by
  seq and by notification id), for the inbox stream;
- ``queues``, from ``voice.review-queue``: a ``KeptEvents`` per tenant (``api.staff.queue_view``),
  for the review-queue stream.

Sealed content stays sealed here; routes open it. Everything runs on the edge's event loop.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from api.frame.on_demand import ReadOnDemand
from api.frame.projection import (
    DEFAULT_KEPT,
    AggregateView,
    Caller,
    KeptEvents,
    Projection,
    StreamProjection,
)
from api.frame.tail import LocatedHandler, RecordHandler
from api.staff.queue_view import ReviewQueues
from schemas.staff import (
    ContributionErased,
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
    LastStepSucceeded,
    StepFailed,
    StepStarted,
    StepSucceeded,
    WorkflowCommandReceived,
    WorkflowCompleted,
    WorkflowFailed,
    WorkflowPaused,
    WorkflowResumed,
    WorkflowsForgotten,
    WorkflowStarted,
)
from streams.envelope import Envelope
from streams.ids import inbox_key, workflow_since_ms, workflow_turn
from streams.settings import VoiceSettings
from streams.topics import CONTRIBUTIONS, INBOX, ISSUES, REVIEW_QUEUE, WORKFLOWS, TopicSpec

MAX_WORKFLOW_RECORDS = 1000
"""Records kept per workflow for ``GET /staff/workflows/{id}`` (the log keeps them all)."""
TURN_WORKFLOWS_KEPT: int = VoiceSettings.model_fields["edge_turn_workflows_kept"].default
ENDED = frozenset({"completed", "failed"})


@dataclass(kw_only=True)
class InvestigationView(AggregateView):
    investigation: str
    issue: str
    run: str
    title: str
    reason: str
    read: list[str]
    state: str = "suggested"
    opened_by: str | None = None


@dataclass(kw_only=True)
class IssueView(AggregateView):
    issue: str
    title: str
    summary: str
    by: str
    at: str
    evidence: dict[str, EvidenceAdded] = field(default_factory=dict)
    followers: set[str] = field(default_factory=set)
    developments: dict[str, DevelopmentRecorded] = field(default_factory=dict)
    ended: dict[str, DeliveryEnded] = field(default_factory=dict)
    investigations: dict[str, InvestigationView] = field(default_factory=dict)
    partition: int | None = None
    """Where the issue's log is: its partition of ``voice.issues``, and the offset of its
    first record there (a research run's input names this span instead of copying it)."""
    opened: int | None = None


@dataclass(kw_only=True)
class WorkflowView(AggregateView):
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
    ids: set[str] = field(default_factory=set)
    of_turn: bool = False
    """A turn's workflow (``streams.ids.workflow_turn``): let go of some time after it ends."""

    def accept(self, env: Envelope) -> bool:
        # The engine's records carry the workflow's seq; the others (a command forwarded by a
        # writer) only their id.
        if env.seq is not None:
            return super().accept(env)
        if env.id in self.ids:
            return False
        self.ids.add(env.id)
        return True


@dataclass(kw_only=True)
class InboxView(KeptEvents[Envelope]):
    recipient: str
    ids: set[str] = field(default_factory=set)
    """Notification ids seen: a writer's replay under a new seq is not shown twice."""

    @property
    def stream_name(self) -> str:
        return f"inbox of {self.recipient}"

    @staticmethod
    def cursor_of(event: Envelope) -> int:
        return event.seq or 0

    def owned_by(self, owner: str) -> bool:
        return self.recipient == owner


class Issues(Projection[IssueView]):
    """Issues by id, and their investigations by id (``investigations``)."""

    def __init__(self) -> None:
        super().__init__()
        self.investigations: Projection[InvestigationView] = Projection()

    def apply_at(self, env: Envelope, partition: int, offset: int) -> None:
        """``apply``, knowing where the record is (the tail's ``located`` handler)."""
        self.apply(env, partition, offset)

    def apply(self, env: Envelope, partition: int | None = None,
              offset: int | None = None) -> None:
        rec = env.record
        if isinstance(rec, IssueOpened) and env.key not in self.by_key:
            self.by_key[env.key] = IssueView(issue=rec.issue, title=rec.title,
                                             summary=rec.summary, by=rec.by, at=rec.at,
                                             tenant=env.tenant, partition=partition,
                                             opened=offset)
        view = self.by_key.get(env.key)
        if view is None or not view.accept(env):
            return
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
            inv = InvestigationView(investigation=rec.investigation, issue=rec.issue,
                                    run=rec.run, title=rec.title, reason=rec.reason,
                                    read=list(rec.read), tenant=view.tenant)
            view.investigations[rec.investigation] = inv
            self.investigations.by_key[rec.investigation] = inv
            self.investigations.notify(rec.investigation)
        elif isinstance(rec, InvestigationOpened):
            inv = self.investigations.get(rec.investigation)
            if inv is not None:
                inv.state, inv.opened_by = "open", rec.by
                self.investigations.notify(rec.investigation)
        self.notify(env.key)


class Workflows(ReadOnDemand[WorkflowView]):
    """Workflows by id: their last records and where they stand.

    A turn's workflow is kept while it runs or waits, and once ended among the ``turns_kept``
    that ended last (a failed one an operator may retry among them); then it is let go of, and
    later records of it are not taken up again (its story is its conversation's). Each turn
    makes one, so keeping them all grew an edge by ~9 KB a turn for ever. Every other workflow
    (research runs, reviews, deliveries: few, long-lived, and named by other views) is kept.
    Asked for (``ensure``), a turn's workflow this edge does not hold — let go of, or older
    than its history window — is read from the log with ``cold`` (``ReadOnDemand``), from its
    conversation's time: a turn of a conversation whose id has none is not read. It is then
    held as the last ended.
    """

    FOUNDED_BY = WorkflowStarted

    def __init__(self, turns_kept: int = TURN_WORKFLOWS_KEPT,
                 cold: Callable[[str], list[Envelope]] | None = None) -> None:
        super().__init__(cold=cold)
        self.turns_kept = turns_kept
        self._ended_turns: OrderedDict[str, None] = OrderedDict()
        """Ended turn workflows held, the one that ended first first."""
        self.turns_let_go = 0
        """Ended turn workflows this edge let go of since it started."""

    def readable(self, key: str) -> bool:
        return workflow_since_ms(key) is not None

    def apply(self, env: Envelope) -> None:
        rec = env.record
        if isinstance(rec, WorkflowsForgotten):
            return  # a worker's housekeeping of its table, of no workflow's story
        workflow = getattr(rec, "workflow", env.key)
        view = self.by_key.get(workflow)
        if view is None:
            of_turn = workflow_turn(workflow) is not None
            if of_turn and not isinstance(rec, WorkflowStarted):
                # Let go of: a late record does not bring it back. Being read from the log:
                # applied after the read.
                self.held_back(workflow, env)
                return
            kind = rec.kind if isinstance(rec, WorkflowStarted) else "unknown"
            view = self.by_key[workflow] = WorkflowView(workflow=workflow, kind=kind,
                                                        of_turn=of_turn)
        if not view.accept(env):
            return
        if view.tenant is None and env.tenant is not None and isinstance(rec, WorkflowStarted):
            view.tenant = env.tenant
        view.records.append(env)
        self._fold(view, rec)
        if view.of_turn:
            self._keep_turns(view)
        self.notify(workflow)

    def _keep_turns(self, view: WorkflowView) -> None:
        """Note whether a turn's workflow has ended (a retried one runs again); let go of the
        ended ones past ``turns_kept``, those that ended first."""
        ended = self._ended_turns
        if view.status not in ENDED:
            ended.pop(view.workflow, None)
            return
        ended[view.workflow] = None
        ended.move_to_end(view.workflow)
        while len(ended) > self.turns_kept:
            gone, _ = ended.popitem(last=False)
            self.let_go(gone)
            self.turns_let_go += 1
            self.notify(gone)

    def _fold(self, view: WorkflowView, rec: Any) -> None:
        if isinstance(rec, WorkflowStarted):
            view.kind, view.input = rec.kind, dict(rec.input)
            view.tenant = view.tenant or view.input.get("tenant")
        elif isinstance(rec, StepStarted):
            view.status, view.step, view.attempt = "running", rec.step, rec.attempt
        elif isinstance(rec, StepSucceeded):
            view.outputs[rec.step] = dict(rec.output)
        elif isinstance(rec, LastStepSucceeded):  # the last step's success and the end
            view.outputs[rec.step] = dict(rec.output)
            view.status, view.step, view.waiting_for = "completed", rec.step, None
        elif isinstance(rec, StepFailed):
            # Plain only: the code, and Voice's own words. A message that may quote someone is
            # sealed in the record, and staff and operators do not read participants' words.
            view.last_error = f"{rec.error_type}: {rec.error}" if rec.error else rec.error_type
            # Its failure names the step too (a log that lacks the attempt's StepStarted).
            view.step, view.attempt = rec.step, rec.attempt
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
            view.status, view.last_error = "failed", rec.error or rec.error_type
            view.step = rec.step


class Contributions(Projection[ContributionRecorded]):
    """The latest record of each contribution (its state), by id, and its tenant. An erased
    one is forgotten, and stays so: a review step's record landing after its erasure (a race
    the step's own check narrows but cannot close) does not bring it back."""

    def __init__(self) -> None:
        super().__init__()
        self.tenants: dict[str, str | None] = {}
        self.erased: set[str] = set()

    def tenant_of(self, key: str) -> str | None:
        return self.tenants.get(key)

    def authored(self, key: str, who: Caller) -> ContributionRecorded | None:
        """The contribution if ``who`` wrote it, in its tenant (else None: 404)."""
        c = self.in_tenant(key, who.tenant)
        return c if c is not None and c.author == who.sub else None

    def mark_erased(self, key: str) -> None:
        """Forget a contribution now (its key is gone), before the log says so."""
        self.erased.add(key)
        if self.by_key.pop(key, None) is not None:
            self.notify(key)

    def apply(self, env: Envelope) -> None:
        rec = env.record
        if isinstance(rec, ContributionErased):
            self.mark_erased(env.key)
            return
        if not isinstance(rec, ContributionRecorded) or env.key in self.erased:
            return
        current = self.by_key.get(env.key)
        if current is not None and current.state != "in_review" and rec.state == "in_review":
            return  # a late re-run of an earlier step; the outcome stands
        self.by_key[env.key] = rec
        self.tenants.setdefault(env.key, env.tenant)
        self.notify(env.key)


class Inboxes(StreamProjection[InboxView]):
    """Each recipient's inbox."""

    def apply(self, env: Envelope) -> None:
        rec = env.record
        if not isinstance(rec, NotificationRecorded) or env.seq is None:
            return
        view = self.by_key.get(env.key)
        if view is None:
            view = self.by_key[env.key] = InboxView(recipient=rec.recipient, tenant=env.tenant,
                                                    kept=self.kept)
        if not view.accept(env):
            return  # a writer's replay: same seq, same record
        if rec.notification not in view.ids:
            view.ids.add(rec.notification)
            view.keep(env)
        self.notify(env.key)

    def inbox(self, tenant: str, recipient: str) -> InboxView:
        """The recipient's inbox in ``tenant`` (empty when nothing came yet)."""
        return (self.by_key.get(inbox_key(tenant, recipient))
                or InboxView(recipient=recipient, tenant=tenant, kept=self.kept))


def of_a_turn(key: bytes | None) -> bool:
    """Whether a ``voice.workflows`` record's key is a turn's workflow (by key alone)."""
    return key is not None and workflow_turn(key.decode("utf-8", "replace")) is not None


class StaffViews:
    """Every issue, workflow, contribution, inbox and review queue this edge has seen."""

    def __init__(self, kept: int = DEFAULT_KEPT,
                 turn_workflows_kept: int = TURN_WORKFLOWS_KEPT,
                 cold_workflow: Callable[[str], list[Envelope]] | None = None) -> None:
        self.issues = Issues()
        self.investigations = self.issues.investigations
        self.workflows = Workflows(turn_workflows_kept, cold_workflow)
        self.contributions = Contributions()
        self.inboxes = Inboxes(kept)
        self.queues = ReviewQueues(kept)

    def handlers(self) -> dict[TopicSpec, RecordHandler]:
        """What the edge's tail feeds into these views, by topic."""
        return {WORKFLOWS: self.workflows.apply, CONTRIBUTIONS: self.contributions.apply,
                INBOX: self.inboxes.apply, REVIEW_QUEUE: self.queues.apply}

    def quiet_topics(self) -> tuple[TopicSpec, ...]:
        """The topics of these views that a conversation's turn does not write to (all but
        ``voice.workflows``, four records a turn): the edge's tail reads them apart
        (``EdgeTail(apart=…)``)."""
        return tuple(t for t in (*self.handlers(), *self.located_handlers()) if t != WORKFLOWS)

    def before_window(self) -> dict[TopicSpec, Callable[[bytes | None], bool]]:
        """What a windowed edge leaves unread at start when older than its window
        (``EdgeTail(before_window=…)``): the records of the turns' workflows, told by key — four
        or so a turn, most of ``voice.workflows``; their conversations are cold there too."""
        return {WORKFLOWS: of_a_turn}

    def located_handlers(self) -> dict[TopicSpec, LocatedHandler]:
        """Those that also need each record's partition and offset (``EdgeTail(located=…)``)."""
        return {ISSUES: self.issues.apply_at}

    def runs_of(self, issue: IssueView) -> list[WorkflowView]:
        """The research runs of an issue, in the order this edge saw them start."""
        return [w for w in self.workflows.values() if w.kind == "research"
                and w.tenant == issue.tenant
                and (w.input.get("issue") or {}).get("issue") == issue.issue]

    def contributions_of(self, issue: IssueView) -> list[ContributionRecorded]:
        return [c for key, c in self.contributions.by_key.items() if c.issue == issue.issue
                and self.contributions.tenant_of(key) == issue.tenant]
