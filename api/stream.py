"""``GET /me/conversations/{conversation}/stream``: the conversation's log as Server-Sent Events.

``id:`` is the conversation's seq. A client resumes with ``after=N`` or ``Last-Event-ID: N``
(the query wins) and gets every event after N once, in order, then live ones. Records clients
do not see (``ConversationStarted``, ``TurnRequested``) are skipped, so ids have gaps. Comments
carry no id: keep-alives after ``KEEPALIVE_S`` of silence, and a final one before the gateway
bound saying where to resume. A cursor older than this edge keeps answers 409 with the oldest
cursor it can serve (``api.app`` renders ``CursorTooOld``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Query
from fastapi.exceptions import RequestValidationError
from fastapi.sse import EventSourceResponse, ServerSentEvent

from api import render
from api.deps import OwnedDep, SealerDep, SettingsDep, ViewsDep
from api.models import CursorTooOldOut
from api.views import ConversationView, CursorTooOld
from streams.sealing import KeyErased

router = APIRouter(prefix="/me/conversations", tags=["conversations"])

KEEPALIVE_S = 5.0
"""Silence after which a keep-alive comment is sent (a third of the bound, if smaller)."""
END_MARGIN_S = 1.0
"""The stream ends this long before the gateway bound (a third of the bound, if smaller)."""


def resume_cursor(after: int | None, last_event_id: str | None) -> int:
    """Where an SSE stream resumes: ``after`` wins over ``Last-Event-ID``; 0 from the start.

    A ``Last-Event-ID`` that is not a non-negative integer answers 422 naming the header.
    """
    if after is not None:
        return after
    if last_event_id is None or not last_event_id.strip():
        return 0
    try:
        value = int(last_event_id.strip())
    except ValueError:
        value = -1
    if value < 0:
        raise RequestValidationError([{
            "type": "int_parsing", "loc": ("header", "Last-Event-ID"), "input": last_event_id,
            "msg": "Last-Event-ID must be a non-negative integer (an event id of this stream)",
        }])
    return value


async def stream_cursor(
    view: OwnedDep,
    after: Annotated[int | None, Query(ge=0, description="Resume after this seq (an event "
                                                          "id); wins over Last-Event-ID.")] = None,
    last_event_id: Annotated[str | None, Header(alias="Last-Event-ID")] = None,
) -> int:
    """Where the stream starts; ``CursorTooOld`` (→ 409) when this edge cannot serve it."""
    return served_cursor(view, resume_cursor(after, last_event_id))


def served_cursor(view: Any, cursor: int) -> int:
    """``cursor``, if ``view`` (a conversation's, for its SSE stream) still keeps every event
    after it; else ``CursorTooOld`` with the oldest cursor it can serve (→ 409)."""
    oldest = view.oldest_cursor()
    if cursor < oldest:
        raise CursorTooOld(view.conversation, cursor, oldest)
    return cursor


CursorDep = Annotated[int, Depends(stream_cursor)]


@router.get(
    "/{conversation}/stream",
    response_class=EventSourceResponse,
    responses={404: {"description": "No such conversation of the caller's."},
               409: {"description": "The cursor is older than this edge keeps; reconnect "
                                    "with after=oldest_cursor.",
                     "content": {"application/json": {
                         "schema": CursorTooOldOut.model_json_schema()}}}},
)
async def stream(
    view: OwnedDep, cursor: CursorDep, settings: SettingsDep, views: ViewsDep, sealer: SealerDep,
) -> AsyncIterator[ServerSentEvent]:
    """Events: ``message`` (participant's or agent's), ``proposal``, ``turn``."""
    conversation = view.conversation
    loop = asyncio.get_running_loop()
    bound = settings.gateway_bound_s
    end_at = loop.time() + bound - min(END_MARGIN_S, bound / 3)
    keepalive = min(KEEPALIVE_S, bound / 3)
    last_sent = loop.time()

    def moved(v: ConversationView | None) -> bool:
        return v is None or v.erased or v.last_seq > cursor

    while True:
        current = views.by_id.get(conversation)
        if current is None or current.erased:
            yield ServerSentEvent(comment="end; the conversation was erased")
            return
        try:
            events = current.events_after(cursor)
        except CursorTooOld as exc:  # this client fell behind what the edge keeps
            yield ServerSentEvent(comment=f"end; cursor {cursor} is too old, "
                                          f"the oldest this edge serves is {exc.oldest}")
            return
        for env in events:
            if loop.time() >= end_at:
                break
            try:
                sse = render.sse_event(sealer, env)
            except KeyErased:
                views.mark_erased(conversation)
                yield ServerSentEvent(comment="end; the conversation was erased")
                return
            assert env.seq is not None
            cursor = env.seq
            if sse is not None:
                yield sse
                last_sent = loop.time()
        now = loop.time()
        if now >= end_at:
            break
        if now - last_sent >= keepalive:
            yield ServerSentEvent(comment="keep-alive")
            last_sent = now
        await views.wait(conversation, moved, max(0.0, min(end_at, last_sent + keepalive) - now))
    yield ServerSentEvent(comment=f"end; reconnect with after={cursor}")
