"""The dev sign-in: ``POST /dev/token`` mints a short-lived token for the form on each page.

It exists only when the deployment is ``dev`` *and* the edge listens on a loopback address
(``streams.settings.is_loopback``): anyone who reaches it can be anyone, so it must never be
reachable from another machine, nor in ``test`` or ``prod`` whatever the bind. The pages ask
``GET /web/config`` (always there, public) whether to offer the form.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from streams.capabilities import Role
from streams.ids import TENANT_PATTERN
from streams.settings import VoiceSettings, is_loopback
from streams.tokens import mint_token

DEV_TOKEN_TTL_S = 3600
"""A dev token's lifetime (capped by ``VOICE_JWT_MAX_LIFETIME_S``): a working session."""


def dev_signin_allowed(settings: VoiceSettings, bind_host: str | None) -> bool:
    """Whether the dev sign-in route may exist: ``dev`` on a loopback bind (None: unknown bind,
    so no), with HS* tokens accepted (else nothing minted here would verify)."""
    return (settings.env == "dev" and bind_host is not None and is_loopback(bind_host)
            and settings.verifies_with_secret)


class DevTokenIn(BaseModel):
    """Who to sign in as."""

    model_config = ConfigDict(extra="forbid")

    sub: Annotated[str, Field(min_length=1, max_length=256, pattern=r"^[A-Za-z0-9._@-]+$")]
    """The subject: letters, digits and ``._@-``."""
    role: Role = "participant"
    tenant: Annotated[str, Field(pattern=TENANT_PATTERN)] = "default"


class DevTokenOut(BaseModel):
    token: str
    expires_in: int
    """Seconds the token is good for."""


class WebConfig(BaseModel):
    """What a page needs to know before anyone signs in."""

    dev_signin: bool
    """Whether ``POST /dev/token`` exists on this edge (so the page offers the form)."""


def web_config(allowed: bool) -> Callable[[], Awaitable[WebConfig]]:
    """The handler of ``GET /web/config``, public: asking for it never fails, unlike probing
    ``/dev/token`` (a 404 the browser would log as an error)."""

    async def web_config() -> WebConfig:
        """Whether this edge offers the dev sign-in."""
        return WebConfig(dev_signin=allowed)

    return web_config


def dev_signin_router(settings: VoiceSettings) -> APIRouter:
    """The ``/dev/token`` route, minting with ``settings``' dev secret."""
    router = APIRouter(tags=["dev"])
    ttl = min(DEV_TOKEN_TTL_S, settings.jwt_max_lifetime_s)

    @router.post("/dev/token", include_in_schema=False)
    async def dev_token(body: DevTokenIn) -> DevTokenOut:
        """A token for ``body.sub`` with ``body.role`` in ``body.tenant`` (dev, loopback only)."""
        return DevTokenOut(token=mint_token(settings, body.sub, body.role, body.tenant, ttl_s=ttl),
                           expires_in=ttl)

    return router
