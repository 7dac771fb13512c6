"""Typed dependencies of the edge's routes: settings, producer, tail, views, principal."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from api.auth import AuthError, Principal, decode_token
from api.tail import EdgeTail
from api.views import ConversationViews
from streams.producer import RecordProducer
from streams.settings import VoiceSettings

_bearer = HTTPBearer(auto_error=False)


def get_settings(request: Request) -> VoiceSettings:
    return request.app.state.settings


def get_producer(request: Request) -> RecordProducer:
    return request.app.state.producer


def get_tail(request: Request) -> EdgeTail:
    return request.app.state.tail


def get_views(request: Request) -> ConversationViews:
    return request.app.state.views


def get_principal(
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

    def check(principal: Annotated[Principal, Depends(get_principal)]) -> Principal:
        if principal.role not in roles:
            raise HTTPException(403, f"role {principal.role!r} may not call this route")
        return principal

    return check


SettingsDep = Annotated[VoiceSettings, Depends(get_settings)]
ProducerDep = Annotated[RecordProducer, Depends(get_producer)]
TailDep = Annotated[EdgeTail, Depends(get_tail)]
ViewsDep = Annotated[ConversationViews, Depends(get_views)]
PrincipalDep = Annotated[Principal, Depends(get_principal)]
ParticipantDep = Annotated[Principal, Depends(require_role("participant"))]
