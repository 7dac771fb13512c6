"""Participant routes over conversations (``/me/conversations``); the stream is in ``api.stream``.

Every route answers at once from a Kafka ack or this edge's view of the log; none waits for
a model. Content is sealed here before it is produced and opened here only for its owner.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated

from fastapi import APIRouter, Header, HTTPException, Response
from fastapi.exceptions import RequestValidationError

from api import render
from api.commands import submit
from api.deps import (
    VIEW_WAIT_S,
    OwnedDep,
    PrincipalDep,
    ProducerDep,
    SealerDep,
    SettingsDep,
    TailDep,
    ViewsDep,
    not_found,
)
from api.models import (
    CancelRequested,
    ConversationCreated,
    ConversationOut,
    ConversationSummary,
    MessageAccepted,
    MessageIn,
    MessageOut,
    TurnOut,
)
from api.views import ConversationView, ConversationViews
from schemas.conversation import EraseConversation, MessageRecorded, SendMessage, StartConversation
from schemas.system import CommandAcknowledged
from schemas.workflow import WorkflowCommandReceived
from streams.envelope import new_id
from streams.ids import parse_turn
from streams.sealing import KeyErased, Sealer

router = APIRouter(prefix="/me/conversations", tags=["conversations"])

NOT_FOUND = {404: {"description": "No such conversation of the caller's (or it was erased)."}}
@contextmanager
def opening(views: ConversationViews, conversation: str) -> Iterator[None]:
    """Turn ``KeyErased`` (erased by another edge, not yet on this edge's view) into 404."""
    try:
        yield
    except KeyErased:
        views.mark_erased(conversation)
        raise not_found(conversation) from None


def refused(ack: CommandAcknowledged, conversation: str) -> HTTPException:
    reason = str(ack.detail.get("reason") or "refused")
    if reason == "no such conversation":
        return not_found(conversation)
    return HTTPException(409, f"conversation {conversation!r}: {reason}")


@router.post("", status_code=201)
async def create_conversation(
    settings: SettingsDep, producer: ProducerDep, tail: TailDep, views: ViewsDep,
    sealer: SealerDep, principal: PrincipalDep,
) -> ConversationCreated:
    """Open a conversation owned by the caller."""
    conversation = f"cnv-{secrets.token_hex(8)}"
    # The data key exists before the conversation does, so its first message can be sealed.
    await asyncio.to_thread(sealer.create, conversation)
    ack = await submit(settings, producer, tail, principal, conversation,
                       StartConversation(conversation=conversation, owner=principal.sub))
    if ack.outcome != "accepted":
        raise HTTPException(409, f"conversation not opened: {ack.detail.get('reason')}")
    # Read-your-writes on this edge: the ack may overtake the log record by a moment.
    await views.wait(conversation, lambda v: v is not None, VIEW_WAIT_S)
    return ConversationCreated(conversation=conversation)


@router.get("")
async def list_conversations(
    views: ViewsDep, principal: PrincipalDep
) -> list[ConversationSummary]:
    """The caller's conversations."""
    return [ConversationSummary(conversation=v.conversation, last_seq=v.last_seq)
            for v in views.list_for(principal.sub)]


@router.post("/{conversation}/messages", status_code=202,
             responses={**NOT_FOUND, 409: {"description": "The conversation refused it."}})
async def send_message(
    body: MessageIn, view: OwnedDep, settings: SettingsDep, producer: ProducerDep,
    tail: TailDep, views: ViewsDep, sealer: SealerDep, principal: PrincipalDep,
    idempotency_key: Annotated[str | None, Header(
        alias="Idempotency-Key", min_length=1, max_length=200,
        description="Sending again with the same key returns the first answer; "
                    "the message is recorded once.")] = None,
) -> MessageAccepted:
    """Record a message; its turn runs later. Read it at ``…/turns/{turn}`` or on the stream.

    422 (at ``body.text``) for empty, blank or oversized text (``VOICE_MAX_MESSAGE_BYTES``)."""
    size = len(body.text.encode("utf-8"))
    if size > settings.max_message_bytes:
        raise RequestValidationError([{
            "type": "string_too_long", "loc": ("body", "text"), "input": None,
            "msg": f"text is {size} UTF-8 bytes; the limit is {settings.max_message_bytes}",
            "ctx": {"max_bytes": settings.max_message_bytes},
        }])
    conversation = view.conversation
    message_id = new_id()
    with opening(views, conversation):
        sealed = sealer.seal(conversation, message_id, body.text)
    ack = await submit(settings, producer, tail, principal, conversation,
                       SendMessage(conversation=conversation, message_id=message_id,
                                   text=sealed, idempotency_key=idempotency_key))
    if ack.outcome == "rejected" or ack.seq is None:
        raise refused(ack, conversation)
    text = body.text
    if ack.outcome == "duplicate":
        text = await original_text(views, sealer, conversation, ack.seq, default=body.text)
    return MessageAccepted(turn=str(ack.detail["turn"]),
                           message=MessageOut(seq=ack.seq, text=text, at=str(ack.detail["at"])))


async def original_text(views: ConversationViews, sealer: Sealer, conversation: str,
                        seq: int, default: str) -> str:
    """The text of the message recorded at ``seq`` (the first of a repeated request)."""
    await views.wait(conversation, lambda v: v is None or v.erased or v.last_seq >= seq, 1.0)
    view = views.by_id.get(conversation)
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
    parsed = parse_turn(turn)
    if parsed is None or parsed[0] != conversation:
        raise HTTPException(404, f"no turn {turn!r} in {conversation!r}")
    message_seq = parsed[1]

    def known(v: ConversationView | None) -> bool:
        # The sequencer records Thinking two seqs after the message: past it, the view knows.
        if v is None or v.erased:
            return True
        tv = v.turns.get(turn)
        return (tv is not None and tv.state is not None) or v.last_seq >= message_seq + 2

    await views.wait(conversation, known, VIEW_WAIT_S)
    tv = view.turns.get(turn)
    if view.erased:
        raise not_found(conversation)
    if tv is None or tv.state is None:
        raise HTTPException(404, f"no turn {turn!r} in {conversation!r}")
    with opening(views, conversation):
        return render.turn_out(sealer, tv)


@router.post("/{conversation}/turns/{turn}/cancel", status_code=202, responses=NOT_FOUND)
async def cancel_turn(
    turn: str, view: OwnedDep, views: ViewsDep, settings: SettingsDep, producer: ProducerDep,
    tail: TailDep, principal: PrincipalDep,
) -> CancelRequested:
    """Ask a running turn to stop: honoured before its next model call and while a tool runs.

    The turn then ends ``CouldNotInterpret`` with a reason saying it was cancelled; a turn that
    already ended is left as it is."""
    conversation = view.conversation
    parsed = parse_turn(turn)
    if parsed is None or parsed[0] != conversation:
        raise HTTPException(404, f"no turn {turn!r} in {conversation!r}")
    tv = view.turns.get(turn)
    if tv is None or tv.state is None:
        raise HTTPException(404, f"no turn {turn!r} in {conversation!r}")
    if tv.state != "Thinking":
        return CancelRequested(turn=turn, state=tv.state)
    ack = await submit(settings, producer, tail, principal, turn, WorkflowCommandReceived(
        workflow=turn, command="cancel", command_id=new_id(), by=principal.sub))
    if ack.outcome == "rejected":
        raise refused(ack, conversation)
    return CancelRequested(turn=turn, state="Thinking")


@router.get("/{conversation}", responses=NOT_FOUND)
async def get_conversation(view: OwnedDep, views: ViewsDep, sealer: SealerDep
                           ) -> ConversationOut:
    """The conversation as its owner sees it: messages and replies, proposals, turns."""
    with opening(views, view.conversation):
        return render.conversation_out(sealer, view)


@router.delete("/{conversation}", status_code=204, responses=NOT_FOUND)
async def erase_conversation(
    view: OwnedDep, settings: SettingsDep, producer: ProducerDep, tail: TailDep,
    views: ViewsDep, sealer: SealerDep, principal: PrincipalDep,
) -> Response:
    """Erase the conversation: its key is destroyed first, so every copy of its content, on
    every topic and store, is unreadable at once; then the log records the erasure."""
    conversation = view.conversation
    await asyncio.to_thread(sealer.erase, conversation)
    views.mark_erased(conversation)
    ack = await submit(settings, producer, tail, principal, conversation,
                       EraseConversation(conversation=conversation))
    if ack.outcome == "rejected":
        raise refused(ack, conversation)
    return Response(status_code=204)
