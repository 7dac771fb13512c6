"""Bearer tokens: what a token claims (``Claims``), minting one for local use (``voice token``)
and verifying one (RFC 8725). Shared by the edge and the telemetry query endpoint, which both
turn claims into capabilities through ``streams.capabilities``.

Claims: ``sub`` (non-empty), ``role`` (in the claimed tenant), ``tenant`` (optional),
``memberships`` (optional: tenant → role). A token naming neither a tenant nor memberships is a
member of the deployment's default tenant only.

Verification, in this order: size (``MAX_TOKEN_BYTES``) and shape; the header's ``alg``
against the pinned allow-list (``VOICE_JWT_ALGORITHMS``; ``none`` can never be on it); the key
chosen by that family alone — HS* the shared secret, RS256/ES256 the identity provider's key
named by ``kid`` from ``VOICE_JWT_JWKS_URL`` — so one kind of key never verifies the other kind
of token; the signature; ``exp``, ``iat``, ``aud``, ``iss`` required and checked with at most
``VOICE_JWT_LEEWAY_S``; ``exp - iat`` at most ``VOICE_JWT_MAX_LIFETIME_S``; then the claims.

Every refusal is an ``AuthError`` (the edge: 401) whose message never echoes the token. Only the
identity provider being unreachable is not the caller's fault: ``KeysUnavailable`` (503).

A token verified is not verified again for ``VERIFIED_TTL_S`` (never past its ``exp`` and the
leeway): its claims are kept per process, under the settings that verified it (``_Verified``).
A client sends the same token with every request, and verifying it was ~6 % of the edge's
loop under load (docs/benchmarks.md, issue 14, twenty-second pass). A refused token is never
kept: it is refused again, in full, every time.
"""

from __future__ import annotations

import asyncio
import logging
import re
import threading
import time
from typing import Annotated

import jwt
from jwt import PyJWK, PyJWKClient
from jwt.exceptions import PyJWKClientConnectionError, PyJWKClientError
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from streams.capabilities import ROLES, Role
from streams.ids import TENANT_PATTERN
from streams.settings import HS_ALGORITHMS, VoiceSettings

log = logging.getLogger(__name__)

MAX_TOKEN_BYTES = 8 * 1024
"""Longer tokens are refused before any parsing: no identity provider issues one this big."""

KEYS_RETRY_AFTER_S = 5
"""The ``Retry-After`` of a 503 while the identity provider's keys cannot be fetched."""

VERIFIED_TTL_S = 60.0
"""How long a verified token's claims are used without verifying it again. Below the JWKS
cache's default (``VOICE_JWT_JWKS_CACHE_S``, 300 s), which already keeps honouring a key the
identity provider has just removed for that long."""

VERIFIED_MAX = 4096
"""Verified tokens kept per process (the oldest dropped first): with tokens of at most
``MAX_TOKEN_BYTES``, at most ~32 MB; a few hundred bytes each in practice."""

_COMPACT_JWS = re.compile(r"[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*")
"""RFC 7515 compact serialization: three base64url segments (the signature empty only for
``alg: none``, which the allow-list refuses next)."""

_KEY_TYPE = {"RS256": "RSA", "ES256": "EC"}
"""The JWK ``kty`` each JWKS algorithm's key must have."""


class AuthError(Exception):
    """A token that cannot be trusted; the message says why (never echoes the token)."""


class KeysUnavailable(Exception):
    """The identity provider's keys (JWKS) could not be fetched: not the caller's fault, and
    not an internal error either (the edge answers 503 with ``Retry-After``)."""

    def __init__(self, message: str, retry_after_s: int = KEYS_RETRY_AFTER_S) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


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
    ttl_s: int | None = None, memberships: dict[str, str] | None = None,
) -> str:
    """A JWT signed with ``VOICE_JWT_SECRET`` for local use (``voice token``), carrying the
    deployment's ``aud`` and ``iss``; ``ttl_s`` defaults to, and may not exceed, the maximum
    lifetime (a negative one mints an expired token, for tests)."""
    for r in (role, *(memberships or {}).values()):
        if r not in ROLES:
            raise ValueError(f"role {r!r} is not one of {', '.join(ROLES)}")
    algorithm = next((a for a in settings.jwt_algorithms if a in HS_ALGORITHMS), None)
    if algorithm is None:
        raise ValueError("VOICE_JWT_ALGORITHMS allows no HS* algorithm: tokens come only from "
                         "the identity provider (VOICE_JWT_JWKS_URL), none can be minted here")
    ttl = settings.jwt_max_lifetime_s if ttl_s is None else ttl_s
    if ttl > settings.jwt_max_lifetime_s:
        raise ValueError(f"a lifetime of {ttl} s is above VOICE_JWT_MAX_LIFETIME_S="
                         f"{settings.jwt_max_lifetime_s}")
    now = int(time.time())
    claims: dict[str, object] = {"sub": sub, "role": role, "iat": now, "exp": now + ttl,
                                 "aud": settings.jwt_audience, "iss": settings.jwt_issuer}
    if tenant is not None:
        claims["tenant"] = tenant
    if memberships:
        claims["memberships"] = memberships
    return jwt.encode(claims, settings.jwt_secret.get_secret_value(), algorithm)


def decode_claims(settings: VoiceSettings, token: str) -> Claims:
    """The claims of a bearer token it verifies; ``AuthError`` saying why not, or
    ``KeysUnavailable`` when the identity provider's keys cannot be fetched.

    May block on the JWKS endpoint (at most ``VOICE_JWT_JWKS_TIMEOUT_S``): async callers use
    ``verify_token``.
    """
    scope = _scope(settings)
    claims = _VERIFIED.get(scope, token)
    if claims is None:
        claims, expires = _verify(settings, token)
        _VERIFIED.put(scope, token, claims, expires + settings.jwt_leeway_s)
    return claims


def _verify(settings: VoiceSettings, token: str) -> tuple[Claims, int]:
    """The claims of a token verified now, and its ``exp``."""
    size = len(token.encode("utf-8", "replace"))
    if size > MAX_TOKEN_BYTES:
        raise AuthError(f"invalid token: {size} bytes; the limit is {MAX_TOKEN_BYTES}")
    if not _COMPACT_JWS.fullmatch(token):
        raise AuthError("invalid token: not a JWS in compact form (three base64url segments)")
    try:
        algorithm = _pinned_algorithm(settings, token)
        key: str | PyJWK = (settings.jwt_secret.get_secret_value() if algorithm in HS_ALGORITHMS
                            else _jwks_key(settings, token, algorithm))
        raw = jwt.decode(
            token, key, algorithms=[algorithm], audience=settings.jwt_audience,
            issuer=settings.jwt_issuer, leeway=settings.jwt_leeway_s,
            options={"require": ["sub", "exp", "iat", "aud", "iss"]},
        )
    except jwt.PyJWTError as exc:
        raise AuthError(f"invalid token: {exc}") from None
    lifetime = int(raw["exp"]) - int(raw["iat"])  # pyjwt has checked that both are integers
    if lifetime > settings.jwt_max_lifetime_s:
        raise AuthError(f"invalid token: its lifetime (exp - iat) is {lifetime} s; the limit is "
                        f"{settings.jwt_max_lifetime_s} s")
    try:
        return Claims.model_validate(raw), int(raw["exp"])
    except ValidationError as exc:
        where = ", ".join(".".join(map(str, e["loc"])) or "claims" for e in exc.errors())
        raise AuthError(f"invalid token claims: {where}") from None


async def verify_token(settings: VoiceSettings, token: str) -> Claims:
    """``decode_claims`` for async callers: when keys may have to be fetched from the identity
    provider, in a worker thread, so a slow JWKS endpoint never stalls the event loop (a token
    verified lately is answered on the loop)."""
    if settings.jwt_jwks_url:
        claims = _VERIFIED.get(_scope(settings), token)
        if claims is not None:
            return claims
        return await asyncio.to_thread(decode_claims, settings, token)
    return decode_claims(settings, token)


_Scope = tuple[object, ...]


def _scope(settings: VoiceSettings) -> _Scope:
    """Everything of the settings a verification depends on: a token verified under one
    secret, audience, issuer or allow-list is never taken as verified under another."""
    return (settings.jwt_secret.get_secret_value(), tuple(settings.jwt_algorithms),
            settings.jwt_jwks_url, settings.jwt_audience, settings.jwt_issuer,
            settings.jwt_leeway_s, settings.jwt_max_lifetime_s)


class _Verified:
    """Claims of tokens verified lately, by (scope, token); each good until the earlier of
    ``VERIFIED_TTL_S`` after its verification and its ``exp`` plus the leeway. Shared by the
    loop and the threads that verify with the identity provider's keys, hence the lock."""

    def __init__(self) -> None:
        self._entries: dict[tuple[_Scope, str], tuple[Claims, float]] = {}
        self._lock = threading.Lock()

    def get(self, scope: _Scope, token: str) -> Claims | None:
        """The token's kept claims while they are good; None to verify it."""
        entry = self._entries.get((scope, token))
        if entry is None:
            return None
        if time.time() < entry[1]:
            return entry[0]
        with self._lock:
            self._entries.pop((scope, token), None)
        return None

    def put(self, scope: _Scope, token: str, claims: Claims, expires: float) -> None:
        """Keep a token verified now (the oldest kept dropped past ``VERIFIED_MAX``)."""
        until = min(expires, time.time() + VERIFIED_TTL_S)
        with self._lock:
            self._entries.pop((scope, token), None)
            self._entries[(scope, token)] = (claims, until)
            while len(self._entries) > VERIFIED_MAX:
                del self._entries[next(iter(self._entries))]

    def clear(self) -> None:
        """Forget every verified token."""
        with self._lock:
            self._entries.clear()


_VERIFIED = _Verified()


def _pinned_algorithm(settings: VoiceSettings, token: str) -> str:
    """The header's ``alg`` if the deployment pins it (RFC 8725 §3.1), before any key is used."""
    alg = jwt.get_unverified_header(token).get("alg")
    if not isinstance(alg, str) or alg not in settings.jwt_algorithms:
        raise AuthError(f"invalid token: algorithm {alg!r} is not allowed (allowed: "
                        f"{', '.join(settings.jwt_algorithms)})")
    return alg


def _jwks_key(settings: VoiceSettings, token: str, algorithm: str) -> PyJWK:
    """The identity provider's key the token's ``kid`` names, of the type ``algorithm`` needs."""
    kid = jwt.get_unverified_header(token).get("kid")
    if not isinstance(kid, str) or not kid:
        raise AuthError(f"invalid token: an {algorithm} token must name its key (kid)")
    client = _jwks_client(settings)
    try:
        # The set first: a failure here is the provider's (unreachable, or not a usable JWKS).
        keys = client.get_signing_keys()
    except (PyJWKClientError, jwt.PyJWTError) as exc:
        raise _unavailable(client.uri, exc) from None
    key = client.match_kid(keys, kid)
    if key is None:
        try:
            # Refetches the set (a key just rotated in), at most once per cooldown.
            key = client.get_signing_key(kid)
        except PyJWKClientConnectionError as exc:
            raise _unavailable(client.uri, exc) from None
        except (PyJWKClientError, jwt.PyJWTError):
            raise AuthError(
                f"invalid token: no key {kid!r} in the identity provider's JWKS") from None
    if key.key_type != _KEY_TYPE[algorithm] or key.algorithm_name != algorithm:
        raise AuthError(f"invalid token: key {kid!r} is a {key.key_type} "
                        f"{key.algorithm_name} key, not for {algorithm}")
    return key


def _unavailable(url: str, exc: Exception) -> KeysUnavailable:
    # The cause goes to the log, not to the caller: it names the provider's internals.
    log.warning("JWKS %s unavailable: %s", url, exc)
    return KeysUnavailable("the identity provider's keys cannot be fetched; try again shortly")


_clients: dict[tuple[str, float, float], PyJWKClient] = {}
_clients_lock = threading.Lock()


def _jwks_client(settings: VoiceSettings) -> PyJWKClient:
    """One client per JWKS URL and process, so its key set is cached across requests."""
    if not settings.jwt_jwks_url:  # the settings' validator refuses a JWKS algorithm without one
        raise RuntimeError("VOICE_JWT_JWKS_URL is not set")
    spec = (settings.jwt_jwks_url, settings.jwt_jwks_cache_s, settings.jwt_jwks_timeout_s)
    with _clients_lock:
        if spec not in _clients:
            _clients[spec] = PyJWKClient(spec[0], cache_jwk_set=True, lifespan=spec[1],
                                         timeout=spec[2])
        return _clients[spec]

