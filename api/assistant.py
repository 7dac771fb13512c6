"""The assistant chat routes (``/api/v1/assistant``): upload a CSV, chat, stream, read a turn.

No route calls a model. An upload is sealed with a fresh data key for the dataset and recorded
on ``voice.datasets``; a chat message is sealed with the conversation's key and recorded as a
command, whose turn runs on a worker; ``stream: true`` then streams that turn's display events
(SSE ``id:`` = the conversation's display seq) and ends before the gateway bound, and
``…/stream?after=N`` resumes. Everyone else's conversations and datasets answer 404.
"""

from __future__ import annotations

import asyncio
import email.policy
import json
import re
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from email.parser import BytesParser
from pathlib import PurePosixPath
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, HTTPException, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.sse import EventSourceResponse, ServerSentEvent, format_sse_event

from api.assistant_models import (
    AssistantTurnOut,
    ChatAccepted,
    ChatRequest,
    CsvRejected,
    DatasetUploaded,
    DisplayEventOut,
    check_csv,
)
from api.assistant_views import AssistantConversationView, AssistantViews, display_stream
from api.commands import EDGE_SOURCE, submit
from api.deps import VIEW_WAIT_S, PrincipalDep, ProducerDep, SealerDep, SettingsDep, TailDep
from api.models import CancelRequested, CursorTooOldOut
from api.stream import resume_cursor, served_cursor
from schemas.assistant import AssistantChat, ChatOptions, DatasetRecorded, DatasetRef
from schemas.workflow import WorkflowCommandReceived
from streams.envelope import Envelope, new_id
from streams.ids import turn_conversation
from streams.producer import ProduceError
from streams.sealing import KeyErased, Sealer
from streams.topics import DATASETS, topic_name

router = APIRouter(prefix="/api/v1/assistant", tags=["assistant"])

UPLOAD_OVERHEAD = 64 * 1024
"""Bytes of multipart framing and form fields accepted beyond the file's own limit."""
_ID_IN_CONTEXT = re.compile(r"\bID:\s*([0-9a-fA-F]{32})\b")
NOT_FOUND = {404: {"description": "No such conversation (or dataset) of the caller's."}}
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


async def get_assistant(request: Request) -> AssistantViews:
    return request.app.state.assistant


AssistantDep = Annotated[AssistantViews, Depends(get_assistant)]


# --- upload -------------------------------------------------------------------------------------


async def _read_body(request: Request, limit: int, file_limit: int) -> bytes:
    too_big = HTTPException(413, f"the upload is larger than {file_limit} bytes "
                                 "(VOICE_MAX_UPLOAD_BYTES)")
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise too_big
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_big
        chunks.append(chunk)
    return b"".join(chunks)


def _file_part(content_type: str, body: bytes) -> tuple[str | None, bytes, dict[str, str]]:
    """(file name, bytes of the part named ``file``, other form fields)."""
    msg = BytesParser(policy=email.policy.HTTP).parsebytes(
        b"Content-Type: " + content_type.encode("latin-1") + b"\r\n\r\n" + body)
    if not msg.is_multipart():
        raise HTTPException(422, "the body is not multipart/form-data")
    found: tuple[str | None, bytes] | None = None
    fields: dict[str, str] = {}
    for part in msg.iter_parts():
        name = part.get_param("name", header="content-disposition")
        payload = part.get_payload(decode=True) or b""
        if name == "file" and found is None:
            found = (part.get_filename(), payload)
        elif isinstance(name, str):
            fields[name] = payload.decode("utf-8", "replace")
    if found is None:
        raise HTTPException(422, "no form part named 'file' (send the CSV as file=@data.csv)")
    return found[0], found[1], fields


def _dataset_name(filename: str | None, given: str | None) -> str:
    raw = (given or "").strip() or PurePosixPath((filename or "").replace("\\", "/")).name
    return re.sub(r"[\x00-\x1f]", "", raw)[:200] or "dataset.csv"


@router.post("/files", status_code=201, responses={
    413: {"description": "Larger than VOICE_MAX_UPLOAD_BYTES."},
    415: {"description": "Not multipart/form-data."},
    422: {"description": "Not a CSV with a header and at least one row (the detail says why)."},
    503: {"description": "The dataset could not be recorded; try again."}},
    openapi_extra={"requestBody": {"required": True, "content": {"multipart/form-data": {
        "schema": {"type": "object", "required": ["file"], "properties": {
            "file": {"type": "string", "format": "binary"},
            "name": {"type": "string", "description": "Overrides the file's name."}}}}}}})
async def upload_file(request: Request, settings: SettingsDep, producer: ProducerDep,
                      views: AssistantDep, sealer: SealerDep, principal: PrincipalDep
                      ) -> DatasetUploaded:
    """Upload a CSV (form part ``file``); use its ``dataset_id`` in ``data_refs``."""
    content_type = request.headers.get("content-type", "")
    if not content_type.lower().startswith("multipart/form-data"):
        raise HTTPException(415, "send the CSV as multipart/form-data, in a part named 'file'")
    limit = views.settings.max_upload_bytes
    body = await _read_body(request, limit + UPLOAD_OVERHEAD, limit)
    filename, data, fields = _file_part(content_type, body)
    if len(data) > limit:
        raise HTTPException(413, f"the file is {len(data)} bytes; the limit is {limit} bytes "
                                 "(VOICE_MAX_UPLOAD_BYTES)")
    try:
        checked = check_csv(data)
    except CsvRejected as exc:
        raise HTTPException(422, f"not a usable CSV: {exc}") from None
    name = _dataset_name(filename, fields.get("name"))
    dataset_id = uuid.uuid4().hex
    await asyncio.to_thread(sealer.create, dataset_id)
    record = DatasetRecorded(
        dataset_id=dataset_id, owner=principal.sub, rows=checked.rows,
        columns=len(checked.columns), size_bytes=len(data),
        meta=sealer.seal_json(dataset_id, "meta", {"name": name, "columns": checked.columns}),
        csv=sealer.seal(dataset_id, "csv", checked.text), at=datetime.now(UTC).isoformat())
    env = Envelope(record=record, key=dataset_id, source=EDGE_SOURCE, subject=dataset_id,
                   tenant=principal.tenant, id=dataset_id)
    try:
        msg = await producer.send(topic_name(settings, DATASETS), env)
    except ProduceError as exc:
        raise HTTPException(503, f"could not record the dataset: {exc}") from None
    views.apply_dataset(env, msg.partition(), msg.offset())  # read-your-writes on this edge
    return DatasetUploaded(dataset_id=dataset_id, name=name, rows=checked.rows,
                           columns=checked.columns)


# --- chat ---------------------------------------------------------------------------------------


async def _attach(views: AssistantViews, sealer: Sealer, owner: str, body: ChatRequest
                  ) -> list[tuple[DatasetRef, dict[str, Any]]]:
    """The datasets the request names (404 naming the field for one not the caller's), plus
    those an ``ID: …`` in ``file_context`` names, when they are the caller's."""
    wanted: list[tuple[str, str, bool]] = []
    if body.dataset_id:
        wanted.append(("dataset_id", body.dataset_id, True))
    wanted += [(f"data_refs[{i}]", d, True) for i, d in enumerate(body.data_refs)]
    for i, text in enumerate(body.file_context):
        wanted += [(f"file_context[{i}]", m.lower(), False) for m in _ID_IN_CONTEXT.findall(text)]
    out: dict[str, tuple[DatasetRef, dict[str, Any]]] = {}
    for where, dataset_id, required in wanted:
        if dataset_id in out:
            continue
        if dataset_id not in views.datasets:  # uploaded through another edge a moment ago?
            await views.wait(f"ds:{dataset_id}", lambda d=dataset_id: d in views.datasets,
                             VIEW_WAIT_S if required else 0.2)
        ds = views.dataset(dataset_id, owner)
        meta = None
        if ds is not None:
            try:
                meta = sealer.open_json(dataset_id, "meta", ds.meta)
            except KeyErased:
                meta = None
        if ds is None or meta is None:
            if required:
                raise HTTPException(404, f"{where}: no dataset {dataset_id!r}")
            continue
        out[dataset_id] = (DatasetRef(dataset_id=dataset_id, partition=ds.partition,
                                      offset=ds.offset),
                           {"dataset_id": dataset_id, "name": meta.get("name"),
                            "rows": ds.rows, "columns": meta.get("columns") or []})
    return list(out.values())


def _sse_bytes(events: AsyncIterator[ServerSentEvent]) -> AsyncIterator[bytes]:
    async def frames() -> AsyncIterator[bytes]:
        async for sse in events:
            data = None if sse.data is None else json.dumps(sse.data, ensure_ascii=False,
                                                            separators=(",", ":"))
            yield format_sse_event(data_str=data, event=sse.event, id=sse.id,
                                   comment=sse.comment)
    return frames()


@router.post("/chat", response_model=None, responses={
    200: {"description": "stream: true: the turn's display events, then a final comment.",
          "content": {"text/event-stream": {"schema": DisplayEventOut.model_json_schema()}}},
    202: {"description": "stream: false: the turn runs; read it later.",
          "model": ChatAccepted},
    **NOT_FOUND,
    409: {"description": "The conversation is busy with another turn."},
    422: {"description": "A field is invalid (the detail names it)."}})
async def chat(
    body: ChatRequest, request: Request, settings: SettingsDep, producer: ProducerDep,
    tail: TailDep, views: AssistantDep, sealer: SealerDep, principal: PrincipalDep,
    idempotency_key: Annotated[str | None, Header(
        alias="Idempotency-Key", min_length=1, max_length=200,
        description="Sending again with the same key returns the first turn.")] = None,
) -> EventSourceResponse | JSONResponse:
    """Record a chat message; its turn runs on a worker. Streams the turn or answers 202."""
    started = asyncio.get_running_loop().time()
    size = len(body.message.encode("utf-8"))
    if size > settings.max_message_bytes:
        raise RequestValidationError([{
            "type": "string_too_long", "loc": ("body", "message"), "input": None,
            "msg": f"message is {size} UTF-8 bytes; the limit is {settings.max_message_bytes}",
            "ctx": {"max_bytes": settings.max_message_bytes}}])
    if body.conversation_id is not None:
        conversation, create = str(body.conversation_id), False
        await views.wait(conversation, lambda: conversation in views.conversations, VIEW_WAIT_S)
        if views.owned(conversation, principal.sub) is None:
            raise HTTPException(404, f"no conversation {conversation!r}")
    else:
        conversation, create = str(uuid.uuid4()), True
        await asyncio.to_thread(sealer.create, conversation)
    attached = await _attach(views, sealer, principal.sub, body)
    message_id = new_id()
    request_doc = {"message": body.message, "file_context": body.file_context,
                   "datasets": [summary for _, summary in attached],
                   "focus_context": body.focus_context, "selection_state": body.selection_state}
    params = body.inference_params.model_dump(exclude_none=True) if body.inference_params else {}
    options = ChatOptions(model_override=body.model_override, agentic_mode=body.agentic_mode,
                          skip_history=body.skip_history,
                          data_isolation=body.advanced.data_isolation,
                          namespace_id=body.namespace_id, inference_params=params)
    ack = await submit(settings, producer, tail, principal, conversation, AssistantChat(
        conversation=conversation, owner=principal.sub, create=create, message_id=message_id,
        request=sealer.seal_json(conversation, message_id, request_doc),
        datasets=[ref for ref, _ in attached], options=options,
        idempotency_key=idempotency_key))
    if ack.outcome == "rejected":
        reason = str(ack.detail.get("reason"))
        if reason == "no such conversation":
            raise HTTPException(404, f"no conversation {conversation!r}")
        if reason == "busy":
            raise HTTPException(409, f"conversation {conversation!r} is busy with turn "
                                     f"{ack.detail.get('turn')!r}; wait for it to end")
        raise HTTPException(409, f"conversation {conversation!r}: {reason}")
    turn, after = str(ack.detail["turn"]), int(ack.detail.get("after") or 0)
    if not body.stream:
        accepted = ChatAccepted(turn=turn, conversation_id=conversation, after=after)
        return JSONResponse(accepted.model_dump(), status_code=202, headers={
            "Location": f"{router.prefix}/conversations/{conversation}/turns/{turn}"})
    await views.wait(conversation, lambda: conversation in views.conversations, VIEW_WAIT_S)
    bound = settings.gateway_bound_s - (asyncio.get_running_loop().time() - started)
    events = display_stream(views, sealer, conversation, after, max(bound, 0.5),
                            until_done=turn)
    return EventSourceResponse(_sse_bytes(events), headers={
        **SSE_HEADERS, "X-Conversation-Id": conversation, "X-Turn-Id": turn})


# --- a conversation's stream and turns -------------------------------------------------------


async def owned_conversation(
    conversation: Annotated[str, Path(description="The conversation id (a UUID).")],
    views: AssistantDep, principal: PrincipalDep,
) -> AssistantConversationView:
    """The caller's assistant conversation; 404 if unknown or someone else's."""
    try:
        uuid.UUID(conversation)
    except ValueError:
        raise HTTPException(404, f"no conversation {conversation!r}") from None
    await views.wait(conversation, lambda: conversation in views.conversations, VIEW_WAIT_S)
    view = views.owned(conversation, principal.sub)
    if view is None:
        raise HTTPException(404, f"no conversation {conversation!r}")
    return view


OwnedDep = Annotated[AssistantConversationView, Depends(owned_conversation)]


async def stream_cursor(
    view: OwnedDep,
    after: Annotated[int | None, Query(ge=0, description="Resume after this event id; wins "
                                                          "over Last-Event-ID.")] = None,
    last_event_id: Annotated[str | None, Header(alias="Last-Event-ID")] = None,
) -> int:
    """Where the stream starts; ``CursorTooOld`` (→ 409) when this edge cannot serve it."""
    return served_cursor(view, resume_cursor(after, last_event_id))


@router.get("/conversations/{conversation}/stream", response_class=EventSourceResponse,
            responses={**NOT_FOUND, 409: {
                "description": "The cursor is older than this edge keeps; reconnect with "
                               "after=oldest_cursor.",
                "content": {"application/json": {"schema": CursorTooOldOut.model_json_schema()}}}})
async def stream(view: OwnedDep, cursor: Annotated[int, Depends(stream_cursor)],
                 settings: SettingsDep, views: AssistantDep, sealer: SealerDep
                 ) -> AsyncIterator[ServerSentEvent]:
    """``event: display`` after ``after``, in order; ends when no turn runs and all is sent,
    or before the gateway bound (a final comment says where to resume)."""
    async for sse in display_stream(views, sealer, view.conversation, cursor,
                                    settings.gateway_bound_s):
        yield sse


@router.get("/conversations/{conversation}/turns/{turn}", responses=NOT_FOUND)
async def get_turn(turn: str, view: OwnedDep, views: AssistantDep, sealer: SealerDep
                   ) -> AssistantTurnOut:
    """A turn's state (``Thinking`` | ``Replied`` | ``Failed`` | ``Cancelled``), its final text
    and its cards."""
    conversation = view.conversation
    if turn_conversation(turn) != conversation:
        raise HTTPException(404, f"no turn {turn!r} in {conversation!r}")
    await views.wait(conversation, lambda: turn in view.turns, VIEW_WAIT_S)
    tv = view.turns.get(turn)
    if tv is None:
        raise HTTPException(404, f"no turn {turn!r} in {conversation!r}")
    text, cards, cost = None, [], None
    if tv.reply is not None:
        rid = tv.reply.reply_id
        try:
            text = sealer.open_json(conversation, f"{rid}/chain", tv.reply.chain).get("text")
            cards = sealer.open_json(conversation, f"{rid}/cards", tv.reply.cards).get("cards")
        except KeyErased:
            raise HTTPException(404, f"no conversation {conversation!r}") from None
        cost = tv.reply.cost_usd
    return AssistantTurnOut(turn=turn, conversation_id=conversation, state=tv.state,  # type: ignore[arg-type]
                            text=text, cards=cards or [], end_reason=tv.end_reason,
                            reason=tv.reason, cost_usd=cost)


@router.post("/conversations/{conversation}/turns/{turn}/cancel", status_code=202,
             responses=NOT_FOUND)
async def cancel_turn(turn: str, view: OwnedDep, views: AssistantDep, settings: SettingsDep,
                      producer: ProducerDep, tail: TailDep, principal: PrincipalDep
                      ) -> CancelRequested:
    """Ask a running turn to stop (before its next model call, or while a tool runs); it then
    ends ``Cancelled``. A turn that already ended records nothing and answers its state."""
    conversation = view.conversation
    if turn_conversation(turn) != conversation:
        raise HTTPException(404, f"no turn {turn!r} in {conversation!r}")
    await views.wait(conversation, lambda: turn in view.turns, VIEW_WAIT_S)
    tv = view.turns.get(turn)
    if tv is None:
        raise HTTPException(404, f"no turn {turn!r} in {conversation!r}")
    if tv.state != "Thinking":
        return CancelRequested(turn=turn, state=tv.state)
    ack = await submit(settings, producer, tail, principal, turn, WorkflowCommandReceived(
        workflow=turn, command="cancel", command_id=new_id(), by=principal.sub))
    if ack.outcome == "rejected":
        raise HTTPException(409, f"turn {turn!r} cannot be cancelled: {ack.detail}")
    return CancelRequested(turn=turn, state="Thinking")
