"""The developments consumer: one update-delivery workflow per development, one at a time per
issue, in the order the issue's log recorded them.

It reads the issue log (key = issue, so an issue's followers, developments and delivery ends
arrive in order) and keeps per issue the followers, the developments waiting, and the one being
delivered (a Faust table value). A development is started when none is being delivered; the
next one when the issue's log records that the previous delivery ended (``DeliveryEnded``,
written by the issue writer when the workflow completed or failed).

``apply_development`` is pure and deduplicates by the log's seq; a start replayed after a crash
produces the same ``WorkflowStarted`` (id ``{workflow}:1``), which the workflow engine ignores
for a workflow it already has.
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, field
from typing import Any

from schemas.staff import (
    DeliveryEnded,
    DevelopmentRecorded,
    FollowerAdded,
    FollowerRemoved,
    IssueOpened,
)
from schemas.workflow import WorkflowStarted
from streams.envelope import Envelope

KIND = "update-delivery"
SOURCE = "/voice/developments"


@dataclass
class DeliveryQueue:
    """Per issue: what the next delivery needs and what is waiting (a table value)."""

    last_seq: int = 0
    issue_title: str = ""
    followers: list[str] = field(default_factory=list)
    waiting: list[dict[str, Any]] = field(default_factory=list)
    """Developments recorded but not started, oldest first."""
    active: str | None = None
    """The development whose workflow runs now."""

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> DeliveryQueue:
        return cls() if d is None else cls(**copy.deepcopy(d))

    def to_dict(self) -> dict[str, Any]:
        return copy.deepcopy(asdict(self))


def _start(q: DeliveryQueue, env: Envelope) -> Envelope | None:
    if q.active is not None or not q.waiting:
        return None
    dev = q.waiting.pop(0)
    q.active = dev["development"]
    started = WorkflowStarted(workflow=q.active, kind=KIND, input={
        **dev, "issue_title": q.issue_title, "followers": sorted(q.followers),
        "tenant": env.tenant})
    return Envelope(record=started, key=q.active, source=SOURCE, subject=q.active, seq=1,
                    tenant=env.tenant, correlation=q.active, causation=env.id,
                    id=f"{q.active}:1")


def apply_development(queue: DeliveryQueue | None, env: Envelope
                      ) -> tuple[DeliveryQueue, Envelope | None]:
    """Apply one issue-log record; returns (new queue, workflow to start or None)."""
    q = copy.deepcopy(queue) or DeliveryQueue()
    if env.seq is not None:
        if env.seq <= q.last_seq:
            return q, None  # redelivered
        q.last_seq = env.seq
    rec = env.record
    if isinstance(rec, IssueOpened):
        q.issue_title = rec.title
    elif isinstance(rec, FollowerAdded):
        if rec.participant not in q.followers:
            q.followers.append(rec.participant)
    elif isinstance(rec, FollowerRemoved):
        if rec.participant in q.followers:
            q.followers.remove(rec.participant)
    elif isinstance(rec, DevelopmentRecorded):
        q.waiting.append({"issue": rec.issue, "development": rec.development,
                          "title": rec.title, "body": rec.body, "by": rec.by, "at": rec.at})
    elif isinstance(rec, DeliveryEnded):
        if q.active == rec.development:
            q.active = None
    return q, _start(q, env)
