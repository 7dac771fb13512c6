"""Typed dependencies of the edge's routes: settings, producer, tail, views, sealer, principal,
and the caller's own conversation (404 for anyone else's)."""

from __future__ import annotations

import re
from typing import Annotated

from fastapi import Depends, HTTPException, Path, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from api.auth import AuthError, Principal, decode_token
from api.tail import EdgeTail
from api.views import ConversationView, ConversationViews
from streams.producer import RecordProducer
from streams.sealing import Sealer
from streams.settings import VoiceSettings

_bearer = HTTPBearer(auto_error=False)

VIEW_WAIT_S = 2.0
"""How long a route waits for this edge's view to catch up with the log (a conversation made,
or a message sent, through another edge a moment ago) before it answers 404."""
CONVERSATION_ID = re.compile(r"^cnv-[0-9a-f]{8,32}$")


async def get_settings(request: Request) -> VoiceSettings:
    return request.app.state.settings


async def get_producer(request: Request) -> RecordProducer:
    return request.app.state.producer


async def get_tail(request: Request) -> EdgeTail:
    return request.app.state.tail


async def get_views(request: Request) -> ConversationViews:
    return request.app.state.views


async def get_sealer(request: Request) -> Sealer:
    return request.app.state.sealer


async def get_principal(
    request: Request,
    creds: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal:
    if creds is None:
        raise HTTPException(401, "missing bearer token (Authorization: Bearer …)")
    try:
        return decode_token(request.app.state.settings, creds.credentials)
    except AuthError as exc:
        raise HTTPException(401, str(exc)) from None


def require_role(*roles: str):  # noqa: ANN201
    """A dependency that answers 403 unless the caller has one of ``roles``."""

    async def check(principal: Annotated[Principal, Depends(get_principal)]) -> Principal:
        if principal.role not in roles:
            raise HTTPException(403, f"role {principal.role!r} may not call this route")
        return principal

    return check


def not_found(conversation: str) -> HTTPException:
    return HTTPException(404, f"no conversation {conversation!r}")


async def owned_conversation(
    conversation: Annotated[str, Path(description="The conversation id (cnv-…).")],
    views: Annotated[ConversationViews, Depends(get_views)],
    principal: Annotated[Principal, Depends(get_principal)],
) -> ConversationView:
    """The caller's conversation; 404 if unknown, erased, or someone else's (never 403: the
    answer must not reveal that another participant's conversation exists)."""
    if not CONVERSATION_ID.match(conversation):
        raise not_found(conversation)
    await views.wait(conversation, lambda v: v is not None, VIEW_WAIT_S)
    view = views.owned(conversation, principal.sub)
    if view is None:
        raise not_found(conversation)
    return view


SettingsDep = Annotated[VoiceSettings, Depends(get_settings)]
ProducerDep = Annotated[RecordProducer, Depends(get_producer)]
TailDep = Annotated[EdgeTail, Depends(get_tail)]
ViewsDep = Annotated[ConversationViews, Depends(get_views)]
SealerDep = Annotated[Sealer, Depends(get_sealer)]
PrincipalDep = Annotated[Principal, Depends(get_principal)]
OwnedDep = Annotated[ConversationView, Depends(owned_conversation)]
ParticipantDep = Annotated[Principal, Depends(require_role("participant"))]
