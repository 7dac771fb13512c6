"""Typed dependencies every product's routes share: settings, sealer, principal and
roles, the caller's own resource (404 for anyone else's), views that must catch up with the
log, and the byte limit of a text field."""

import asyncio
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, TypeVar

from fastapi import Depends, Header, HTTPException, Path, Request
from fastapi.exceptions import RequestValidationError
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from api.frame.auth import Principal, TenantRefused, resolve_principal
from api.frame.cold import SCAN_TIMEOUT_S as COLD_READ_WAIT_S
from api.frame.cold import ColdReadFailed
from api.frame.deadline import cut_short, remaining
from api.frame.projection import Projection
from streams.capabilities import Capability
from streams.ids import TENANT_PATTERN, parse_turn
from streams.sealing import Sealer
from streams.settings import VoiceSettings
from streams.tokens import AuthError, KeysUnavailable, verify_token

V = TypeVar("V")

_bearer = HTTPBearer(auto_error=False)

VIEW_WAIT_S = 2.0
"""How long a route waits for this edge's view to catch up with the log (an aggregate made,
or changed, through another edge a moment ago) before it answers 404."""


async def get_settings(request: Request) -> VoiceSettings:
    return request.app.state.settings


async def get_sealer(request: Request) -> Sealer:
    return request.app.state.sealer


async def get_principal(
    request: Request,
    creds: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
    x_tenant_id: Annotated[str | None, Header(
        pattern=TENANT_PATTERN, description="The tenant to act in; the caller must be a member "
        "of it (default: the token's tenant, then its first membership)")] = None,
) -> Principal:
    return await principal_from(request.app.state.settings,
                                None if creds is None else creds.credentials, x_tenant_id)


async def principal_from(settings: VoiceSettings, token: str | None,
                         x_tenant_id: str | None) -> Principal:
    """The caller of a bearer ``token`` in the tenant ``x_tenant_id`` asks for: 401 without a
    token or for one that fails a check, 503 when the identity provider cannot say, 403 for a
    tenant the caller is not a member of. (``get_principal``, and the stream lane's.)"""
    if token is None:
        raise HTTPException(401, "missing bearer token (Authorization: Bearer …)")
    try:
        claims = await verify_token(settings, token)
    except AuthError as exc:
        raise HTTPException(401, str(exc)) from None
    except KeysUnavailable as exc:  # the identity provider's fault, not the caller's: retry
        raise HTTPException(503, str(exc), headers={
            "Retry-After": str(exc.retry_after_s)}) from None
    try:
        return resolve_principal(claims, x_tenant_id, settings.default_tenant)
    except TenantRefused as exc:
        raise HTTPException(403, str(exc)) from None


def require(capability: Capability) -> Callable[..., Awaitable[Principal]]:
    """A dependency that answers 403 unless the caller's role in its tenant has ``capability``
    (``streams.capabilities`` is the one table of who may do what)."""

    async def check(principal: Annotated[Principal, Depends(get_principal)]) -> Principal:
        return allowed(principal, capability)

    return check


def allowed(principal: Principal, capability: Capability) -> Principal:
    """``principal``, if its role in its tenant has ``capability``; else 403 naming it."""
    if not principal.can(capability):
        raise HTTPException(
            403, f"role {principal.role!r} in tenant {principal.tenant!r} lacks {capability!r}")
    return principal


SettingsDep = Annotated[VoiceSettings, Depends(get_settings)]
SealerDep = Annotated[Sealer, Depends(get_sealer)]
PrincipalDep = Annotated[Principal, Depends(get_principal)]
ConverseDep = Annotated[Principal, Depends(require("converse"))]
PublicDep = Annotated[Principal, Depends(require("issues.public"))]
ContributorDep = Annotated[Principal, Depends(require("contribute"))]
InspectDep = Annotated[Principal, Depends(require("edge.inspect"))]


def not_found(what: str, key: str) -> HTTPException:
    """The 404 of an unknown (or someone else's) ``what``: ``no {what} {key!r}``."""
    return HTTPException(404, f"no {what} {key!r}")


def check_turn(turn: str, conversation: str) -> int:
    """The seq that requested ``turn`` if it is a turn id of ``conversation``; else 404."""
    parsed = parse_turn(turn)
    if parsed is None or parsed[0] != conversation:
        raise no_turn(turn, conversation)
    return parsed[1]


def no_turn(turn: str, conversation: str) -> HTTPException:
    return HTTPException(404, f"no turn {turn!r} in {conversation!r}")


async def known(projection: Projection[V], key: str, timeout: float = VIEW_WAIT_S) -> V | None:
    """The view of ``key``, waiting at most ``timeout`` (less if the request's bound runs out
    first) for this edge to catch up with the log; None when it still does not know it."""
    await projection.wait(key, lambda v: v is not None, remaining(timeout))
    return projection.get(key)


def behind(what: str, key: str) -> HTTPException:
    """The 503 of a view that did not catch up before the request's bound ran out: it may
    yet, so "no such" (404) would be a guess."""
    return HTTPException(503, f"this edge has not caught up with {what} {key!r} within the "
                              "gateway bound; try again")


async def known_or_behind(projection: Projection[V], key: str, what: str,
                          timeout: float = VIEW_WAIT_S) -> V | None:
    """``known``, but 503 (``behind``) when the view does not know ``key`` and the wait was
    cut short by the request's bound: only a full wait may conclude "not there"."""
    short = cut_short(timeout)
    view = await known(projection, key, timeout)
    if view is None and short:
        raise behind(what, key)
    return view


async def ensured(projection: Projection[V], key: str, what: str) -> None:
    """Load what ``projection`` reads of ``key`` on demand (``Projection.ensure``: from before
    the edge's history window, or let go of); 503 (``behind``) while that read goes on or
    when it failed — a retry is answered from it, or tries again."""
    try:
        settled = await projection.ensure(key, remaining(COLD_READ_WAIT_S))
    except ColdReadFailed:
        settled = False
    if not settled:
        raise behind(what, key)


async def known_or_404(projection: Projection[V], key: str, what: str, tenant: str) -> V:
    """The view of ``key`` in ``tenant`` (read from the log if the projection reads such a key
    on demand, then waiting briefly for this edge to catch up); 404 naming ``what`` when
    unknown — or another tenant's, which must look the same."""
    await ensured(projection, key, what)
    await known_or_behind(projection, key, what)
    view = projection.in_tenant(key, tenant)
    if view is None:
        raise not_found(what, key)
    return view


async def find_owned(projection: Projection[V], key: str, who: Principal,
                     timeout: float = VIEW_WAIT_S, what: str = "conversation") -> V | None:
    """The view of ``key`` if ``who`` may read it (its tenant's and its owner), waiting for
    this edge to catch up (503 when the request's bound cuts that short, or when its
    records before the edge's history window could not be read)."""
    await ensured(projection, key, what)
    await known_or_behind(projection, key, what, timeout)
    return projection.owned(key, who)


def owned_dependency(projection_of: Callable[[Request], Awaitable[Projection[Any]]], *,
                     valid: Callable[[str], bool], description: str,
                     what: str = "conversation") -> Callable[..., Awaitable[Any]]:
    """A dependency giving the caller's own ``{conversation}`` of ``projection_of``'s views.

    404 if the id is malformed, unknown, erased, or someone else's — never 403: the answer
    must not reveal that another caller's resource exists.

    The projection and the sealer are read here, not taken as dependencies: FastAPI solves
    each dependency node of every request (~7 µs each on an idle core), and this one is on
    every route of a conversation (docs/benchmarks.md, thirty-fifth pass).
    """

    async def owned(
        request: Request,
        conversation: Annotated[str, Path(description=description)],
        principal: ConverseDep,
    ) -> Any:
        return await owned_view(await projection_of(request), conversation, principal,
                                request.app.state.sealer, valid=valid, what=what)

    return owned


async def owned_view(projection: Projection[V], key: str, principal: Principal, sealer: Sealer,
                     *, valid: Callable[[str], bool], what: str = "conversation") -> V:
    """The view of ``key`` if it is ``principal``'s (``find_owned``), its key held here; 404
    if the id is malformed, unknown, erased, or someone else's."""
    view = await find_owned(projection, key, principal, what=what) if valid(key) else None
    if view is None:
        raise not_found(what, key)
    if not sealer.holds(key):
        # A key made on another host and not read here yet: learnt in a thread, so the
        # route's opening never waits on the key topic on the event loop.
        await asyncio.to_thread(sealer.warm, key)
    return view


async def with_key(sealer: Sealer, key: str, use: Callable[..., V], *args: Any) -> V:
    """``use(*args)``, a sealer call with ``key``'s data key: on the loop when this edge holds
    the key (a dict lookup and microseconds of AES), else in a thread — the store then reads
    the key topic, or writes a new key, which must never wait on the event loop."""
    if sealer.holds(key):
        return use(*args)
    return await asyncio.to_thread(use, *args)


def check_text_size(settings: VoiceSettings, text: str, field: str = "text") -> None:
    """422 at ``body.{field}`` when ``text`` is over ``VOICE_MAX_MESSAGE_BYTES`` UTF-8 bytes
    (the same shape as the body's own validation errors)."""
    size = len(text.encode("utf-8"))
    if size > settings.max_message_bytes:
        raise RequestValidationError([{
            "type": "string_too_long", "loc": ("body", field), "input": None,
            "msg": f"{field} is {size} UTF-8 bytes; the limit is {settings.max_message_bytes}",
            "ctx": {"max_bytes": settings.max_message_bytes},
        }])
