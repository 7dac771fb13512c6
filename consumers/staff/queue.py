"""The review-queue writer: the aggregate whose single writer appends each tenant's review queue
(``voice.review-queue``), and the one place its events' ids and commands are built.

The disclosure-review workflow (``consumers.staff.review``) notes what happens to a
contribution — it entered the queue, a reviewer reviewed it, it was published or rejected — as
a ``NoteQueueEvent`` command keyed by the tenant's queue key. One writer per tenant gives each
event the next dense seq, which is the queue stream's ``id:`` at every edge (and after every
restart): that is what lets ``GET /staff/reviews/stream`` resume with ``Last-Event-ID``.

An event's id is derived from the contribution and the step (``streams.ids.queue_event_id``),
never from an attempt, so a step that re-runs after a crash notes the same event again and the
writer records it once. The writer remembers the last ``MAX_EVENTS`` ids per tenant; a redelivery
older than that would be recorded again, so readers also dedupe by event id.

It never opens sealed content: a queue event carries counts and kinds, not the text.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from consumers.frame import Aggregate, AggregateState, Decision, append, remember
from schemas.base import Record
from schemas.staff import NoteQueueEvent, QueueEventRecorded
from streams.envelope import Envelope
from streams.ids import queue_event_id, review_queue_key
from streams.topics import REVIEW_QUEUE

__all__ = ["MAX_EVENTS", "QueueState", "ReviewQueueWriter", "note", "queue_event_id"]

SOURCE = "/voice/review-queue-writer"
MAX_EVENTS = 4096
"""Event ids a tenant's queue remembers (a few per contribution)."""


def note(item: NoteQueueEvent, tenant: str | None, source: str, correlation: str) -> Envelope:
    """The command noting ``item`` in ``tenant``'s queue (its envelope id is the event id)."""
    key = review_queue_key(tenant)
    return Envelope(record=item, key=key, source=source, subject=key, tenant=tenant,
                    correlation=correlation, id=item.queue_event)


@dataclass(kw_only=True)
class QueueState(AggregateState):
    """What the writer keeps per tenant (a Faust table value, as a dict)."""

    recorded: dict[str, int] = field(default_factory=dict)
    """event id → the seq it got (insertion-ordered, bounded)."""


class ReviewQueueWriter(Aggregate[QueueState]):
    """Review queues: each event recorded once, in order, per tenant."""

    name = "staff_review_queues"
    what = "review queue"
    state = QueueState
    log = REVIEW_QUEUE
    source = SOURCE
    commands = (NoteQueueEvent,)

    def acknowledges(self, cmd: Envelope) -> bool:  # noqa: ARG002
        # A workflow step notes events without waiting on an answer: none is produced.
        return False

    def remembered(self, state: QueueState | None, cmd: Envelope) -> dict[str, Any] | None:
        rec = cmd.record
        if state is None or not isinstance(rec, NoteQueueEvent):
            return None
        seq = state.recorded.get(rec.queue_event)
        return None if seq is None else {"seq": seq}

    def remember(self, state: QueueState, cmd: Envelope,
                 memo: dict[str, Any]) -> None:  # noqa: ARG002 - no answer to repeat
        rec = cmd.record
        assert isinstance(rec, NoteQueueEvent)
        remember(state.recorded, rec.queue_event, state.seq, MAX_EVENTS)

    def record_id(self, cmd: Envelope, seq: int, record: Record) -> str:  # noqa: ARG002
        assert isinstance(record, QueueEventRecorded)
        return record.queue_event

    def decide(self, state: QueueState | None, cmd: Envelope) -> Decision[QueueState]:
        """Record one event in its tenant's queue (no acknowledgement: nobody waits on it)."""
        rec = cmd.record
        if not isinstance(rec, NoteQueueEvent) or cmd.key != review_queue_key(cmd.tenant):
            # Not this tenant's queue (a misrouted or forged command): noted nowhere.
            return Decision(state)
        state = state or QueueState()
        fields = rec.model_dump()
        records = append(state, QueueEventRecorded(**fields, at=cmd.time.isoformat()))
        return Decision(state, records)
