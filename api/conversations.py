"""Participant routes over conversations (``/me/conversations``)."""

from __future__ import annotations

import secrets

from fastapi import APIRouter, HTTPException
from pydantic import BaseModel

from api.commands import submit
from api.deps import PrincipalDep, ProducerDep, SettingsDep, TailDep, ViewsDep
from schemas.conversation import StartConversation

router = APIRouter(prefix="/me/conversations", tags=["conversations"])


class ConversationCreated(BaseModel):
    conversation: str


class ConversationSummary(BaseModel):
    conversation: str
    last_seq: int


@router.post("", status_code=201)
async def create_conversation(
    settings: SettingsDep, producer: ProducerDep, tail: TailDep, principal: PrincipalDep
) -> ConversationCreated:
    """Open a conversation owned by the caller."""
    conversation = f"cnv-{secrets.token_hex(8)}"
    ack = await submit(settings, producer, tail, principal, conversation,
                       StartConversation(conversation=conversation, owner=principal.sub))
    if ack.outcome != "accepted":
        raise HTTPException(409, f"conversation not opened: {ack.detail.get('reason')}")
    return ConversationCreated(conversation=conversation)


@router.get("")
async def list_conversations(
    views: ViewsDep, principal: PrincipalDep
) -> list[ConversationSummary]:
    """The caller's conversations."""
    return [ConversationSummary(conversation=v.conversation, last_seq=v.last_seq)
            for v in views.list_for(principal.sub)]
