"""Bearer tokens (RFC 8725) and the secrets behind them.

Tokens: pinned algorithms, ``aud``/``iss``/``iat``/``exp`` required, a maximum lifetime, the
leeway, no key of one kind verifying a token of the other, RS256/ES256 from a JWKS this file
serves on loopback, and every bad token → 401 (an unreachable JWKS → 503) at the edge.
Secrets: ``VOICE_ENV=prod`` refuses weak ones; a non-loopback bind refuses the dev ones, in the
real ``voice`` command, before it connects to anything.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from fastapi import FastAPI
from fastapi.testclient import TestClient
from jwt.algorithms import ECAlgorithm, RSAAlgorithm
from pydantic import ValidationError
from typer.testing import CliRunner

from api import conversations
from api.conversations import ConversationViews
from streams import tokens
from streams.sealing import Sealer
from streams.settings import (
    DEV_JWT_SECRET,
    DEV_MASTER_KEY,
    InsecureBind,
    VoiceSettings,
    check_bind,
    is_loopback,
)
from streams.tokens import (
    MAX_TOKEN_BYTES,
    AuthError,
    KeysUnavailable,
    decode_claims,
    mint_token,
)
from tests.unit.test_conversation_routes import FakeProducer, FakeTail

ROOT = Path(__file__).resolve().parents[2]
REAL_SECRET = "a-real-secret-of-more-than-32-bytes-0123456789"
REAL_MASTER_KEY = base64.b64encode(b"\x01" * 32).decode()


def settings(**kw: Any) -> VoiceSettings:
    return VoiceSettings(env="test", **kw)


def b64url(data: bytes | str) -> str:
    raw = data.encode() if isinstance(data, str) else data
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def hs_token(payload: str | dict[str, Any], key: bytes | str = DEV_JWT_SECRET,
             header: dict[str, Any] | None = None) -> str:
    """A token HMAC-signed by hand, so a test can sign anything: raw JSON text (``Infinity``),
    any header, any key (a PEM public key, which pyjwt itself refuses to use)."""
    text = payload if isinstance(payload, str) else json.dumps(payload)
    signing_input = f"{b64url(json.dumps(header or {'alg': 'HS256', 'typ': 'JWT'}))}." \
                    f"{b64url(text)}"
    secret = key.encode() if isinstance(key, str) else key
    sig = hmac.new(secret, signing_input.encode(), hashlib.sha256).digest()
    return f"{signing_input}.{b64url(sig)}"


def claims(**over: Any) -> dict[str, Any]:
    """Valid claims for the default settings, with ``over`` replacing (None: removing) some."""
    now = int(time.time())
    base: dict[str, Any] = {"sub": "alice", "role": "participant", "aud": "voice",
                            "iss": "voice", "iat": now, "exp": now + 600}
    base.update(over)
    return {k: v for k, v in base.items() if v is not None}


def refused(s: VoiceSettings, token: str, match: str | None = None) -> str:
    with pytest.raises(AuthError, match=None if match is None else f"(?i){match}") as exc:
        decode_claims(s, token)
    assert str(exc.value).startswith("invalid token")  # what clients (and tests) look for
    return str(exc.value)


# --- HS tokens: what is required and checked ------------------------------------------------


def test_minted_token_carries_audience_issuer_and_lifetime() -> None:
    s = settings(jwt_audience="voice-edge", jwt_issuer="https://voice.example")
    token = mint_token(s, "alice", "staff", "acme", ttl_s=60)
    raw = jwt.decode(token, options={"verify_signature": False})
    assert (raw["aud"], raw["iss"], raw["exp"] - raw["iat"]) == (
        "voice-edge", "https://voice.example", 60)
    c = decode_claims(s, token)
    assert (c.sub, c.role, c.tenant) == ("alice", "staff", "acme")
    # Without --ttl, the maximum lifetime; above it, a clear refusal naming the setting.
    raw = jwt.decode(mint_token(s, "a", "participant"), options={"verify_signature": False})
    assert raw["exp"] - raw["iat"] == s.jwt_max_lifetime_s
    with pytest.raises(ValueError, match="VOICE_JWT_MAX_LIFETIME_S=86400"):
        mint_token(s, "alice", "participant", ttl_s=86401)


def test_expired_token_is_refused() -> None:
    s = settings(jwt_leeway_s=0)
    refused(s, mint_token(s, "alice", "participant", ttl_s=-10), "expired")


@pytest.mark.parametrize("alg", ["none", "None", "NONE", "nOnE", "", None])
def test_alg_none_is_refused(alg: str | None) -> None:
    header = b64url(json.dumps({"alg": alg, "typ": "JWT"}))
    for signature in ("", b64url(b"x")):
        refused(settings(), f"{header}.{b64url(json.dumps(claims()))}.{signature}",
                "not allowed")


def test_none_can_never_be_pinned() -> None:
    with pytest.raises(ValidationError, match="jwt_algorithms"):
        settings(jwt_algorithms=["none"])
    with pytest.raises(ValidationError, match="jwt_algorithms"):
        settings(jwt_algorithms=[])


def test_an_algorithm_not_pinned_is_refused_even_with_the_right_secret() -> None:
    secret = "s" * 64  # HS512 wants a key of 64 bytes at least (RFC 7518 §3.2)
    s = settings(jwt_algorithms=["HS256"], jwt_secret=secret)
    token = jwt.encode(claims(), secret, "HS512")
    assert refused(s, token, "not allowed") == (
        "invalid token: algorithm 'HS512' is not allowed (allowed: HS256)")
    assert decode_claims(settings(jwt_algorithms=["HS512"], jwt_secret=secret), token)


@pytest.mark.parametrize("aud", ["other", ["other", "more"], None])
def test_wrong_or_missing_audience_is_refused(aud: Any) -> None:
    refused(settings(), jwt.encode(claims(aud=aud), DEV_JWT_SECRET), "aud")
    other = settings(jwt_audience="other")
    refused(other, mint_token(settings(), "alice", "participant"), "audience")
    assert decode_claims(other, jwt.encode(claims(aud=["x", "other"]), DEV_JWT_SECRET))


@pytest.mark.parametrize("iss", ["https://evil.example", None])
def test_wrong_or_missing_issuer_is_refused(iss: str | None) -> None:
    refused(settings(), jwt.encode(claims(iss=iss), DEV_JWT_SECRET), "iss")
    refused(settings(jwt_issuer="idp"), mint_token(settings(), "alice", "participant"), "issuer")


@pytest.mark.parametrize("missing", ["iat", "exp", "sub"])
def test_iat_exp_and_sub_are_required(missing: str) -> None:
    refused(settings(), jwt.encode(claims(**{missing: None}), DEV_JWT_SECRET), missing)


def test_a_lifetime_above_the_maximum_is_refused() -> None:
    s = settings(jwt_max_lifetime_s=3600)
    now = int(time.time())
    assert decode_claims(s, jwt.encode(claims(iat=now, exp=now + 3600), DEV_JWT_SECRET))
    msg = refused(s, jwt.encode(claims(iat=now, exp=now + 3601), DEV_JWT_SECRET), "lifetime")
    assert "3601 s" in msg and "3600 s" in msg
    # An iat far in the past does not buy a longer life either.
    refused(s, jwt.encode(claims(iat=now - 86400, exp=now + 60), DEV_JWT_SECRET), "lifetime")
    # Nor can iat be in the future beyond the leeway.
    refused(s, jwt.encode(claims(iat=now + 60, exp=now + 120), DEV_JWT_SECRET), "not yet valid")


def test_voice_token_refuses_a_ttl_above_the_maximum(monkeypatch: pytest.MonkeyPatch) -> None:
    from deploy.cli import app

    monkeypatch.setenv("VOICE_JWT_MAX_LIFETIME_S", "600")
    result = CliRunner().invoke(app, ["token", "--sub", "bob", "--ttl", "601"])
    assert result.exit_code == 2 and "VOICE_JWT_MAX_LIFETIME_S=600" in result.output
    result = CliRunner().invoke(app, ["token", "--sub", "bob"])
    assert result.exit_code == 0, result.output
    raw = jwt.decode(result.output.strip(), options={"verify_signature": False})
    assert raw["exp"] - raw["iat"] == 600


def test_leeway_is_applied_and_at_most_30_s() -> None:
    token = mint_token(settings(), "alice", "participant", ttl_s=-3)  # expired 3 s ago
    assert decode_claims(settings(jwt_leeway_s=10), token).sub == "alice"
    refused(settings(jwt_leeway_s=0), token, "expired")
    assert settings(jwt_leeway_s=30).jwt_leeway_s == 30
    with pytest.raises(ValidationError, match="jwt_leeway_s"):
        settings(jwt_leeway_s=31)
    with pytest.raises(ValidationError, match="jwt_leeway_s"):
        settings(jwt_leeway_s=-1)


def test_a_token_signed_with_another_secret_is_refused() -> None:
    refused(settings(), mint_token(settings(jwt_secret=REAL_SECRET), "alice", "participant"),
            "Signature verification failed")


# --- Claims: nothing a token says may crash the edge -------------------------------------


@pytest.mark.parametrize("bad", [
    {"sub": ""}, {"sub": 42}, {"sub": ["alice"]}, {"sub": {"id": "alice"}},
    {"role": "king"}, {"role": 1}, {"tenant": ""}, {"memberships": {"t1": "king"}},
    {"memberships": "t1"}, {"sub": "x" * 257},
])
def test_claims_that_do_not_fit_are_refused(bad: dict[str, Any]) -> None:
    refused(settings(), jwt.encode(claims(**bad), DEV_JWT_SECRET))


# --- a verified token is not verified again for a while -------------------------------------


@pytest.fixture
def verifications(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Every token really verified (``jwt.decode`` reached), from an empty cache."""
    seen: list[str] = []
    real = tokens._verify

    def counted(s: VoiceSettings, token: str) -> Any:
        seen.append(token)
        return real(s, token)

    monkeypatch.setattr(tokens, "_verify", counted)
    tokens._VERIFIED.clear()
    yield seen
    tokens._VERIFIED.clear()


def test_a_verified_token_is_not_verified_again(verifications: list[str]) -> None:
    s = settings()
    token = mint_token(s, "alice", "staff", "acme")
    first = decode_claims(s, token)
    assert decode_claims(s, token) == first and (first.sub, first.role) == ("alice", "staff")
    assert verifications == [token]
    other = mint_token(s, "bob", "participant")
    assert decode_claims(s, other).sub == "bob"
    assert verifications == [token, other]


def test_a_refused_token_is_refused_every_time(verifications: list[str]) -> None:
    s = settings()
    bad = hs_token(claims(), key="not-the-secret-of-this-deployment-0123456789")
    for _ in range(3):
        refused(s, bad, "signature")
    assert len(verifications) == 3


@pytest.mark.parametrize("change", [{"jwt_secret": REAL_SECRET}, {"jwt_audience": "other"},
                                    {"jwt_issuer": "other"}, {"jwt_algorithms": ["HS512"]}])
def test_a_token_verified_under_one_setting_is_checked_again_under_another(
        verifications: list[str], change: dict[str, Any]) -> None:
    s = settings()
    token = mint_token(s, "alice", "participant")
    decode_claims(s, token)
    refused(settings(**change), token)


def test_a_kept_token_still_expires(verifications: list[str]) -> None:
    s = settings(jwt_leeway_s=0)
    token = mint_token(s, "alice", "participant", ttl_s=1)
    decode_claims(s, token)
    decode_claims(s, token)
    assert len(verifications) == 1
    time.sleep(2.05 - (time.time() % 1))  # past the whole second after ``exp``
    refused(s, token, "expired")


def test_kept_tokens_are_bounded_in_time_and_number(verifications: list[str],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    s = settings()
    a, b, c = (mint_token(s, name, "participant") for name in ("a", "b", "c"))
    monkeypatch.setattr(tokens, "VERIFIED_MAX", 2)
    for token in (a, b, c, c, b, a):  # a was dropped when c came in; then b when a came back
        decode_claims(s, token)
    assert verifications == [a, b, c, a]
    monkeypatch.setattr(tokens, "VERIFIED_TTL_S", 0.0)
    decode_claims(s, b)
    decode_claims(s, b)
    assert verifications == [a, b, c, a, b, b]


async def test_a_verified_jwks_token_is_verified_once(
        idp: IdentityProvider, verifications: list[str]) -> None:
    s = idp.settings()
    token = idp.sign("ES256", sub="carol")
    assert (await tokens.verify_token(s, token)).sub == "carol"
    assert (await tokens.verify_token(s, token)).sub == "carol"
    assert verifications == [token] and idp.hits == 1


def test_a_huge_token_is_refused_before_it_is_parsed() -> None:
    token = jwt.encode(claims(padding="x" * MAX_TOKEN_BYTES), DEV_JWT_SECRET)
    assert refused(settings(), token) == f"invalid token: {len(token)} bytes; the limit is 8192"


@pytest.mark.parametrize("token", [
    "", "a", "a.b", "a.b.c", "....", "é.é.é", "\x00.\x00.\x00", "\ud800.a.b", "a.b.c.d.e",
    "a.b.c=", " a.b.c",
    f"{b64url('[1]')}.{b64url('{}')}.", f"{b64url('not json')}.{b64url('{}')}.",
    f"{b64url(json.dumps({'alg': 7}))}.{b64url('{}')}.",
    f"{b64url(json.dumps({'alg': ['HS256']}))}.{b64url('{}')}.",
    hs_token("[1, 2]"), hs_token("not json"), hs_token('"a string"'),
    hs_token('{"sub": "a", "aud": "voice", "iss": "voice", "iat": 1, "exp": Infinity}'),
    hs_token('{"sub": "a", "aud": "voice", "iss": "voice", "iat": NaN, "exp": 9999999999}'),
    hs_token('{"sub": "a", "aud": "voice", "iss": "voice", "iat": 1e400, "exp": 1e400}'),
    hs_token(claims(exp="soon")), hs_token(claims(iat=[1])), hs_token(claims(aud=5)),
    hs_token(claims(iss={"x": 1})), hs_token(claims(exp=True, iat=True)),
    hs_token(claims(), header={"alg": "HS256", "crit": ["exp"]}),
    hs_token(claims(), header={"alg": "HS256", "b64": False}),
])
def test_malformed_tokens_are_auth_errors_only(token: str) -> None:
    refused(settings(), token)


# --- The edge: 401 for every bad token, never a 500 ---------------------------------------


def edge(tmp_path: Path, s: VoiceSettings | None = None) -> TestClient:
    """``POST /me/conversations`` over the fakes of test_conversation_routes."""
    from streams.sealing import MemoryKeyStore

    app = FastAPI()
    app.include_router(conversations.router)
    app.state.settings = s or settings(kafka_bootstrap="127.0.0.1:1", state_dir=tmp_path)
    app.state.views = ConversationViews()
    app.state.owners = None  # an edge that reads all history
    app.state.sealer = Sealer(MemoryKeyStore())
    app.state.producer = FakeProducer()
    app.state.tail = FakeTail(app.state.producer, app.state.views, "accepted")
    return TestClient(app, raise_server_exceptions=False)


def post(client: TestClient, token: str) -> Any:
    return client.post("/me/conversations", headers={"Authorization": f"Bearer {token}"})


def test_empty_sub_is_401_over_http(tmp_path: Path) -> None:
    c = edge(tmp_path)
    resp = post(c, jwt.encode(claims(sub=""), DEV_JWT_SECRET))
    assert resp.status_code == 401 and "sub" in resp.json()["detail"], resp.text
    assert post(c, mint_token(settings(), "alice", "participant")).status_code == 201


@pytest.mark.parametrize("name,token", [
    ("sub not a string", jwt.encode(claims(sub=42), DEV_JWT_SECRET)),
    ("role not in the table", jwt.encode(claims(role="king"), DEV_JWT_SECRET)),
    ("huge", jwt.encode(claims(padding="x" * 9000), DEV_JWT_SECRET)),
    ("expired", jwt.encode(claims(iat=int(time.time()) - 600, exp=int(time.time()) - 60),
                           DEV_JWT_SECRET)),
    ("alg none", f"{b64url(json.dumps({'alg': 'none'}))}.{b64url(json.dumps(claims()))}."),
    ("wrong aud", jwt.encode(claims(aud="other"), DEV_JWT_SECRET)),
    ("wrong iss", jwt.encode(claims(iss="other"), DEV_JWT_SECRET)),
    ("too long a life", jwt.encode(claims(exp=int(time.time()) + 10 * 86400), DEV_JWT_SECRET)),
    ("infinite exp", hs_token('{"sub": "a", "aud": "voice", "iss": "voice", "iat": 1, '
                              '"exp": Infinity}')),
    ("garbage", "not-a-token"),
])
def test_every_bad_token_is_401_at_the_edge(tmp_path: Path, name: str, token: str) -> None:
    resp = post(edge(tmp_path), token)
    assert resp.status_code == 401, (name, resp.status_code, resp.text)
    assert token not in resp.text  # the answer never echoes the token


# --- JWKS: RS256/ES256 from the identity provider ----------------------------------------


@dataclass
class IdentityProvider:
    """Signing keys, and a JWKS of their public halves served on loopback by this test."""

    rsa_key: rsa.RSAPrivateKey = field(
        default_factory=lambda: rsa.generate_private_key(public_exponent=65537, key_size=2048))
    ec_key: ec.EllipticCurvePrivateKey = field(
        default_factory=lambda: ec.generate_private_key(ec.SECP256R1()))
    hits: int = 0
    url: str = ""
    extra_keys: list[dict[str, Any]] = field(default_factory=list)

    def jwks(self) -> dict[str, Any]:
        rsa_jwk = RSAAlgorithm.to_jwk(self.rsa_key.public_key(), as_dict=True)
        ec_jwk = ECAlgorithm.to_jwk(self.ec_key.public_key(), as_dict=True)
        return {"keys": [{**rsa_jwk, "kid": "rsa-1", "alg": "RS256", "use": "sig"},
                         {**ec_jwk, "kid": "ec-1", "alg": "ES256", "use": "sig"},
                         *self.extra_keys]}

    def sign(self, alg: str = "RS256", kid: str | None = None, **over: Any) -> str:
        key = self.rsa_key if alg == "RS256" else self.ec_key
        headers = {"kid": kid or ("rsa-1" if alg == "RS256" else "ec-1")}
        return jwt.encode(claims(**{"iss": "https://idp.example", **over}), key, alg,
                          headers=headers)

    def settings(self, **kw: Any) -> VoiceSettings:
        return settings(**{"jwt_algorithms": ["RS256", "ES256"], "jwt_jwks_url": self.url,
                           "jwt_issuer": "https://idp.example", **kw})


@pytest.fixture
def idp() -> Iterator[IdentityProvider]:
    provider = IdentityProvider()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802
            provider.hits += 1
            body = json.dumps(provider.jwks()).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    # A path of its own: the process caches one JWKS client per URL, and ports get reused.
    provider.url = f"http://127.0.0.1:{server.server_address[1]}/{uuid.uuid4().hex}/jwks.json"
    yield provider
    server.shutdown()
    server.server_close()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("alg", ["RS256", "ES256"])
def test_jwks_tokens_verify_and_the_keys_are_cached(idp: IdentityProvider, alg: str) -> None:
    s = idp.settings()
    c = decode_claims(s, idp.sign(alg, sub="carol", role="staff", tenant="acme"))
    assert (c.sub, c.role, c.tenant) == ("carol", "staff", "acme")
    for _ in range(3):
        decode_claims(s, idp.sign(alg))
    assert idp.hits == 1  # one fetch, then the cached set


def test_jwks_tokens_get_the_same_checks(idp: IdentityProvider) -> None:
    s = idp.settings(jwt_leeway_s=0)
    now = int(time.time())
    refused(s, idp.sign(exp=now - 1), "expired")
    refused(s, idp.sign(aud="other"), "audience")
    refused(s, idp.sign(iss="https://evil.example"), "issuer")
    refused(s, idp.sign(exp=now + 2 * 86400), "lifetime")
    refused(s, idp.sign(sub=""), "sub")
    refused(s, idp.sign(iat=None), "iat")


def test_jwks_unknown_or_missing_kid_is_refused(idp: IdentityProvider) -> None:
    s = idp.settings()
    assert refused(s, idp.sign(kid="rotated-away")) == (
        "invalid token: no key 'rotated-away' in the identity provider's JWKS")
    token = jwt.encode(claims(iss="https://idp.example"), idp.rsa_key, "RS256")
    refused(s, token, "kid")
    # A key from elsewhere under a known kid does not verify.
    stranger = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    forged = jwt.encode(claims(iss="https://idp.example"), stranger, "RS256",
                        headers={"kid": "rsa-1"})
    refused(s, forged, "Signature verification failed")


def test_jwks_unknown_kid_is_401_at_the_edge(idp: IdentityProvider, tmp_path: Path) -> None:
    c = edge(tmp_path, idp.settings(kafka_bootstrap="127.0.0.1:1", state_dir=tmp_path))
    assert post(c, idp.sign("ES256")).status_code == 201
    assert post(c, idp.sign(kid="nope")).status_code == 401


def test_jwks_server_down_is_503_with_retry_after(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{closed_port()}/{uuid.uuid4().hex}/jwks.json"
    s = settings(jwt_algorithms=["RS256"], jwt_jwks_url=url, jwt_jwks_timeout_s=2,
                 kafka_bootstrap="127.0.0.1:1", state_dir=tmp_path)
    token = IdentityProvider().sign()
    with pytest.raises(KeysUnavailable, match="cannot be fetched"):
        decode_claims(s, token)
    resp = post(edge(tmp_path, s), token)
    assert resp.status_code == 503, resp.text
    assert resp.headers["Retry-After"] == "5"
    assert "identity provider" in resp.json()["detail"]
    assert "127.0.0.1" not in resp.text and "refused" not in resp.text  # no internals


def test_a_jwks_that_is_not_one_is_503(idp: IdentityProvider, tmp_path: Path) -> None:
    idp.jwks = lambda: {"keys": []}  # type: ignore[method-assign]
    with pytest.raises(KeysUnavailable):
        decode_claims(idp.settings(), idp.sign())


# --- HS / RS confusion: no key of one kind verifies a token of the other ------------------


def test_an_hs256_token_signed_with_the_public_key_is_refused(idp: IdentityProvider) -> None:
    # The classic: the RSA public key (public!) used as an HMAC secret.
    s = idp.settings(jwt_algorithms=["HS256", "RS256"])
    pem = idp.rsa_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    for kid in ("rsa-1", None):
        header = {"alg": "HS256", "typ": "JWT", **({"kid": kid} if kid else {})}
        refused(s, hs_token(claims(iss="https://idp.example"), pem, header),
                "Signature verification failed")
    assert idp.hits == 0  # an HS token never even consults the JWKS


def test_an_rs256_token_hmac_signed_with_the_secret_is_refused(idp: IdentityProvider) -> None:
    s = idp.settings(jwt_algorithms=["HS256", "RS256"])
    for alg in ("RS256", "ES256"):
        header = {"alg": alg, "kid": "rsa-1" if alg == "RS256" else "ec-1"}
        s2 = s.model_copy(update={"jwt_algorithms": ["HS256", alg]})
        refused(s2, hs_token(claims(iss="https://idp.example"), DEV_JWT_SECRET, header))


def test_a_key_of_the_wrong_type_never_verifies(idp: IdentityProvider) -> None:
    secret = b"a-symmetric-key-published-in-the-jwks!!"
    idp.extra_keys.append({"kty": "oct", "kid": "hmac-1", "k": b64url(secret), "use": "sig"})
    s = idp.settings(jwt_algorithms=["HS256", "RS256", "ES256"])
    refused(s, idp.sign("ES256", kid="rsa-1"), "not for ES256")
    refused(s, hs_token(claims(), secret, {"alg": "RS256", "kid": "hmac-1"}), "not for RS256")
    refused(s, hs_token(claims(), secret, {"alg": "HS256", "kid": "hmac-1"}), "Signature")


def test_a_jwks_token_is_refused_where_only_hs_is_pinned(idp: IdentityProvider) -> None:
    refused(settings(), idp.sign(iss="voice"), "'RS256' is not allowed")


def test_jwks_settings_go_together() -> None:
    with pytest.raises(ValidationError, match="set VOICE_JWT_JWKS_URL"):
        settings(jwt_algorithms=["HS256", "RS256"])
    with pytest.raises(ValidationError, match="allows none of RS256, ES256"):
        settings(jwt_jwks_url="https://idp.example/jwks.json")
    with pytest.raises(ValidationError, match="not an http"):
        settings(jwt_algorithms=["RS256"], jwt_jwks_url="file:///etc/passwd")
    with pytest.raises(ValidationError, match="must be https"):
        VoiceSettings(env="prod", jwt_algorithms=["RS256"], master_key=REAL_MASTER_KEY,
                      jwt_jwks_url="http://idp.example/jwks.json")
    # A JWKS-only deployment needs no shared secret, and mints nothing.
    s = VoiceSettings(env="prod", jwt_algorithms=["ES256"], master_key=REAL_MASTER_KEY,
                      jwt_jwks_url="https://idp.example/jwks.json")
    assert not s.uses_dev_jwt_secret
    with pytest.raises(ValueError, match="allows no HS"):
        mint_token(s, "alice", "participant")


# --- Secrets: prod refuses weak ones ------------------------------------------------------


@pytest.mark.parametrize("kw,match", [
    ({}, "VOICE_JWT_SECRET must be set"),
    ({"jwt_secret": "short"}, "VOICE_JWT_SECRET is 5 bytes; VOICE_ENV='prod' needs at least 32"),
    ({"jwt_secret": "x" * 31}, "is 31 bytes"),
    ({"jwt_secret": "x" * 63, "jwt_algorithms": ["HS256", "HS512"]},
     "is 63 bytes; VOICE_ENV='prod' needs at least 64 for HS256, HS512"),
    ({"jwt_secret": REAL_SECRET, "master_key": None}, "VOICE_MASTER_KEY must be set"),
    ({"jwt_secret": REAL_SECRET, "master_key": "  "}, "VOICE_MASTER_KEY must be set"),
    ({"jwt_secret": REAL_SECRET, "master_key": "correct horse battery"},
     "VOICE_MASTER_KEY is 21 bytes"),
    ({"jwt_secret": REAL_SECRET, "master_key": base64.b64encode(DEV_MASTER_KEY).decode()},
     "public dev key"),
    ({"jwt_secret": REAL_SECRET, "master_key": DEV_MASTER_KEY.decode()}, "public dev key"),
])
def test_prod_refuses_weak_secrets(kw: dict[str, Any], match: str) -> None:
    kw.setdefault("master_key", REAL_MASTER_KEY)
    with pytest.raises(ValidationError, match=match) as exc:
        VoiceSettings(env="prod", **kw)
    assert "generate one" in str(exc.value) or "python -c" in str(exc.value)


def test_prod_takes_real_secrets() -> None:
    s = VoiceSettings(env="prod", jwt_secret="x" * 32,
                      master_key="a passphrase of at least 32 bytes!")
    assert not s.uses_dev_jwt_secret and not s.uses_dev_master_key


# --- Secrets: never the dev ones on a non-loopback bind, whatever VOICE_ENV says ---------


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.53", "::1", "[::1]", "localhost"])
def test_loopback_binds_may_use_the_dev_secrets(host: str) -> None:
    assert is_loopback(host)
    check_bind(settings(), host, "voice edge")


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "", "10.0.0.5", "edge.example", "[::]"])
@pytest.mark.parametrize("env", ["dev", "test"])
def test_a_public_bind_refuses_each_dev_secret(host: str, env: str) -> None:
    assert not is_loopback(host)
    both = VoiceSettings(env=env)
    with pytest.raises(InsecureBind) as exc:
        check_bind(both, host, "voice edge")
    msg = str(exc.value)
    assert "VOICE_JWT_SECRET" in msg and "VOICE_MASTER_KEY" in msg and "127.0.0.1" in msg
    with pytest.raises(InsecureBind, match="set VOICE_MASTER_KEY") as exc:
        check_bind(VoiceSettings(env=env, jwt_secret=REAL_SECRET), host, "voice edge")
    assert "VOICE_JWT_SECRET" not in str(exc.value)
    with pytest.raises(InsecureBind, match="set VOICE_JWT_SECRET") as exc:
        check_bind(VoiceSettings(env=env, master_key=REAL_MASTER_KEY), host, "voice edge")
    with pytest.raises(InsecureBind, match="VOICE_MASTER_KEY"):
        check_bind(VoiceSettings(env=env, jwt_secret=REAL_SECRET,
                                 master_key=base64.b64encode(DEV_MASTER_KEY).decode()),
                   host, "voice edge")
    check_bind(VoiceSettings(env=env, jwt_secret=REAL_SECRET, master_key=REAL_MASTER_KEY),
               host, "voice edge")


def voice(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """The real ``voice`` command, with no Kafka configured and nothing inherited."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("VOICE_")}
    base.update(PYTHONPATH=str(ROOT), VOICE_STATE_DIR=str(tmp_path / "state"), **env)
    return subprocess.run([sys.executable, "-m", "deploy.cli", *args], env=base, cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("env", ["dev", "test"])
def test_the_edge_on_0000_with_the_dev_secret_fails_fast(tmp_path: Path, env: str) -> None:
    started = time.monotonic()
    proc = voice(tmp_path, "edge", "--host", "0.0.0.0", VOICE_ENV=env)
    assert proc.returncode == 2, proc.stderr
    assert "voice edge refuses to listen on '0.0.0.0'" in proc.stderr
    assert "set VOICE_JWT_SECRET" in proc.stderr and "VOICE_MASTER_KEY" in proc.stderr
    assert "No Kafka" not in proc.stderr  # refused before it looked for a broker
    assert time.monotonic() - started < 30
    # The same through VOICE_EDGE_HOST (what the image and compose set).
    proc = voice(tmp_path, "edge", VOICE_ENV=env, VOICE_EDGE_HOST="0.0.0.0",
                 VOICE_MASTER_KEY=REAL_MASTER_KEY)
    assert proc.returncode == 2 and "set VOICE_JWT_SECRET" in proc.stderr, proc.stderr
    assert "VOICE_MASTER_KEY" not in proc.stderr


def test_the_edge_on_0000_with_real_secrets_gets_past_the_check(tmp_path: Path) -> None:
    proc = voice(tmp_path, "edge", "--host", "0.0.0.0", VOICE_JWT_SECRET=REAL_SECRET,
                 VOICE_MASTER_KEY=REAL_MASTER_KEY)
    assert proc.returncode == 2 and "No Kafka" in proc.stderr, proc.stderr  # the next step
    assert "refuses" not in proc.stderr


def test_voice_up_refuses_a_public_edge_before_starting_a_broker(tmp_path: Path) -> None:
    proc = voice(tmp_path, "up", VOICE_EDGE_HOST="0.0.0.0")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "voice up refuses to listen on '0.0.0.0'" in proc.stderr
    assert "Kafka" not in proc.stdout and not (tmp_path / "state" / "kafka").exists()


def test_prod_with_a_short_secret_fails_at_start(tmp_path: Path) -> None:
    proc = voice(tmp_path, "edge", VOICE_ENV="prod", VOICE_JWT_SECRET="1",
                 VOICE_MASTER_KEY=REAL_MASTER_KEY)
    assert proc.returncode == 2 and "VOICE_JWT_SECRET is 1 bytes" in proc.stderr, proc.stderr
