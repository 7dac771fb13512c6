"""JWT principals for the edge: decoding bearer tokens and minting dev tokens (``voice token``)."""

from __future__ import annotations

import time
from typing import Literal

import jwt
from pydantic import BaseModel, ConfigDict

from streams.settings import VoiceSettings

Role = Literal["participant", "staff", "reviewer", "representative", "operator"]
ROLES: tuple[str, ...] = ("participant", "staff", "reviewer", "representative", "operator")


class Principal(BaseModel):
    """Who is calling: subject, role and tenant from the token."""

    model_config = ConfigDict(frozen=True)

    sub: str
    role: Role
    tenant: str = "default"


class AuthError(Exception):
    """A token that cannot be trusted; the message says why (never echoes the token)."""


def mint_token(
    settings: VoiceSettings, sub: str, role: str, tenant: str = "default", ttl_s: int = 86400
) -> str:
    """A signed JWT for local use (``voice token``)."""
    if role not in ROLES:
        raise ValueError(f"role {role!r} is not one of {', '.join(ROLES)}")
    now = int(time.time())
    claims = {"sub": sub, "role": role, "tenant": tenant, "iat": now, "exp": now + ttl_s}
    return jwt.encode(claims, settings.jwt_secret.get_secret_value(), settings.jwt_algorithm)


def decode_token(settings: VoiceSettings, token: str) -> Principal:
    """The principal a bearer token names, or ``AuthError``."""
    try:
        claims = jwt.decode(
            token, settings.jwt_secret.get_secret_value(), algorithms=[settings.jwt_algorithm],
            options={"require": ["sub", "exp"]},
        )
    except jwt.PyJWTError as exc:
        raise AuthError(f"invalid token: {exc}") from None
    try:
        return Principal(sub=claims["sub"], role=claims.get("role", "participant"),
                         tenant=claims.get("tenant", "default"))
    except ValueError as exc:
        raise AuthError(f"invalid token claims: {exc}") from None
