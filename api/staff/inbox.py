"""The caller's inbox: ``GET /me/inbox`` (poll) and ``GET /me/inbox/stream`` (Server-Sent Events).

The stream is the frame's SSE loop (``api.frame.sse``), with its resume contract: ``id:`` is
the inbox's dense seq (given by the recipient's single writer); a notification seen before
under another seq (a writer's replay) is not shown twice, so ids may have gaps.
"""

from __future__ import annotations

from functools import partial
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Response
from fastapi.sse import EventSourceResponse, ServerSentEvent
from pydantic import BaseModel

from api.frame.deps import PublicDep, SettingsDep
from api.frame.models import sse_event_schema
from api.frame.quotas import TOO_MANY, stream_slot
from api.frame.sse import (
    TOO_OLD,
    Feed,
    cursor_dependency,
    event_stream,
    served_cursor,
    sse_stream,
)
from api.staff.deps import StaffViewsDep
from api.staff.views import InboxView
from schemas.staff import NotificationRecorded
from streams.envelope import Envelope
from streams.ids import inbox_key

router = APIRouter(prefix="/me/inbox", tags=["inbox"])


class NotificationOut(BaseModel):
    """One update in the inbox (``event: notification`` on the stream)."""

    seq: int
    notification: str
    issue: str
    development: str
    title: str
    body: str
    at: str


class InboxOut(BaseModel):
    recipient: str
    last_seq: int
    notifications: list[NotificationOut]


def notification_out(env: Envelope) -> NotificationOut:
    rec = env.record
    assert isinstance(rec, NotificationRecorded) and env.seq is not None
    return NotificationOut(seq=env.seq, notification=rec.notification, issue=rec.issue,
                           development=rec.development, title=rec.title, body=rec.body,
                           at=rec.at)


async def my_inbox(principal: PublicDep, views: StaffViewsDep) -> InboxView:
    """The caller's inbox (empty when nothing came yet)."""
    return views.inboxes.inbox(principal.tenant, principal.sub)


InboxDep = Annotated[InboxView, Depends(my_inbox)]
CursorDep = Annotated[int, Depends(cursor_dependency(my_inbox))]


@router.get("", responses=TOO_OLD)
async def get_inbox(
    view: InboxDep,
    after: Annotated[int | None, Query(ge=0, description="Only notifications after this seq; "
                                                          "all kept ones when omitted.")] = None,
) -> InboxOut:
    """The caller's notifications after ``after`` (all this edge keeps by default), in order."""
    cursor = served_cursor(view, view.oldest_cursor() if after is None else after)
    return InboxOut(recipient=view.recipient, last_seq=view.last_seq,
                    notifications=[notification_out(e) for e in view.events_after(cursor)])


STREAM_EVENTS = {200: {
    "description": "The inbox's notifications after the cursor, then live ones.",
    "content": {"text/event-stream": {
        "schema": sse_event_schema("notification", NotificationOut)}}}}


@router.get("/stream", response_class=Response, response_model=None,
            dependencies=[stream_slot("issues.public")],
            responses={**STREAM_EVENTS, **TOO_OLD, **TOO_MANY})
async def stream_inbox(view: InboxDep, cursor: CursorDep, settings: SettingsDep,
                       views: StaffViewsDep) -> EventSourceResponse:
    """Events: ``notification``, each with ``id:`` = the inbox seq."""
    tenant, recipient = view.tenant or "", view.recipient
    key = inbox_key(tenant, recipient)

    def render(env: Envelope) -> ServerSentEvent:
        out = notification_out(env)
        return ServerSentEvent(event="notification", id=str(out.seq), data=out)

    feed = Feed(view=lambda: views.inboxes.inbox(tenant, recipient), render=render,
                wait=partial(views.inboxes.changed, key))
    return event_stream(sse_stream(feed, cursor, settings.gateway_bound_s))
