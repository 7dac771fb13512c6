"""Dependencies of the assistant routes: its views, the caller's own conversation (404 for
anyone else's), and where a conversation's display stream resumes (any cursor)."""

from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import Depends, Request

from api.assistant.views import AssistantConversations, AssistantConversationView, AssistantViews
from api.frame.deps import owned_dependency
from api.frame.sse import cursor_dependency

NOT_FOUND = {404: {"description": "No such conversation (or dataset) of the caller's."}}


async def get_assistant(request: Request) -> AssistantViews:
    return request.app.state.assistant


async def get_conversations(request: Request) -> AssistantConversations:
    return request.app.state.assistant.conversations


def is_uuid(text: str) -> bool:
    try:
        uuid.UUID(text)
    except ValueError:
        return False
    return True


owned_conversation = owned_dependency(get_conversations, valid=is_uuid,
                                      description="The conversation id (a UUID).")

AssistantDep = Annotated[AssistantViews, Depends(get_assistant)]
OwnedDep = Annotated[AssistantConversationView, Depends(owned_conversation)]
CursorDep = Annotated[int, Depends(cursor_dependency(owned_conversation, reads_older=True))]
"""Any cursor: one older than the display events the edge keeps is read from the log."""
