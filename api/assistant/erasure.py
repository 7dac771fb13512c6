"""Erasing what the assistant chat keeps: a chat (``DELETE …/conversations/{conversation}``) and
an uploaded dataset or image (``DELETE …/files/{file_id}``), each the caller's own.

The order is the conversations' (``api.conversations.routes.erase_conversation``): the id's data
key is destroyed first, so every copy of its content, on every topic and in every process, is
unreadable at once; then this edge's view forgets it; then the log records the erasure, which
tells every other edge. A chat's erasure is a command its sequencer answers (a turn still
running then ends on its worker and records nothing); a dataset has no writer of its own, so
its erasure is a record on ``voice.datasets``, its key's latest (what compaction keeps).

What a chat derived from a dataset (a summary of its columns in a request, a query's result in
a reply) is sealed under the chat's key, not the dataset's: erasing the dataset leaves those
with the chat, erasing the chat takes them (docs/keys.md).
"""

from __future__ import annotations

import asyncio
import re
from typing import Annotated

from fastapi import APIRouter, Path, Response

from api.assistant.deps import NOT_FOUND, AssistantDep, OwnedDep
from api.frame.commands import CommandsDep, conversation_refused
from api.frame.deps import ConverseDep, SealerDep, find_owned, not_found
from schemas.assistant import DATASET_ID, DatasetErased, EraseAssistantConversation
from streams.topics import DATASETS

router = APIRouter(prefix="/api/v1/assistant", tags=["assistant"])

_FILE_ID = re.compile(DATASET_ID)


@router.delete("/conversations/{conversation}", status_code=204, responses=NOT_FOUND)
async def erase_chat(view: OwnedDep, views: AssistantDep, commands: CommandsDep,
                     sealer: SealerDep) -> Response:
    """Erase the chat: its key is destroyed first (its requests, replies, display events,
    summaries and patterns no longer open anywhere), then the log records the erasure. A turn
    still running ends without a trace; the chat then answers 404, as an unknown id does."""
    conversation = view.conversation
    await asyncio.to_thread(sealer.erase, conversation)
    views.conversations.mark_erased(conversation)
    ack = await commands.submit(conversation,
                                EraseAssistantConversation(conversation=conversation))
    if ack.outcome == "rejected":
        raise conversation_refused(ack, conversation)
    return Response(status_code=204)


@router.delete("/files/{file_id}", status_code=204, responses=NOT_FOUND)
async def erase_file(
    file_id: Annotated[str, Path(description="The dataset_id or image_id of an upload.")],
    views: AssistantDep, commands: CommandsDep, sealer: SealerDep, principal: ConverseDep,
) -> Response:
    """Erase an uploaded dataset or image: its key is destroyed first (its bytes and name no
    longer open anywhere, and no turn can read it again), then ``voice.datasets`` records the
    erasure. A chat naming it afterwards gets 404 for it, as for an unknown id."""
    found = (await find_owned(views.datasets, file_id, principal, what="dataset")
             if _FILE_ID.match(file_id) else None)
    if found is None:
        raise not_found("dataset", file_id)
    await asyncio.to_thread(sealer.erase, file_id)
    views.datasets.mark_erased(file_id)
    env = commands.envelope(DatasetErased(dataset_id=file_id), file_id,
                            id=f"{file_id}:erased")
    await commands.record(DATASETS, env, "record the erasure")
    return Response(status_code=204)
