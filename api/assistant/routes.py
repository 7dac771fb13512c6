"""The assistant chat routes (``/api/v1/assistant``): chat, a conversation's stream, its turns.

No route calls a model. A chat message is sealed with the conversation's key and recorded as a
command, whose turn runs on a worker; ``stream: true`` then streams that turn's display events
(SSE ``id:`` = the conversation's display seq) and ends before the gateway bound, and
``…/stream?after=N`` resumes. Both are the frame's SSE loop (``api.frame.sse``) rendering
display events. Everyone else's conversations and datasets answer 404.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from functools import partial
from typing import Annotated, Any

from fastapi import APIRouter, Header, HTTPException, Request, Response
from fastapi.responses import JSONResponse
from fastapi.sse import EventSourceResponse, ServerSentEvent

from api.assistant.deps import NOT_FOUND, AssistantDep, CursorDep, OwnedDep
from api.assistant.models import AssistantTurnOut, ChatAccepted, ChatRequest, DisplayEventOut
from api.assistant.views import (
    AssistantConversations,
    AssistantConversationView,
    AssistantTurnView,
    AssistantViews,
    display_event,
)
from api.frame.auth import Principal
from api.frame.cold import ColdReadFailed
from api.frame.commands import CommandsDep, conversation_refused
from api.frame.deadline import remaining
from api.frame.deps import (
    VIEW_WAIT_S,
    ConverseDep,
    SealerDep,
    SettingsDep,
    check_text_size,
    check_turn,
    find_owned,
    known,
    no_turn,
    not_found,
    with_key,
)
from api.frame.model_registry import check_model
from api.frame.models import CancelRequested, HeaderText, sse_event_schema
from api.frame.quotas import TOO_MANY, AdmissionDep, quota, stream_slot
from api.frame.sse import TOO_OLD, Feed, StreamEnd, event_stream, sse_stream
from schemas.assistant import AssistantChat, AssistantDisplayRecorded, ChatOptions, DatasetRef
from streams.envelope import new_id
from streams.ids import new_assistant_conversation_id
from streams.sealing import KeyErased, Sealer

router = APIRouter(prefix="/api/v1/assistant", tags=["assistant"])

_ID_IN_CONTEXT = re.compile(r"\bID:\s*([0-9a-fA-F]{32})\b")
ERASED = "end; no such conversation"
"""How a display stream ends once its conversation is gone (erased, on any edge)."""


TURN_DONE = "end; turn done"


def display_stream(conversations: AssistantConversations, sealer: Sealer, conversation: str,
                   cursor: int, bound_s: float, until_done: str | None = None
                   ) -> AsyncIterator[ServerSentEvent]:
    """The conversation's display events after ``cursor``, then live ones. Ends after
    ``until_done``'s ``done`` event once that turn has ended on this edge's view (the engine
    shows ``done`` before the sequencer ends the turn: a client that sends its next message
    as the stream ends must not find the conversation busy), else once nothing runs and all
    is sent."""

    def render(rec: AssistantDisplayRecorded) -> ServerSentEvent:
        try:
            data = display_event(sealer, conversation, rec.event)
        except KeyErased:  # erased by another edge, not yet on this edge's view
            conversations.mark_erased(conversation)
            raise StreamEnd(ERASED) from None
        return ServerSentEvent(event="display", id=str(rec.display_seq), data=data)

    def current() -> AssistantConversationView | None:
        v = conversations.get(conversation)
        return None if v is None or v.erased else v

    def ends_after(rec: AssistantDisplayRecorded, cursor: int) -> str | None:
        done = (until_done is not None and rec.event.type == "done"
                and rec.event.message_id == until_done and idle())
        return f"{TURN_DONE}; resume with after={cursor}" if done else None

    def idle() -> bool:
        v = current()
        if v is None:
            return False
        return v.running is None if until_done is None else v.ended(until_done)

    async def older(after: int, upto: int) -> list[tuple[int, ServerSentEvent | None]]:
        try:
            envs = await conversations.older(conversation, after, upto)
        except ColdReadFailed as exc:
            raise StreamEnd(f"end; cursor {after} is too old to serve: {exc}") from None
        out: list[tuple[int, ServerSentEvent | None]] = []
        for env in envs:
            rec = env.record
            assert isinstance(rec, AssistantDisplayRecorded)
            out.append((rec.display_seq, render(rec)))
        return out

    feed = Feed(view=current, render=render,
                wait=partial(conversations.changed, conversation),
                gone=ERASED, ends_after=ends_after, idle=idle, older=older,
                idle_end=Feed.idle_end if until_done is None else TURN_DONE,
                hold=partial(conversations.streaming, conversation))  # never evicted meanwhile
    return sse_stream(feed, cursor, bound_s)


MAX_IMAGES = 5
"""Images one chat message may attach (each costs the model up to ~1,600 input tokens, again
in every later turn whose history holds it)."""


async def _attach(views: AssistantViews, sealer: Sealer, owner: Principal, body: ChatRequest
                  ) -> tuple[list[tuple[DatasetRef, dict[str, Any]]], list[dict[str, Any]]]:
    """The datasets the request names (404 naming the field for one not the caller's or not
    in the request's namespace), plus those an ``ID: …`` in ``file_context`` names, when they
    are the caller's; and the images ``file_context`` names, as positions (never bytes)."""
    wanted: list[tuple[str, str, bool]] = []
    if body.dataset_id:
        wanted.append(("dataset_id", body.dataset_id, True))
    wanted += [(f"data_refs[{i}]", d, True) for i, d in enumerate(body.data_refs)]
    for i, text in enumerate(body.file_context):
        wanted += [(f"file_context[{i}]", m.lower(), False) for m in _ID_IN_CONTEXT.findall(text)]
    out: dict[str, tuple[DatasetRef, dict[str, Any]]] = {}
    images: dict[str, dict[str, Any]] = {}
    for where, dataset_id, required in wanted:
        if dataset_id in out or dataset_id in images:
            continue
        # Uploaded through another edge a moment ago? Wait for it, briefly unless required.
        ds = await find_owned(views.datasets, dataset_id, owner,
                              VIEW_WAIT_S if required else 0.2, what="dataset")
        meta = None
        if ds is not None:
            try:
                # Uploaded through another edge: its key is learnt in a thread, not here.
                meta = await with_key(sealer, dataset_id, sealer.open_json, dataset_id, "meta",
                                      ds.meta)
            except KeyErased:
                meta = None
        if ds is not None and ds.namespace != body.namespace_id:
            # Another namespace's dataset is not there for this turn (seen as missing).
            if required:
                raise HTTPException(404, f"{where}: no dataset {dataset_id!r} in "
                                         f"{_namespace(body.namespace_id)}")
            continue
        if ds is None or meta is None:
            if required:
                raise HTTPException(404, f"{where}: no dataset {dataset_id!r}")
            continue
        if ds.media_type is not None:
            if required:
                raise HTTPException(422, f"{where}: {dataset_id!r} is an image, not a dataset; "
                                         "name it in file_context ('ID: <image id>')")
            if len(images) == MAX_IMAGES:
                raise HTTPException(422, f"{where}: at most {MAX_IMAGES} images per message")
            images[dataset_id] = {"image_id": dataset_id, "name": meta.get("name"),
                                  "media_type": ds.media_type, "partition": ds.partition,
                                  "offset": ds.offset}
            continue
        out[dataset_id] = (DatasetRef(dataset_id=dataset_id, partition=ds.partition,
                                      offset=ds.offset),
                           {"dataset_id": dataset_id, "name": meta.get("name"),
                            "rows": ds.rows, "columns": meta.get("columns") or []})
    return list(out.values()), list(images.values())


def _namespace(namespace: str | None) -> str:
    return f"namespace {namespace!r}" if namespace is not None else "the default namespace"


@router.post("/chat", response_model=None, dependencies=[quota("messages")], responses={
    200: {"description": "stream: true: the turn's display events, then a final comment.",
          "content": {"text/event-stream": {
              "schema": sse_event_schema("display", DisplayEventOut)}}},
    202: {"description": "stream: false: the turn runs; read it later.",
          "model": ChatAccepted},
    **NOT_FOUND,
    409: {"description": "The conversation is busy with another turn."},
    422: {"description": "A field is invalid (the detail names it); a model_override "
                         "outside VOICE_MODELS is MODEL_NOT_FOUND."},
    **TOO_MANY})
async def chat(
    body: ChatRequest, request: Request, settings: SettingsDep, commands: CommandsDep,
    views: AssistantDep, sealer: SealerDep, principal: ConverseDep, admission: AdmissionDep,
    idempotency_key: Annotated[HeaderText | None, Header(
        alias="Idempotency-Key", min_length=1, max_length=200,
        description="Sending again with the same key returns the first turn.")] = None,
) -> EventSourceResponse | JSONResponse:
    """Record a chat message; its turn runs on a worker. Streams the turn or answers 202."""
    started = asyncio.get_running_loop().time()
    check_text_size(settings, body.message, "message")
    check_model(views.settings.allowed_models, body.model_override)
    if body.stream:
        admission.open_stream()
    if body.conversation_id is not None:
        conversation, create = str(body.conversation_id), False
        if await find_owned(views.conversations, conversation, principal) is None:
            raise not_found("conversation", conversation)
    else:
        admission.charge("conversations")
        conversation, create = new_assistant_conversation_id(), True
        await asyncio.to_thread(sealer.create, conversation, principal.tenant)
    attached, images = await _attach(views, sealer, principal, body)
    message_id = new_id()
    request_doc = {"message": body.message, "file_context": body.file_context,
                   "datasets": [summary for _, summary in attached], "images": images,
                   "focus_context": body.focus_context, "selection_state": body.selection_state}
    params = body.inference_params.model_dump(exclude_none=True) if body.inference_params else {}
    options = ChatOptions(model_override=body.model_override, agentic_mode=body.agentic_mode,
                          skip_history=body.skip_history,
                          data_isolation=body.advanced.data_isolation,
                          namespace_id=body.namespace_id, inference_params=params,
                          capabilities=tuple(sorted(principal.capabilities)))
    ack = await commands.submit(conversation, AssistantChat(
        conversation=conversation, owner=principal.sub, create=create, message_id=message_id,
        request=await with_key(sealer, conversation, sealer.seal_json, conversation,
                               message_id, request_doc),
        datasets=[ref for ref, _ in attached], options=options,
        idempotency_key=idempotency_key))
    if ack.outcome == "rejected":
        if ack.detail.get("reason") == "busy":
            raise HTTPException(409, f"conversation {conversation!r} is busy with turn "
                                     f"{ack.detail.get('turn')!r}; wait for it to end")
        raise conversation_refused(ack, conversation)
    turn, after = str(ack.detail["turn"]), int(ack.detail.get("after") or 0)
    if not body.stream:
        accepted = ChatAccepted(turn=turn, conversation_id=conversation, after=after)
        return JSONResponse(accepted.model_dump(), status_code=202, headers={
            "Location": f"{router.prefix}/conversations/{conversation}/turns/{turn}"})
    await known(views.conversations, conversation)
    bound = settings.gateway_bound_s - (asyncio.get_running_loop().time() - started)
    events = display_stream(views.conversations, sealer, conversation, after, max(bound, 0.5),
                            until_done=turn)
    return event_stream(events, headers={"X-Conversation-Id": conversation, "X-Turn-Id": turn})


@router.get("/conversations/{conversation}/stream", response_class=Response,
            response_model=None, dependencies=[stream_slot()],
            responses={200: {"description": "The display events after the cursor, then live "
                                            "ones.",
                             "content": {"text/event-stream": {
                                 "schema": sse_event_schema("display", DisplayEventOut)}}},
                       **NOT_FOUND, **TOO_OLD, **TOO_MANY})
async def stream(view: OwnedDep, cursor: CursorDep, settings: SettingsDep, views: AssistantDep,
                 sealer: SealerDep) -> EventSourceResponse:
    """``event: display`` after ``after``, in order; ends when no turn runs and all is sent,
    or before the gateway bound (a final comment says where to resume)."""
    return event_stream(display_stream(views.conversations, sealer, view.conversation, cursor,
                                       settings.gateway_bound_s))


async def known_turn(conversations: AssistantConversations, conversation: str, turn: str
                     ) -> AssistantTurnView:
    """The turn of ``conversation`` (waiting briefly for this edge to see it); 404 if none."""
    check_turn(turn, conversation)
    await conversations.wait(conversation, lambda v: v is not None and turn in v.turns,
                             remaining(VIEW_WAIT_S))
    view = conversations.get(conversation)
    tv = view.turns.get(turn) if view is not None else None
    if tv is None:
        raise no_turn(turn, conversation)
    return tv


@router.get("/conversations/{conversation}/turns/{turn}", responses=NOT_FOUND)
async def get_turn(turn: str, view: OwnedDep, views: AssistantDep, sealer: SealerDep
                   ) -> AssistantTurnOut:
    """A turn's state (``Thinking`` | ``Replied`` | ``Failed`` | ``Cancelled``), its final text
    and its cards."""
    conversation = view.conversation
    tv = await known_turn(views.conversations, conversation, turn)
    text, cards, cost = None, [], None
    if tv.reply is not None:
        rid = tv.reply.reply_id
        try:
            text = sealer.open_json(conversation, f"{rid}/chain", tv.reply.chain).get("text")
            cards = sealer.open_json(conversation, f"{rid}/cards", tv.reply.cards).get("cards")
        except KeyErased:
            raise not_found("conversation", conversation) from None
        cost = tv.reply.cost_usd
    reason, code = None, None
    if tv.ended is not None:
        code, reason = tv.ended.reason_code, tv.ended.reason  # a record from before sealing
        if tv.ended.sealed_reason is not None:
            try:
                reason = sealer.open_text(conversation, f"{tv.ended.turn}:reason",
                                         tv.ended.sealed_reason)
            except KeyErased:
                raise not_found("conversation", conversation) from None
    return AssistantTurnOut(turn=turn, conversation_id=conversation, state=tv.state,  # type: ignore[arg-type]
                            text=text, cards=cards or [], end_reason=tv.end_reason,
                            reason=reason, reason_code=code, cost_usd=cost)


@router.post("/conversations/{conversation}/turns/{turn}/cancel", status_code=202,
             responses=NOT_FOUND)
async def cancel_turn(turn: str, view: OwnedDep, views: AssistantDep, commands: CommandsDep
                      ) -> CancelRequested:
    """Ask a running turn to stop (before its next model call, or while a tool runs); it then
    ends ``Cancelled``. A turn that already ended records nothing and answers its state."""
    conversation = view.conversation
    tv = await known_turn(views.conversations, conversation, turn)
    if tv.state != "Thinking":
        return CancelRequested(turn=turn, state=tv.state)
    ack = await commands.cancel(turn)
    if ack.outcome == "rejected":
        raise HTTPException(409, f"turn {turn!r} cannot be cancelled: {ack.detail}")
    return CancelRequested(turn=turn, state="Thinking")
