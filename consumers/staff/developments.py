"""The developments handler: one update-delivery workflow per development, one at a time per
issue, in the order the issue's log recorded them.

The issue's writer tells it each record it put on the issue log (``ctx.on_recorded``, decision
0016: one writer per issue, so its followers, developments and delivery ends come in the log's
order) and it keeps per issue where the issue's records are and which developments
wait (a Faust table value). A development is started when none is being delivered; the next
one when the issue's log records that the previous delivery ended (``DeliveryEnded``,
written by the issue writer when the workflow completed or failed).

Nothing here copies what grows with the issue: the workflow's input names the development's
record by position and the followers by a span of the issue's log — from the issue's first
record to its seq at the start (``through``) — which the steps read back
(``consumers.frame.logrefs``). A copy of the followers made one record (the input, its
changelog, every edge's view) grow with their number, past the record bound.

``apply_development`` is pure and deduplicates by the log's seq; a start replayed after a crash
produces the same ``WorkflowStarted`` (id ``{workflow}:1``), which the workflow engine ignores
for a workflow it already has.
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, field
from typing import Any

from consumers.frame.logrefs import Position
from schemas.staff import DeliveryEnded, DevelopmentRecorded, IssueOpened
from schemas.workflow import WorkflowStarted
from streams.envelope import Envelope

KIND = "update-delivery"
SOURCE = "/voice/developments"


@dataclass
class DeliveryQueue:
    """Per issue: where its records are and what is waiting (a table value; small: a few
    numbers per development waiting, nothing per follower)."""

    last_seq: int = 0
    issue_title: str = ""
    partition: int | None = None
    """The partition of ``voice.issues`` holding the issue's log."""
    opened: int | None = None
    """The offset of the issue's first record there (where a follower scan starts)."""
    waiting: list[dict[str, Any]] = field(default_factory=list)
    """Developments recorded but not started, oldest first: id, seq and offset."""
    active: str | None = None
    """The development whose workflow runs now."""

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> DeliveryQueue:
        if d is None:
            return cls()
        d = copy.deepcopy(d)
        d.pop("followers", None)  # kept before the followers were read from the log
        return cls(**d)

    def to_dict(self) -> dict[str, Any]:
        return copy.deepcopy(asdict(self))


def _start(q: DeliveryQueue, env: Envelope) -> Envelope | None:
    if q.active is not None or not q.waiting:
        return None
    dev = q.waiting.pop(0)
    q.active = dev["development"]
    started = WorkflowStarted(workflow=q.active, kind=KIND, input={
        "issue": env.key, "development": dev["development"], "issue_title": q.issue_title,
        "partition": q.partition, "opened": q.opened or 0, "record": dev["record"],
        "through": q.last_seq, "tenant": env.tenant})
    return Envelope(record=started, key=q.active, source=SOURCE, subject=q.active, seq=1,
                    tenant=env.tenant, correlation=q.active, causation=env.id,
                    id=f"{q.active}:1")


def apply_development(queue: DeliveryQueue | None, env: Envelope, partition: int,
                      offset: int) -> tuple[DeliveryQueue, Envelope | None]:
    """Apply one issue-log record (at ``partition``@``offset``); returns (new queue, workflow
    to start or None)."""
    q = copy.deepcopy(queue) or DeliveryQueue()
    if env.seq is not None:
        if env.seq <= q.last_seq:
            return q, None  # redelivered
        q.last_seq = env.seq
    if q.partition is None:
        q.partition, q.opened = partition, offset
    rec = env.record
    if isinstance(rec, IssueOpened):
        q.issue_title = rec.title
    elif isinstance(rec, DevelopmentRecorded) and env.seq is not None:
        q.waiting.append({"development": rec.development,
                          "record": Position(env.seq, offset).to_json()})
    elif isinstance(rec, DeliveryEnded):
        if q.active == rec.development:
            q.active = None
    return q, _start(q, env)
