"""The tenant's review queue, live: ``GET /staff/reviews/queue`` (what waits for a reviewer,
and the seq it is as of) and ``GET /staff/reviews/stream`` (Server-Sent Events).

Both read one log, the tenant's ``voice.review-queue`` (``api.staff.queue_view``), whose single
writer gives every event a dense seq: the stream's ``id:``. A page reads the queue once, then
follows the stream after its ``last_seq``, so it misses nothing between the two and resumes on
any edge (``after`` or ``Last-Event-ID``, the frame's SSE loop ``api.frame.sse``). Readers are
those who may read reviews (``reviews.read``), each in its own tenant only.
"""

from __future__ import annotations

from functools import partial
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Response
from fastapi.sse import EventSourceResponse, ServerSentEvent
from pydantic import BaseModel

from api.frame.deps import SettingsDep
from api.frame.models import sse_event_schema
from api.frame.quotas import TOO_MANY, stream_slot
from api.frame.sse import TOO_OLD, Feed, cursor_dependency, event_stream, sse_stream
from api.staff.deps import ReviewReadDep, StaffViewsDep
from api.staff.queue_view import ReviewQueueView
from api.staff.reviews import ReviewerOut
from schemas.staff import QueueEventRecorded
from streams.envelope import Envelope
from streams.ids import review_queue_key

router = APIRouter(prefix="/staff/reviews", tags=["staff"])


class QueueEventOut(BaseModel):
    """One event of the queue (``event: queue`` on the stream): the contribution's entry as
    it stands after it. ``waiting_for`` ``null``: it no longer waits for a reviewer."""

    seq: int
    event: Literal["entered", "reviewed", "published", "rejected", "erased"]
    contribution: str
    issue: str
    waiting_for: Literal["review", "second_review"] | None
    flag_count: int
    flag_kinds: list[str]
    reviews: list[ReviewerOut]
    redacted_spans: int
    """On ``published``: how many spans were redacted."""
    submitted_at: str
    at: str


class ReviewQueueOut(BaseModel):
    """The contributions waiting for a reviewer, oldest first, as of ``last_seq`` (follow the
    stream with ``after=last_seq``)."""

    last_seq: int
    waiting: list[QueueEventOut]


def queue_event_out(env: Envelope) -> QueueEventOut:
    rec = env.record
    assert isinstance(rec, QueueEventRecorded) and env.seq is not None
    return QueueEventOut(seq=env.seq, event=rec.event, contribution=rec.contribution,
                         issue=rec.issue, waiting_for=rec.waiting_for,
                         flag_count=rec.flag_count, flag_kinds=list(rec.flag_kinds),
                         reviews=[ReviewerOut(**r.model_dump()) for r in rec.reviews],
                         redacted_spans=rec.redacted_spans, submitted_at=rec.submitted_at,
                         at=rec.at)


async def my_queue(principal: ReviewReadDep, views: StaffViewsDep) -> ReviewQueueView:
    """The caller's tenant's review queue (empty when nothing came yet)."""
    return views.queues.queue(principal.tenant)


QueueDep = Annotated[ReviewQueueView, Depends(my_queue)]
CursorDep = Annotated[int, Depends(cursor_dependency(my_queue))]


@router.get("/queue")
async def get_review_queue(view: QueueDep, views: StaffViewsDep) -> ReviewQueueOut:
    """What waits for a reviewer now, oldest first, with the seq to follow the stream from."""
    # Erased on this edge a moment ago, its ``erased`` event not yet back from the log: gone.
    waiting = sorted((queue_event_out(e) for c, e in view.waiting.items()
                      if c not in views.contributions.erased), key=lambda e: e.submitted_at)
    return ReviewQueueOut(last_seq=view.last_seq, waiting=waiting)


STREAM_EVENTS = {200: {
    "description": "The queue's events after the cursor, then live ones.",
    "content": {"text/event-stream": {"schema": sse_event_schema("queue", QueueEventOut)}}}}


@router.get("/stream", response_class=Response, response_model=None,
            dependencies=[stream_slot("reviews.read")],
            responses={**STREAM_EVENTS, **TOO_OLD, **TOO_MANY})
async def stream_review_queue(view: QueueDep, cursor: CursorDep, settings: SettingsDep,
                              views: StaffViewsDep) -> EventSourceResponse:
    """Events: ``queue``, each with ``id:`` = the queue's seq (resume with ``after`` or
    ``Last-Event-ID``)."""
    tenant = view.tenant or ""
    key = review_queue_key(tenant)

    def render(env: Envelope) -> ServerSentEvent:
        out = queue_event_out(env)
        return ServerSentEvent(event="queue", id=str(out.seq), data=out)

    feed = Feed(view=lambda: views.queues.queue(tenant), render=render,
                wait=partial(views.queues.changed, key))
    return event_stream(sse_stream(feed, cursor, settings.gateway_bound_s))
