"""The review-queue writer: the aggregate whose single writer appends each tenant's review queue
(``voice.review-queue``), and the one place its events' ids and commands are built.

The disclosure-review workflow (``consumers.staff.review``) notes what happens to a
contribution — it entered the queue, a reviewer reviewed it, it was published or rejected — as
a ``NoteQueueEvent`` command keyed by the tenant's queue key. One writer per tenant gives each
event the next dense seq, which is the queue stream's ``id:`` at every edge (and after every
restart): that is what lets ``GET /staff/reviews/stream`` resume with ``Last-Event-ID``.

An event's id is derived from the contribution and the step (``streams.ids.queue_event_id``),
never from an attempt, so a step that re-runs after a crash notes the same event again and the
writer records it once (``consumers.frame.record_once``: dedupe, seq, the bound of ``MAX_EVENTS``
ids per tenant).

It never opens sealed content: a queue event carries counts and kinds, not the text.
"""

from __future__ import annotations

from consumers.frame.record_once import RecordOnceLog
from schemas.staff import NoteQueueEvent, QueueEventRecorded
from streams.envelope import Envelope
from streams.ids import queue_event_id, review_queue_key
from streams.topics import REVIEW_QUEUE

__all__ = ["MAX_EVENTS", "ReviewQueueWriter", "note", "queue_event_id"]

SOURCE = "/voice/review-queue-writer"
MAX_EVENTS = 4096
"""Event ids a tenant's queue remembers (a few per contribution)."""


def note(item: NoteQueueEvent, tenant: str | None, source: str, correlation: str) -> Envelope:
    """The command noting ``item`` in ``tenant``'s queue (its envelope id is the event id)."""
    key = review_queue_key(tenant)
    return Envelope(record=item, key=key, source=source, subject=key, tenant=tenant,
                    correlation=correlation, id=item.queue_event)


class ReviewQueueWriter(RecordOnceLog):
    """Review queues: each event recorded once, in order, per tenant."""

    name = "staff_review_queues"
    what = "review queue"
    log = REVIEW_QUEUE
    source = SOURCE
    commands = (NoteQueueEvent,)
    recorded = QueueEventRecorded
    item_id = "queue_event"
    limit = MAX_EVENTS
    # A workflow step notes events without waiting on an answer: none is produced.
    answers = False

    def belongs(self, cmd: Envelope) -> bool:
        """Only the tenant's own queue key (a misrouted or forged command is noted nowhere)."""
        return cmd.key == review_queue_key(cmd.tenant)
