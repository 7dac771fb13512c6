"""Bearer tokens: what a token claims (``Claims``), minting one for local use (``voice token``)
and verifying one. Shared by the edge and the telemetry query endpoint, which both turn claims
into capabilities through ``streams.capabilities``.

Claims: ``sub`` (non-empty), ``role`` (in the claimed tenant), ``tenant`` (optional),
``memberships`` (optional: tenant → role). A token naming neither a tenant nor memberships is a
member of the deployment's default tenant only.
"""

from __future__ import annotations

import time
from typing import Annotated

import jwt
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from streams.capabilities import ROLES, Role
from streams.ids import TENANT_PATTERN
from streams.settings import VoiceSettings


class AuthError(Exception):
    """A token that cannot be trusted; the message says why (never echoes the token)."""


class Claims(BaseModel):
    """What a verified token says about its bearer."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    sub: str = Field(min_length=1, max_length=256)
    role: Role = "participant"
    tenant: str | None = Field(default=None, pattern=TENANT_PATTERN)
    memberships: dict[Annotated[str, StringConstraints(pattern=TENANT_PATTERN)], Role] = Field(
        default_factory=dict, max_length=256)

    def member_roles(self, default_tenant: str) -> dict[str, Role]:
        """tenant → role for every tenant the bearer belongs to, the claimed tenant first."""
        roles: dict[str, Role] = {}
        if self.tenant is not None:
            roles[self.tenant] = self.role
        for tenant, role in self.memberships.items():
            roles.setdefault(tenant, role)
        return roles or {default_tenant: self.role}


def mint_token(
    settings: VoiceSettings, sub: str, role: str, tenant: str | None = "default",
    ttl_s: int = 86400, memberships: dict[str, str] | None = None,
) -> str:
    """A signed JWT for local use (``voice token``)."""
    for r in (role, *(memberships or {}).values()):
        if r not in ROLES:
            raise ValueError(f"role {r!r} is not one of {', '.join(ROLES)}")
    now = int(time.time())
    claims: dict[str, object] = {"sub": sub, "role": role, "iat": now, "exp": now + ttl_s}
    if tenant is not None:
        claims["tenant"] = tenant
    if memberships:
        claims["memberships"] = memberships
    return jwt.encode(claims, settings.jwt_secret.get_secret_value(), settings.jwt_algorithm)


def decode_claims(settings: VoiceSettings, token: str) -> Claims:
    """The claims of a bearer token it verifies, or ``AuthError`` saying why."""
    try:
        raw = jwt.decode(
            token, settings.jwt_secret.get_secret_value(), algorithms=[settings.jwt_algorithm],
            options={"require": ["sub", "exp"]},
        )
    except jwt.PyJWTError as exc:
        raise AuthError(f"invalid token: {exc}") from None
    try:
        return Claims.model_validate(raw)
    except ValidationError as exc:
        where = ", ".join(".".join(map(str, e["loc"])) or "claims" for e in exc.errors())
        raise AuthError(f"invalid token claims: {where}") from None
