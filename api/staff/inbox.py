"""The caller's inbox: ``GET /me/inbox`` (poll) and ``GET /me/inbox/stream`` (Server-Sent Events).

Same resume contract as a conversation's stream: ``id:`` is the inbox's dense seq (given by
the recipient's single writer); ``after=N`` or ``Last-Event-ID: N`` (the query wins) gets every
notification after N once, in order, then live ones; keep-alive comments carry no id; the
stream ends with a comment before the gateway bound; a cursor older than this edge keeps is a
409 naming the oldest cursor it can serve. Notifications are deduped by id here as well, so a
writer's replay never shows one twice.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Depends, Header, Query
from fastapi.sse import EventSourceResponse, ServerSentEvent
from pydantic import BaseModel

from api.deps import PrincipalDep, SettingsDep
from api.models import CursorTooOldOut
from api.staff import StaffViewsDep
from api.stream import resume_cursor
from api.views import CursorTooOld
from schemas.staff import NotificationRecorded
from streams.envelope import Envelope

router = APIRouter(prefix="/me/inbox", tags=["inbox"])

KEEPALIVE_S = 5.0
"""Silence after which a keep-alive comment is sent (a third of the bound, if smaller)."""
END_MARGIN_S = 1.0
"""The stream ends this long before the gateway bound (a third of the bound, if smaller)."""
TOO_OLD = {409: {"description": "The cursor is older than this edge keeps; reconnect with "
                                "after=oldest_cursor.",
                 "content": {"application/json": {"schema": CursorTooOldOut.model_json_schema()}}}}


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


async def inbox_cursor(
    principal: PrincipalDep, views: StaffViewsDep,
    after: Annotated[int | None, Query(ge=0, description="Resume after this seq (an event "
                                                          "id); wins over Last-Event-ID.")] = None,
    last_event_id: Annotated[str | None, Header(alias="Last-Event-ID")] = None,
) -> int:
    """Where the caller's inbox is read from; ``CursorTooOld`` (→ 409) when too old."""
    cursor = resume_cursor(after, last_event_id)
    oldest = views.inbox(principal.sub).oldest_cursor()
    if cursor < oldest:
        raise CursorTooOld(f"inbox of {principal.sub}", cursor, oldest)
    return cursor


CursorDep = Annotated[int, Depends(inbox_cursor)]


@router.get("", responses=TOO_OLD)
async def get_inbox(
    principal: PrincipalDep, views: StaffViewsDep,
    after: Annotated[int | None, Query(ge=0, description="Only notifications after this seq; "
                                                          "all kept ones when omitted.")] = None,
) -> InboxOut:
    """The caller's notifications after ``after`` (all this edge keeps by default), in order."""
    view = views.inbox(principal.sub)
    cursor = view.oldest_cursor() if after is None else after
    if cursor < view.oldest_cursor():
        raise CursorTooOld(f"inbox of {principal.sub}", cursor, view.oldest_cursor())
    return InboxOut(recipient=principal.sub, last_seq=view.last_seq,
                    notifications=[notification_out(e) for e in view.after(cursor)])


@router.get("/stream", response_class=EventSourceResponse, responses=TOO_OLD)
async def stream_inbox(principal: PrincipalDep, cursor: CursorDep, settings: SettingsDep,
                       views: StaffViewsDep) -> AsyncIterator[ServerSentEvent]:
    """Events: ``notification``, each with ``id:`` = the inbox seq."""
    recipient = principal.sub
    loop = asyncio.get_running_loop()
    bound = settings.gateway_bound_s
    end_at = loop.time() + bound - min(END_MARGIN_S, bound / 3)
    keepalive = min(KEEPALIVE_S, bound / 3)
    last_sent = loop.time()
    while True:
        view = views.inbox(recipient)
        if cursor < view.oldest_cursor():  # fell behind what the edge keeps while connected
            yield ServerSentEvent(comment=f"end; cursor {cursor} is too old, the oldest this "
                                          f"edge serves is {view.oldest_cursor()}")
            return
        for env in view.after(cursor):
            if loop.time() >= end_at:
                break
            out = notification_out(env)
            cursor = out.seq
            yield ServerSentEvent(event="notification", id=str(out.seq), data=out)
            last_sent = loop.time()
        now = loop.time()
        if now >= end_at:
            break
        # Seqs the view skipped (a notification id seen before) are passed too.
        cursor = max(cursor, view.last_seq)
        if now - last_sent >= keepalive:
            yield ServerSentEvent(comment="keep-alive")
            last_sent = now
        await views.wait(f"inbox:{recipient}",
                         lambda seen=cursor: views.inbox(recipient).last_seq > seen,
                         max(0.0, min(end_at, last_sent + keepalive) - now))
    yield ServerSentEvent(comment=f"end; reconnect with after={cursor}")
