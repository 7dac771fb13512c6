"""Participant routes over conversations (``/me/conversations``), the stream included.

Every route answers at once from a Kafka ack or this edge's view of the log; none waits for
a model. Content is sealed here before it is produced and opened here only for its owner.
The stream is the frame's SSE loop (``api.frame.sse``) rendering records with
``render.event_frame``: records clients do not see (``ConversationStarted``, ``TurnRequested``)
are skipped, so ids have gaps.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Annotated

from fastapi import APIRouter, Depends, Header, HTTPException, Query, Request, Response
from fastapi.sse import EventSourceResponse, ServerSentEvent

from api.conversations import render
from api.conversations.listing import StartOrdered, newest_before
from api.conversations.models import (
    AgentMessageEvent,
    ConversationCreated,
    ConversationOut,
    ConversationSummary,
    DeltaEvent,
    MessageAccepted,
    MessageIn,
    MessageOut,
    ParticipantMessageEvent,
    ProposalEvent,
    TurnEvent,
    TurnOut,
)
from api.conversations.owners import OwnerIndex
from api.conversations.views import ConversationView, ConversationViews
from api.frame.cold import ColdReadFailed
from api.frame.commands import CommandsDep, conversation_refused, refused
from api.frame.deadline import cut_short, remaining
from api.frame.deps import (
    VIEW_WAIT_S,
    ConverseDep,
    SealerDep,
    SettingsDep,
    allowed,
    behind,
    check_text_size,
    check_turn,
    ensured,
    known,
    no_turn,
    not_found,
    owned_dependency,
    owned_view,
    principal_from,
    with_key,
)
from api.frame.lane import LaneRoute, StreamParams
from api.frame.models import CancelRequested, HeaderText, sse_event_schema
from api.frame.quotas import TOO_MANY, edge_quotas, hold_stream, quota, stream_slot
from api.frame.sse import (
    TOO_OLD,
    EventStream,
    Feed,
    Frame,
    StreamEnd,
    cursor_dependency,
    event_stream,
    sse_stream,
)
from schemas.conversation import EraseConversation, MessageRecorded, SendMessage, StartConversation
from streams.envelope import Envelope, new_id
from streams.ids import CONVERSATION_ID as CONVERSATION_ID_PATTERN
from streams.ids import new_conversation_id, owner_key
from streams.sealing import KeyErased, KeyNotFound, Sealer
from streams.settings import VoiceSettings

router = APIRouter(prefix="/me/conversations", tags=["conversations"])

CONVERSATION_ID = re.compile(CONVERSATION_ID_PATTERN)
NOT_FOUND = {404: {"description": "No such conversation of the caller's (or it was erased)."}}
TRANSCRIPT_PAGE = 200
"""Messages, replies and proposals on a transcript page by default."""
TRANSCRIPT_PAGE_MAX = 500
"""The most on one page: one request's rendering stays bounded however long the conversation
(each message up to ``VOICE_MAX_MESSAGE_BYTES``; the whole of an hour at the message quota
took ~0.5 s of the event loop, every stream of the edge waiting)."""


async def get_views(request: Request) -> ConversationViews:
    return request.app.state.views


def valid_conversation(conversation: str) -> bool:
    """Whether ``conversation`` is a conversation id at all (else 404 without a lookup)."""
    return CONVERSATION_ID.match(conversation) is not None


owned_conversation = owned_dependency(
    get_views, valid=valid_conversation,
    description="The conversation id (cnv-…).")


async def get_owners(request: Request) -> OwnerIndex | None:
    return request.app.state.owners


ViewsDep = Annotated[ConversationViews, Depends(get_views)]
OwnersDep = Annotated[OwnerIndex | None, Depends(get_owners)]
OwnedDep = Annotated[ConversationView, Depends(owned_conversation)]
CursorDep = Annotated[int, Depends(cursor_dependency(owned_conversation, reads_older=True))]


@contextmanager
def opening(views: ConversationViews, conversation: str) -> Iterator[None]:
    """Turn ``KeyErased`` (erased by another edge, not yet on this edge's view) into 404."""
    try:
        yield
    except KeyErased:
        views.mark_erased(conversation)
        raise not_found("conversation", conversation) from None


@router.post("", status_code=201, dependencies=[quota("conversations")], responses=TOO_MANY)
async def create_conversation(
    commands: CommandsDep, views: ViewsDep, sealer: SealerDep, principal: ConverseDep,
) -> ConversationCreated:
    """Open a conversation owned by the caller."""
    conversation = new_conversation_id()
    # The data key exists before the conversation does, so its first message can be sealed.
    await asyncio.to_thread(sealer.create, conversation, principal.tenant)
    ack = await commands.submit(
        conversation, StartConversation(conversation=conversation, owner=principal.sub))
    # "duplicate" is this very command answered again (its writer crashed after applying it,
    # before acknowledging): the conversation exists, opened by this request.
    if ack.outcome == "rejected":
        raise refused(ack, "conversation not opened")
    # Read-your-writes on this edge: the ack may overtake the log record by a moment.
    await known(views, conversation)
    return ConversationCreated(conversation=conversation)


def erased_or_unknown(sealer: Sealer, conversation: str) -> bool:
    """Whether this edge knows ``conversation``'s data key gone (erased), or knows no key of
    it at all (its tombstone compacted away): either way it is not listed. A dict lookup."""
    if not sealer.holds(conversation):
        return True
    try:
        sealer.check_live(conversation)
    except (KeyErased, KeyNotFound):
        return True
    return False


LIST_PAGE = 1000
"""Conversations on a page of ``GET /me/conversations`` by default, and at most: a participant
at the daily quota has ~180,000 after a year, and one answer of them all (each checked against
the key ring) cost the edge ~60 ms of its event loop and megabytes each time."""


@router.get("", responses={503: {"description": "This edge's read of the caller's entries in "
                                                "the index by owner failed, or runs on; "
                                                "try again."}})
async def list_conversations(
    views: ViewsDep, owners: OwnersDep, sealer: SealerDep, principal: ConverseDep,
    request: Request, response: Response,
    before: Annotated[str | None, Query(
        pattern=CONVERSATION_ID_PATTERN,
        description="Only conversations that started before this one: the `before` of the "
                    "`Link: <…>; rel=\"next\"` header of the page after it. Omitted: the "
                    "newest page.")] = None,
    limit: Annotated[int, Query(
        ge=1, le=LIST_PAGE,
        description=f"Conversations on the page, at most {LIST_PAGE}.")] = LIST_PAGE,
) -> list[ConversationSummary]:
    """The caller's conversations, not erased, in the order they started, a page at a time:
    the newest ``limit`` of those that started before ``before``. When older ones remain, a
    ``Link`` header with ``rel="next"`` names the page before. On an edge that holds only the
    conversations in use (``VOICE_EDGE_HISTORY_S``) the index by owner lists the others, with
    ``last_seq`` null: open one to read it (decision 0015)."""
    held = {v.conversation: v.last_seq for v in views.list_for(principal)}
    # Held ones not (yet) in the index too: just started, or started before it was backfilled.
    sources = [StartOrdered.of(held)]
    if owners is not None:
        await ensured(owners, owner_key(principal.tenant, principal.sub), "the conversations of")
        sources.append(owners.conversations_of(principal))

    def listed(conversation: str) -> bool:
        # Held: the view knows it live. Else the index's, unless erased (a key ring look-up).
        return conversation in held or (conversation not in views
                                         and not erased_or_unknown(sealer, conversation))

    page, more = newest_before(sources, before, limit, listed)
    if more:
        response.headers["Link"] = (f'<{request.url.path}?before={page[0]}&limit={limit}>; '
                                    f'rel="next"')
    return [ConversationSummary(conversation=c, last_seq=held.get(c)) for c in page]


@router.post("/{conversation}/messages", status_code=202, dependencies=[quota("messages")],
             responses={**NOT_FOUND, 409: {"description": "The conversation refused it."},
                        **TOO_MANY})
async def send_message(
    body: MessageIn, view: OwnedDep, settings: SettingsDep, commands: CommandsDep,
    views: ViewsDep, sealer: SealerDep,
    idempotency_key: Annotated[HeaderText | None, Header(
        alias="Idempotency-Key", min_length=1, max_length=200,
        description="Sending again with the same key returns the first answer; "
                    "the message is recorded once.")] = None,
) -> MessageAccepted:
    """Record a message; its turn runs later. Read it at ``…/turns/{turn}`` or on the stream.

    422 (at ``body.text``) for empty, blank or oversized text (``VOICE_MAX_MESSAGE_BYTES``)."""
    check_text_size(settings, body.text)
    conversation = view.conversation
    message_id = new_id()
    with opening(views, conversation):
        sealed = await with_key(sealer, conversation, sealer.seal, conversation, message_id,
                                body.text)
    ack = await commands.submit(conversation, SendMessage(
        conversation=conversation, message_id=message_id, text=sealed,
        idempotency_key=idempotency_key))
    if ack.outcome == "rejected" or ack.seq is None:
        raise conversation_refused(ack, conversation)
    text = body.text
    if ack.outcome == "duplicate":
        text = await original_text(views, sealer, conversation, ack.seq, default=body.text)
    return MessageAccepted(turn=str(ack.detail["turn"]),
                           message=MessageOut(seq=ack.seq, text=text, at=str(ack.detail["at"])))


async def original_text(views: ConversationViews, sealer: Sealer, conversation: str,
                        seq: int, default: str) -> str:
    """The text of the message recorded at ``seq`` (the first of a repeated request)."""
    await views.wait(conversation, lambda v: v is None or v.erased or v.last_seq >= seq,
                     remaining(1.0))
    view = views.get(conversation)
    env = view.content.get(seq) if view is not None else None
    if env is None or not isinstance(env.record, MessageRecorded):
        return default
    with opening(views, conversation):
        return render.message_text(sealer, env)


@router.get("/{conversation}/turns/{turn}", responses=NOT_FOUND)
async def get_turn(
    turn: str, view: OwnedDep, views: ViewsDep, sealer: SealerDep
) -> TurnOut:
    """A turn's state (``Thinking`` | ``Replied`` | ``CouldNotInterpret``), reply and proposal."""
    conversation = view.conversation
    message_seq = check_turn(turn, conversation)

    def decided(v: ConversationView | None) -> bool:
        # The sequencer records Thinking two seqs after the message: past it, the view knows.
        if v is None or v.erased:
            return True
        tv = v.turns.get(turn)
        return (tv is not None and tv.state is not None) or v.last_seq >= message_seq + 2

    short = cut_short(VIEW_WAIT_S)
    await views.wait(conversation, decided, remaining(VIEW_WAIT_S))
    tv = view.turns.get(turn)
    if view.erased:
        raise not_found("conversation", conversation)
    if tv is None or tv.state is None:
        if short and not decided(view):  # the bound ran out first: it may yet come
            raise behind("turn", turn)
        raise no_turn(turn, conversation)
    try:
        tv = await views.with_records(view, tv)  # an old turn's reply: from the log
    except ColdReadFailed as exc:
        raise HTTPException(503, f"could not read turn {turn!r}'s records from the log: "
                                 f"{exc}; try again") from None
    with opening(views, conversation):
        return render.turn_out(sealer, tv)


@router.post("/{conversation}/turns/{turn}/cancel", status_code=202, responses=NOT_FOUND)
async def cancel_turn(
    turn: str, view: OwnedDep, commands: CommandsDep,
) -> CancelRequested:
    """Ask a running turn to stop: honoured before its next model call and while a tool runs.

    The turn then ends ``CouldNotInterpret`` with a reason saying it was cancelled; a turn that
    already ended is left as it is."""
    conversation = view.conversation
    check_turn(turn, conversation)
    tv = view.turns.get(turn)
    if tv is None or tv.state is None:
        raise no_turn(turn, conversation)
    if tv.state != "Thinking":
        return CancelRequested(turn=turn, state=tv.state)
    ack = await commands.cancel(turn)
    if ack.outcome == "rejected":
        raise conversation_refused(ack, conversation)
    return CancelRequested(turn=turn, state="Thinking")


@router.get("/{conversation}", responses=NOT_FOUND)
async def get_conversation(
    view: OwnedDep, views: ViewsDep, sealer: SealerDep,
    before: Annotated[int | None, Query(
        ge=1, description="Only records with a seq below this: the `older` of the page "
                          "after it. Omitted: the newest page.")] = None,
    limit: Annotated[int, Query(
        ge=1, le=TRANSCRIPT_PAGE_MAX,
        description="Messages, replies and proposals on the page, at most "
                    f"{TRANSCRIPT_PAGE_MAX}.")] = TRANSCRIPT_PAGE,
) -> ConversationOut:
    """The conversation as its owner sees it, a page at a time: messages and replies,
    proposals, and the turns of those messages; ``older`` says where the page before begins.
    A page costs the edge its own records, however long the conversation."""
    if before is not None and before <= view.held_from:
        try:
            page, older = await views.older_page(view, before, limit)
        except ColdReadFailed as exc:
            raise HTTPException(503, f"could not read the conversation's older records from "
                                     f"the log: {exc}; try again") from None
    else:
        page, older = view.page(before, limit)
    with opening(views, view.conversation):
        return render.conversation_out(sealer, view, page, older, before)


@router.delete("/{conversation}", status_code=204, responses=NOT_FOUND)
async def erase_conversation(
    view: OwnedDep, commands: CommandsDep, views: ViewsDep, sealer: SealerDep,
) -> Response:
    """Erase the conversation: its key is destroyed first, so every copy of its content, on
    every topic and store, is unreadable at once; then the log records the erasure."""
    conversation = view.conversation
    await asyncio.to_thread(sealer.erase, conversation)
    views.mark_erased(conversation)
    ack = await commands.submit(conversation, EraseConversation(conversation=conversation))
    if ack.outcome == "rejected":
        raise conversation_refused(ack, conversation)
    return Response(status_code=204)


STREAM_EVENTS = {200: {
    "description": "The conversation's events after the cursor, then live ones.",
    "content": {"text/event-stream": {"schema": {"oneOf": [
        sse_event_schema("message", ParticipantMessageEvent),
        sse_event_schema("message", AgentMessageEvent),
        sse_event_schema("proposal", ProposalEvent),
        sse_event_schema("turn", TurnEvent),
        sse_event_schema("delta", DeltaEvent)]}}}}}


@router.get("/{conversation}/stream", response_class=Response, response_model=None,
            dependencies=[stream_slot()],
            responses={**STREAM_EVENTS, **NOT_FOUND, **TOO_OLD, **TOO_MANY})
async def stream(view: OwnedDep, cursor: CursorDep, settings: SettingsDep, views: ViewsDep,
                 sealer: SealerDep) -> EventSourceResponse:
    """Events: ``message`` (participant's or agent's), ``proposal``, ``turn``; ``id:`` = seq.
    While a turn runs, ``delta`` events (no ``id:``) carry its reply as the model writes it."""
    return event_stream(conversation_events(views, sealer, view.conversation, cursor,
                                            settings.gateway_bound_s))


async def open_stream(request: Request, path: dict[str, str], params: StreamParams
                      ) -> EventStream:
    """``stream`` served by the stream lane (``api.frame.lane``): its dependencies' checks,
    in their order, through the same functions — then the same events."""
    settings: VoiceSettings = request.app.state.settings
    tenant = params.tenant()
    principal = allowed(await principal_from(settings, params.token, tenant), "converse")
    slot = hold_stream(edge_quotas(request), principal)
    try:
        views: ConversationViews = request.app.state.views
        sealer: Sealer = request.app.state.sealer
        view = await owned_view(views, path["conversation"], principal, sealer,
                                valid=valid_conversation)
        cursor = params.cursor()  # any cursor: one older than the view keeps is read from the log
    except BaseException:
        slot.release()
        raise
    return event_stream(conversation_events(views, sealer, view.conversation, cursor,
                                            settings.gateway_bound_s), ended=slot.release)


STREAM_LANE = LaneRoute(f"{router.prefix}/{{conversation}}/stream", open_stream)
"""The conversation stream, for ``api.frame.lane.StreamLane``."""


def conversation_events(views: ConversationViews, sealer: Sealer, conversation: str,
                        cursor: int, bound_s: float) -> AsyncIterator[ServerSentEvent | Frame]:
    """The conversation's events after ``cursor``, then live ones (the frame's SSE loop)."""
    erased = "end; the conversation was erased"

    def current() -> ConversationView | None:
        v = views.get(conversation)
        return None if v is None or v.erased else v

    def render_event(env: Envelope) -> Frame | None:
        try:
            return render.event_frame(sealer, env)
        except KeyErased:  # erased by another edge, not yet on this edge's view
            views.mark_erased(conversation)
            raise StreamEnd(erased) from None

    def render_shared(env: Envelope) -> Frame | None:
        # Every stream of a conversation is its owner's: one rendering serves them all.
        v = current()
        return render_event(env) if v is None else v.render_once(env, render_event)

    def render_delta(env: Envelope) -> ServerSentEvent | None:
        try:
            return render.delta_event(sealer, env)
        except KeyErased:
            views.mark_erased(conversation)
            raise StreamEnd(erased) from None

    async def older(after: int, upto: int) -> list[tuple[int, Frame | None]]:
        try:
            envs = await views.older(conversation, after, upto)
        except ColdReadFailed as exc:
            raise StreamEnd(f"end; cursor {after} is too old to serve: {exc}") from None
        return [(env.seq or 0, render_event(env)) for env in envs]

    feed = Feed(view=current, render=render_shared, gone=erased, render_live=render_delta,
                wait=partial(views.changed, conversation), older=older,
                # never evicted while a stream of it is open
                hold=partial(views.streaming, conversation))
    return sse_stream(feed, cursor, bound_s)
